"""The simulator and a live head, given the same 30-job workload, take the same decisions in
the same order: which jobs start together, in what sequence, on which GPUs.

The live head runs real `sleep` processes on 8 virtual GPUs (tests/e2e/headproc.py); one
simulated second is one real second. Live timing adds a start delay to every job (the head
notices an exit within its ~0.1 s cycle, then a shim starts the process), so the workload was
chosen for decisions that do not depend on such delays: `test_the_workload_is_robust_to_start
delays` replays it in the simulator with random delays of up to 0.35 s on every start and
checks that no decision changes. Job 1 holds all 8 GPUs while the other 29 are submitted, so
the live head sees the whole queue before its first decision, as the simulator does.

The second half (`..._under_the_full_default_policy`) runs the full policy (fair share, quotas
with borrowing, preemption, backfill, restarts after failures, the default `las` ordering with
thresholds the workload crosses) on 50 jobs, with the real head
loop and store on a clock the test moves (see the comment above it).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from gpucluster.core.types import Priority
from gpucluster.executors.base import Exited, Running
from gpucluster.executors.fake import FakeExecutor
from gpucluster.models import JobSpec
from gpucluster.sim.engine import Engine, RunResult
from gpucluster.sim.scheduling import SimPolicy, load_policy
from gpucluster.sim.spec import ClusterSpec, load_cluster_spec
from gpucluster.sim.workload import TraceJob
from gpucluster.store import Store
from tests.e2e.headproc import HeadProcess, wait_for
from tests.sim.headreplay import head_on_clock
from tests.sim.helpers import cluster_yaml
from tests.unit.headkit import Clock

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


# ---- the full default policy, 50 jobs ---------------------------------------------------------
#
# Fair share, quotas with borrowing, preemption, backfill and restarts after failures all take
# part, so decisions depend on how long things took (decayed usage, reservations' estimated
# starts, backoffs): a live run on a wall clock cannot reproduce them to the millisecond. The
# head is therefore the real one (head.loop.Head, its store on a real SQLite file, its
# snapshot, lifecycle, restarts and requeues) driven by a clock the test moves to the instants
# the simulator acted at, with processes that end on time (the fake executor): only the
# processes are not real. The simulator's node failures (repaired at once) are replayed as the
# processes of the jobs they hit failing at the same instant.

FULL_POLICY = """\
priorities: true
fair_share: {enabled: true, half_life: 7d}
backfill: {enabled: true, default_time_limit: 10m}
preemption: {enabled: true, grace_period: 30s, min_runtime: 0s, protected_classes: [critical], reclaim_quota: true}
ordering: {queues: [5m, 30m]}   # the default las, with thresholds this workload's minutes cross
teams:
  vision: {weight: 2, quota: {H100-80GB: 8}, max_borrow: 8}
  nlp: {weight: 1, quota: {H100-80GB: 8}, max_borrow: 16}
  speech: {weight: 1}
