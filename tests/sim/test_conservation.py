"""Properties of any run: every job ends exactly once, GPUs are never over-committed, and the
useful GPU-time equals the work the trace asked for, whatever fails or gets preempted."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.types import Priority
from gpucluster.sim.engine import CKPT, LOST_FAIL, LOST_PREEMPT, SUCCEEDED, USED, Engine
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import ClusterSpec, load_cluster_spec
from gpucluster.sim.workload import TraceJob

# Three 8-GPU nodes of two models (16-GPU jobs span the two H100 nodes), a GPU failure every
# ~30 GPU-minutes so most runs see several, and quick repairs.
SPEC_YAML = """
node_groups:
  - {name: a, count: 2, gpus_per_node: 8, gpu_model: H100, price_per_gpu_hour: 2}
  - {name: b, count: 1, gpus_per_node: 8, gpu_model: A100, price_per_gpu_hour: 1}
speeds: {A100: 0.5}
failures: {gpu_failures_per_day: 48, node_repair_time: 30s, max_restarts: 100000}
checkpoints: {interval: 20s, cost: 2s, restart: 3s}
"""


def _spec() -> ClusterSpec:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "c.yaml"
        p.write_text(SPEC_YAML)
        return load_cluster_spec(p)


SPEC = _spec()

Row = tuple[int, int, float, str, Priority, tuple[str, ...]]

job_st = st.tuples(
    st.integers(0, 300),  # submit
    st.integers(1, 400),  # duration
    st.sampled_from([0.5, 1, 1, 2, 4, 8, 16]),  # GPUs (16: two nodes)
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from([Priority.LOW, Priority.NORMAL, Priority.HIGH]),
    st.sampled_from([(), (), ("H100",), ("A100",)]),
)


def _jobs(rows: list[Row]) -> list[TraceJob]:
    rows = sorted(rows, key=lambda r: r[0])
    return [
        TraceJob(
            job_id=i,
            submit=float(s),
            duration=float(d),
            gpus=g,
            team=team,
            priority=prio,
            gpu_types=types if g <= 8 else (),
            name=f"j{i}",
            line=i,
            time_limit=None,
            checkpoint="spec",
        )
        for i, (s, d, g, team, prio, types) in enumerate(rows, start=1)
    ]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(job_st, min_size=1, max_size=25), policy=st.sampled_from(["fifo", "priority", "default"]))
def test_conservation(rows: list[Row], policy: str) -> None:
    jobs = _jobs(rows)
    res = Engine(SPEC, jobs, load_policy(policy), seed=7).run()
    # every job ends exactly once (or is skipped, with a reason)
    assert sorted(res.job_id) == sorted(set(res.job_id))
    assert len(res.job_id) + sum(res.skipped.values()) == len(jobs)
    assert all(o == SUCCEEDED for o in res.outcome)
    by_id = {j.job_id: j for j in jobs}
    for jid, sub, first, end in zip(res.job_id, res.submit, res.first_start, res.end, strict=True):
        assert sub == by_id[jid].submit <= first <= end
    # GPUs in use never exceed the live GPUs, in any bin
    for busy, up in zip(res.series.busy_gpu_s, res.series.up_gpu_s, strict=True):
        assert busy <= up + 1e-6
    assert res.busy_gpu_s <= res.up_gpu_s + 1e-6
    # GPU-time held = the integral of busy GPUs; useful GPU-time = the work asked for
    used = math.fsum(t[USED] for t in res.team_totals)
    assert math.isclose(used, res.busy_gpu_s, rel_tol=1e-9, abs_tol=1e-6)
    overhead = math.fsum(t[CKPT] + t[LOST_FAIL] + t[LOST_PREEMPT] for t in res.team_totals)
    done = {jid for jid in res.job_id}
    speed = {"H100": 1.0, "A100": 0.5}
    # work at speed 1 -> GPU-seconds on the model each job ran on: check with both bounds
    work = math.fsum(by_id[j].duration * by_id[j].gpus for j in done)
    assert work / max(speed.values()) - 1e-6 <= used - overhead <= work / min(speed.values()) + 1e-6


@settings(max_examples=15, deadline=None)
@given(rows=st.lists(job_st, min_size=1, max_size=15))
def test_useful_time_equals_the_work_on_one_model(rows: list[Row]) -> None:
    jobs = [j._replace(gpu_types=("H100",), gpus=min(j.gpus, 8)) for j in _jobs(rows)]
    res = Engine(SPEC, jobs, load_policy("default"), seed=3).run()
    used = math.fsum(t[USED] for t in res.team_totals)
    overhead = math.fsum(t[CKPT] + t[LOST_FAIL] + t[LOST_PREEMPT] for t in res.team_totals)
    work = math.fsum(j.duration * j.gpus for j in jobs)
    assert math.isclose(used - overhead, work, rel_tol=1e-9, abs_tol=1e-6)
