"""The simulator and a live head, given the same 30-job workload, take the same decisions in
the same order: which jobs start together, in what sequence, on which GPUs.

The live head runs real `sleep` processes on 8 virtual GPUs (tests/e2e/headproc.py); one
simulated second is one real second. Live timing adds a start delay to every job (the head
notices an exit within its ~0.1 s cycle, then a shim starts the process), so the workload was
chosen for decisions that do not depend on such delays: `test_the_workload_is_robust_to_start
delays` replays it in the simulator with random delays of up to 0.35 s on every start and
checks that no decision changes. Job 1 holds all 8 GPUs while the other 29 are submitted, so
the live head sees the whole queue before its first decision, as the simulator does.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from gpucluster.core.types import Priority
from gpucluster.sim.engine import Engine, RunResult
from gpucluster.sim.scheduling import SimPolicy, load_policy
from gpucluster.sim.spec import ClusterSpec, load_cluster_spec
from gpucluster.sim.workload import TraceJob
from tests.e2e.headproc import HeadProcess, wait_for
from tests.sim.helpers import cluster_yaml

# (submit s, run time s, GPUs, priority): job ids are 1..30 in this order.
WORKLOAD = [
    (0.00, 3.0, 8, "normal"),
    (0.01, 1.0, 2, "high"),
    (0.02, 3.0, 1, "normal"),
    (0.03, 2.7, 1, "normal"),
    (0.04, 1.5, 1, "normal"),
    (0.05, 2.3, 1, "low"),
    (0.06, 2.1, 1, "normal"),
    (0.07, 2.2, 1, "low"),
    (0.08, 2.1, 8, "low"),
    (0.09, 2.0, 4, "low"),
    (0.10, 1.0, 2, "low"),
    (0.11, 1.7, 1, "high"),
    (0.12, 1.5, 1, "low"),
    (0.13, 0.8, 1, "high"),
    (0.14, 1.3, 1, "low"),
    (0.15, 1.6, 8, "high"),
    (0.16, 1.6, 2, "low"),
    (0.17, 2.4, 8, "normal"),
    (0.18, 2.0, 2, "normal"),
    (0.19, 1.7, 8, "high"),
    (0.20, 1.8, 2, "high"),
    (0.21, 1.4, 1, "high"),
    (0.22, 2.7, 2, "normal"),
    (0.23, 2.8, 4, "high"),
    (0.24, 2.6, 4, "high"),
    (0.25, 2.5, 1, "normal"),
    (0.26, 1.4, 8, "high"),
    (0.27, 1.5, 1, "normal"),
    (0.28, 2.0, 1, "normal"),
    (0.29, 1.1, 1, "normal"),
]
# Strict priority, first come first served within a class: the decisions depend on the order
# of events only, not on how long anything waited (no fair-share usage, backfill estimates,
# or preemption grace periods, whose timing a live run cannot reproduce to the millisecond).
POLICY = "priorities: true\nfair_share: {enabled: false}\nbackfill: {enabled: false}\npreemption: {enabled: false}\n"

Decisions = list[list[tuple[int, tuple[int, ...]]]]


def _setup(tmp: Path) -> tuple[ClusterSpec, SimPolicy, Path]:
    policy_file = tmp / "policy.yaml"
    policy_file.write_text(POLICY)
    spec = load_cluster_spec(
        cluster_yaml(tmp / "c.yaml", nodes=1, gpus=8, extra="failures: {gpu_failures_per_day: 0}\n")
    )
    return spec, load_policy(str(policy_file)), policy_file


def _jobs(jitter: random.Random | None = None) -> list[TraceJob]:
    return [
        TraceJob(
            job_id=i,
            submit=sub,
            duration=dur + (jitter.uniform(0, 0.35) if jitter else 0.0),
            gpus=gpus,
            team="default",
            priority=Priority.parse(prio),
            gpu_types=(),
            name=f"j{i}",
            line=i,
            time_limit=None,
            checkpoint=None,
        )
        for i, (sub, dur, gpus, prio) in enumerate(WORKLOAD, start=1)
    ]


def _sim_decisions(res: RunResult) -> Decisions:
    groups: dict[float, list[tuple[int, tuple[int, ...]]]] = {}
    for t, job_id, alloc in res.starts:
        groups.setdefault(t, []).append((job_id, alloc.slices[0].gpu_indices))
    return [sorted(groups[t]) for t in sorted(groups)]


def test_the_workload_is_robust_to_start_delays(tmp_path: Path) -> None:
    spec, policy, _ = _setup(tmp_path)
    reference = _sim_decisions(Engine(spec, _jobs(), policy, 0, keep_starts=True).run())
    assert len(reference) == 15 and sum(len(g) for g in reference) == 30
    rng = random.Random(1)
    for _ in range(40):
        assert _sim_decisions(Engine(spec, _jobs(rng), policy, 0, keep_starts=True).run()) == reference


@pytest.mark.skipif(shutil.which("sleep") is None, reason="needs sleep(1)")
def test_simulator_and_live_head_take_the_same_decisions(tmp_path: Path) -> None:
    spec, policy, policy_file = _setup(tmp_path)
    expected = _sim_decisions(Engine(spec, _jobs(), policy, 0, keep_starts=True).run())

    head = HeadProcess(tmp_path / "data", gpus=8, gpu_type="H100-80GB")
    head.args += ["--policy", str(policy_file)]
    head.start()
    try:
        with head.client() as c:
            ids = []
            for k, (_, dur, gpus, prio) in enumerate(WORKLOAD):
                ids.append(c.submit(["sleep", str(dur)], gpus=gpus, priority=prio, name=f"j{k + 1}").id)
                if k == 0:  # job 1 holds every GPU while the rest queue up behind it
                    wait_for(lambda: c.job(ids[0]).state.value == "running", 10, what="job 1 to run")
            assert ids == list(range(1, 31))
            jobs = wait_for(
                lambda: (js := [c.job(i) for i in ids]) and all(j.state.terminal for j in js) and js,
                timeout=120,
                interval=0.5,
                what="all 30 jobs to end",
            )
    finally:
        head.stop()
        head.kill_jobs()
    assert all(j.state.value == "succeeded" for j in jobs), [(j.id, j.state, j.reason) for j in jobs]
    groups: dict[float, list[tuple[int, tuple[int, ...]]]] = {}
    for j in jobs:
        assert j.started_at is not None and len(j.allocation) == 1
        groups.setdefault(j.started_at, []).append((j.id, tuple(j.allocation[0].gpu_indices)))
    live = [sorted(groups[t]) for t in sorted(groups)]
    assert live == expected