"""
FULL_CLUSTER = (
    "node_groups:\n  - {name: g, count: 3, gpus_per_node: 8, gpu_model: H100-80GB,"
    " price_per_gpu_hour: 2.0, power_idle_w: 50, power_busy_w: 500}\n"
    "failures: {gpu_failures_per_day: 150, node_repair_time: 0s, max_restarts: 2}\n"
    "checkpoints: {interval: none, restart: 0s}\n"
)
TEAMS = ("vision", "nlp", "speech")


def _full_workload(seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(1, 51):
        t += round(rng.uniform(2.0, 25.0), 1)
        jobs.append(
            TraceJob(
                job_id=i,
                submit=t,
                duration=round(rng.uniform(30.0, 400.0), 1),
                gpus=rng.choice([1, 1, 2, 2, 4, 4, 8]),
                team=rng.choice(TEAMS),
                priority=rng.choice([Priority.LOW, Priority.NORMAL, Priority.NORMAL, Priority.HIGH]),
                gpu_types=(),
                name=f"j{i}",
                line=i,
                time_limit=rng.choice([None, 600.0, 900.0]),
                checkpoint=None,
                max_restarts=2,
            )
        )
    return jobs


Event = tuple[float, int, str, tuple[int, ...]]  # (time, job, what, GPU indices) in order


def _sim_events(res: RunResult, names: dict[str, int]) -> list[Event]:
    out: list[Event] = []
    for t, job_id, alloc in res.starts:
        s = alloc.slices[0]
        out.append((t, job_id, f"start on node {names[s.node]}", s.gpu_indices))
    for t, job_id, kind in res.interruptions_log:
        out.append((t, job_id, kind, ()))
    return _canonical(out)


def _requeued_past_the_first_queue(events: list[Event]) -> int:
    """Jobs started again after an attempt that gave them more than FULL_POLICY's first
    attained-service threshold (5 GPU-minutes): those `las` ranks behind jobs that had less."""
    began: dict[int, tuple[float, int]] = {}
    had: dict[int, float] = {}
    again = set()
    for t, job_id, what, gpus in events:
        if what.startswith("start"):
            if had.get(job_id, 0.0) > 300.0:
                again.add(job_id)
            began[job_id] = (t, len(gpus))
        elif job_id in began:
            start, n = began.pop(job_id)
            had[job_id] = had.get(job_id, 0.0) + n * (t - start)
    return len(again)


def _canonical(events: list[Event]) -> list[Event]:
    """By instant; within one, starts in plan order, then interruptions by job (a node failure
    stops its jobs at one instant, in no meaningful order)."""
    return sorted(
        events,
        key=lambda e: (
            e[0],
            e[2] != "start" and not e[2].startswith("start"),
            e[1] if not e[2].startswith("start") else 0,
        ),
    )


@pytest.mark.parametrize("seed", [15, 16, 17])
def test_simulator_and_head_take_the_same_decisions_under_the_full_default_policy(tmp_path: Path, seed: int) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(FULL_POLICY)
    spec = load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=FULL_CLUSTER))
    workload = _full_workload(seed)
    res = Engine(spec, workload, load_policy(str(policy_file)), 3, keep_starts=True).run()
    nodes = [n for n, _ in spec.nodes()]
    names = {n.name: i for i, n in enumerate(nodes)}
    expected = _sim_events(res, names)
    kinds = {e[2].split()[0] for e in expected}
    assert {"start", "preemption", "failure"} <= kinds, f"the workload must exercise every rule: {kinds}"
    assert res.restarts > 0 and res.preemptions > 0
    assert _requeued_past_the_first_queue(expected) > 0, "the default las must order some job by what it had"

    clock = Clock(0.0)
    head, service, store, fake = head_on_clock(tmp_path, nodes, policy_file, clock)
    live: list[Event] = []
    started_at: dict[tuple[int, int], float] = {}  # (job, attempt) -> when its process started
    duration = {j.job_id: j.duration for j in workload}
    failures = sorted((t, job_id) for t, job_id, kind in res.interruptions_log if kind == "failure")
    submits = list(workload)
    seen_attempts: set[tuple[int, int]] = set()
    try:
        while True:
            running = {k: p for k, p in fake.processes.items() if not isinstance(p.status, Exited)}
            times = [started_at[k] + duration[k[0]] for k in running]
            times += [j.submit for j in submits[:1]]
            times += [t for t, _ in failures[:1]]
            times += [r.not_before for r in store.list_jobs() if r.state.value == "queued" and r.not_before]
            times = [x for x in times if x > clock.t]
            if not times:
                break
            clock.t = min(times)
            while submits and submits[0].submit == clock.t:
                j = submits.pop(0)
                got = service.submit(
                    JobSpec.model_validate(
                        {
                            "command": ["train"],
                            "gpus": j.gpus,
                            "team": j.team,
                            "priority": j.priority.label,
                            "name": j.name,
                            "time_limit": j.time_limit,
                            "max_restarts": 2,
                        }
                    )
                )
                assert got.id == j.job_id
            while failures and failures[0][0] == clock.t:
                _, job_id = failures.pop(0)
                for (jid, _), p in running.items():
                    if jid == job_id:
                        p.status = Exited(1)
            for k, p in running.items():
                if started_at[k] + duration[k[0]] == clock.t and isinstance(p.status, Running):
                    p.status = Exited(0)
            quiet = 0
            while quiet < 2:  # every instant runs to rest: a stop takes a tick, its requeue another
                before = _fingerprint(store, fake)
                head.tick()
                quiet = quiet + 1 if _fingerprint(store, fake) == before else 0
                for key in list(fake.processes):
                    if key not in seen_attempts:
                        seen_attempts.add(key)
                        started_at[key] = clock.t
                        rec = store.get_job(key[0])
                        assert rec is not None and rec.allocation is not None
                        s = rec.allocation.slices[0]
                        live.append((clock.t, key[0], f"start on node {names[s.node]}", s.gpu_indices))
    finally:
        service.close()
        store.close()
    live_stops = _live_interruptions(tmp_path / "state.db")
    got = _canonical(live + live_stops)
    assert got == expected


def _fingerprint(store: Store, fake: FakeExecutor) -> object:
    jobs = tuple((r.id, r.state, r.stop_reason, r.term_sent, r.attempt) for r in store.list_jobs())
    return jobs, tuple((k, type(p.status).__name__) for k, p in fake.processes.items())


def _live_interruptions(db: Path) -> list[Event]:
    """The head's preemptions and failures, from the attempts it recorded (when each ended)."""
    import sqlite3

    with sqlite3.connect(db) as c:
        rows = c.execute(
            "SELECT ended_at, job_id, outcome, reason FROM attempts"
            " WHERE outcome IN ('preempted', 'failed') ORDER BY ended_at, rowid"
        ).fetchall()
    return [(t, job_id, "preemption" if outcome == "preempted" else "failure", ()) for t, job_id, outcome, _ in rows]
