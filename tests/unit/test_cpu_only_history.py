"""CPU-only jobs (gpus 0; issue 26) over a history of cycles, mixed with GPU jobs asking for CPUs
and memory on nodes with and without GPUs: no node ever holds more CPUs or memory than it has, a
CPU-only job never holds a GPU, GPUs are never double-booked, every queued job is started or
told why it waits, and a kept capacity index (the simulator's told one, or the head's comparing
one) gives the plans a fresh build gives, so CPU-only slices (no GPU indices) are counted in and
out of the index and its book of ends exactly."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.estimate import Estimate, estimate_starts
from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node, NodeSlice, Plan, Priority, RunningJob

from .builders import job, node

NODES: tuple[Node, ...] = (
    node("g0").gpus(4).host(cpus=16, memory_mb=64_000).build(),
    node("g1").gpus(8).host(cpus=32, memory_mb=128_000).build(),
    node("c0").host(cpus=8, memory_mb=32_000).build(),  # no GPUs
    node("c1").host(cpus=24).build(),  # no GPUs, memory not accounted
)


def _job(rng: random.Random, job_id: int, now: float) -> JobRequest:
    b = job(job_id).at(now).limit(rng.choice([None, 30.0, 200.0, 2000.0])).priority(rng.choice(list(Priority)))
    if rng.random() < 0.5:
        return (
            b.gpus(0)
            .host(cpus=rng.choice([0.0, 1.0, 2.0, 6.0, 12.0]) or 0.5, mem_mb=rng.choice([0, 4000, 40_000]))
            .build()
        )
    return (
        b.gpus(rng.choice([0.5, 1, 2, 4, 8]))
        .host(cpus=rng.choice([0.0, 2.0, 8.0]), mem_mb=rng.choice([0, 16_000]))
        .build()
    )


def _check(snap: Snapshot, plan: Plan) -> None:
    cpus = {n.name: n.cpus for n in snap.nodes}
    mem = {n.name: n.memory_mb for n in snap.nodes}
    used_c: dict[str, float] = {}
    used_m: dict[str, int] = {}
    share: dict[tuple[str, int], float] = {}
    queued = {j.job_id: j for j in snap.queued}
    for a in [r.allocation for r in snap.running] + [s.allocation for s in plan.starts]:
        for s in a.slices:
            used_c[s.node] = used_c.get(s.node, 0.0) + s.cpus
            used_m[s.node] = used_m.get(s.node, 0) + s.host_memory_mb
            for i in s.gpu_indices:
                share[(s.node, i)] = share.get((s.node, i), 0.0) + s.share
    for name, c in cpus.items():
        assert c is None or used_c.get(name, 0.0) <= c + 1e-9, f"{name}: {used_c[name]} CPUs of {c}"
        m = mem[name]
        assert m is None or used_m.get(name, 0) <= m, f"{name}: {used_m[name]} MiB of {m}"
    assert all(v <= 1 + 1e-9 for v in share.values()), share
    for st in plan.starts:
        req = queued[st.job_id]
        if req.gpus == 0:
            (only,) = st.allocation.slices
            assert only.gpu_indices == () and (only.cpus, only.host_memory_mb) == (req.cpus, req.mem_mb), st
    assert {s.job_id for s in plan.starts} | set(plan.waiting) == set(queued), "a queued job is unaccounted for"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("told", [True, False])
def test_cpu_only_jobs_over_a_history_hold_what_nodes_have_and_kept_indexes_agree(seed: int, told: bool) -> None:
    rng = random.Random(seed)
    policy = Policy(preemption=Preemption(grace_period_s=5.0), backfill=rng.random() < 0.8)
    index = CapacityIndex(told=told)
    running: dict[int, RunningJob] = {}
    queued: dict[int, JobRequest] = {}
    started_cpu_only = 0
    next_id = 1
    for cycle in range(40):
        now = cycle * 10.0
        for _ in range(rng.randrange(0, 6)):
            queued[next_id] = _job(rng, next_id, now)
            next_id += 1
        for job_id in [j for j in running if rng.random() < 0.25]:
            index.remove(running.pop(job_id))
        snap = Snapshot(NODES, tuple(running.values()), tuple(queued.values()))
        fresh = decide(snap, policy, now)
        _check(snap, fresh)
        assert decide(replace(snap, capacity=index), policy, now) == fresh, f"cycle {cycle}"
        for p in fresh.preemptions:
            running[p.job_id] = replace(running[p.job_id], stopping=True)
            index.stopping(running[p.job_id])
        for st in fresh.starts:
            req = queued.pop(st.job_id)
            started_cpu_only += req.gpus == 0
            running[st.job_id] = RunningJob(st.job_id, st.allocation, req.team, req.priority, now, req.time_limit_s)
            index.add(running[st.job_id])
    assert started_cpu_only, "no CPU-only job ever started: the history tests nothing"


def test_a_waiting_cpu_only_job_is_estimated_from_when_cpus_come_back_not_gpus() -> None:
    """c1 (no GPUs) has its 4 CPUs back at 500, n1 its GPUs and CPUs at 900: a CPU-only job
    asking 2 CPUs is estimated at 500, a lower bound (not exact: jobs ahead may take them), and
    not at a GPU's return as a zero share of a GPU would be."""
    n1 = node("n1").gpus(2).host(cpus=4, memory_mb=8000).build()
    c1 = node("c1").host(cpus=4, memory_mb=8000).build()
    busy = (
        RunningJob(100, Allocation((NodeSlice("c1", (), cpus=4),)), started_at=0, time_limit_s=500),
        RunningJob(101, Allocation((NodeSlice("n1", (0, 1), cpus=4),)), started_at=0, time_limit_s=900),
    )
    snap = Snapshot((n1, c1), busy, (job(1).gpus(0).host(cpus=2).build(), job(2).gpus(1).host(cpus=1).build()))
    plan = decide(snap, Policy(), 100.0)
    assert plan.waiting[1].reason is WaitReason.CPUS
    got = estimate_starts(snap, Policy(), 100.0, plan)
    assert got[1] == Estimate(500.0, exact=False), got
    assert got[2].start == 900.0, got
    only_n1 = replace(snap, queued=(job(1).gpus(0).host(cpus=2).select(nodelist=["n1"]).build(),))
    assert estimate_starts(only_n1, Policy(), 100.0, decide(only_n1, Policy(), 100.0))[1].start == 900.0
