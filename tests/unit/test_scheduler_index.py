"""The capacity index kept across cycles gives the very plans a fresh capacity build gives.

A seeded random history (jobs of whole and fractional GPUs, multi-node jobs, jobs ending,
nodes joining) is scheduled twice, cycle by cycle: once through one `CapacityIndex`, once
without. Any difference in starts, preemptions or wait reasons fails the test.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Node, Priority, RunningJob
from tests.unit.builders import node


def _nodes(count: int) -> tuple[Node, ...]:
    out = []
    for i in range(count):
        if i % 3 == 0:
            out.append(
                node(f"n{i:02d}").gpus(4, "A100", 40960, domain="d0").gpus(4, "A100", 40960, domain="d1").build()
            )
        elif i % 3 == 1:
            out.append(node(f"n{i:02d}").gpus(8, "H100").build())
        else:
            out.append(node(f"n{i:02d}").gpus(4, "H100").gpus(2, "V100", 32768).build())
    return tuple(out)


def _job(rng: random.Random, job_id: int, now: float) -> JobRequest:
    gpus = rng.choice([0.25, 0.5, 1, 1, 1, 2, 4, 8, 12, 16])
    nodes = 2 if gpus == 16 and rng.random() < 0.5 else None
    return JobRequest(
        job_id,
        float(gpus),
        gpu_types=rng.choice([(), ("H100",), ("A100", "H100"), ("V100",)]),
        priority=Priority(rng.choice([0, 1, 1, 2])),
        submitted_at=now - rng.uniform(0, 100),
        team=rng.choice(["a", "b", "c"]),
        time_limit_s=rng.choice([None, 60.0, 600.0]),
        nodes=nodes,
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_index_plans_equal_fresh_plans_over_a_history(seed: int) -> None:
    rng = random.Random(seed)
    policy = Policy(preemption=Preemption(grace_period_s=5.0))
    index = CapacityIndex()
    nodes = _nodes(6)
    running: dict[int, RunningJob] = {}
    queued: dict[int, JobRequest] = {}
    next_id = 1
    for cycle in range(40):
        now = cycle * 10.0
        for _ in range(rng.randrange(0, 8)):
            queued[next_id] = _job(rng, next_id, now)
            next_id += 1
        for job_id in [j for j in running if rng.random() < 0.2]:
            del running[job_id]
        if cycle == 20:
            nodes = _nodes(8)  # two nodes join: the index rebuilds
        snap = Snapshot(nodes, tuple(running.values()), tuple(queued.values()))
        fresh = decide(snap, policy, now)
        kept = decide(replace(snap, capacity=index), policy, now)
        assert kept == fresh, f"cycle {cycle}"
        for p in fresh.preemptions:
            running[p.job_id] = replace(running[p.job_id], stopping=True)
            index.stopping(running[p.job_id])  # its expected end changes: the book must know
        for st in fresh.starts:
            req = queued.pop(st.job_id)
            running[st.job_id] = RunningJob(st.job_id, st.allocation, req.team, req.priority, now, req.time_limit_s)
    assert index.rebuilds == 2  # the first cycle and the node change; every other cycle applied deltas
    assert running, "the history never started anything: it tests nothing"


def test_shared_gpu_sums_equal_fresh_ones_after_a_release() -> None:
    """Found in round 4 (a told-queue history reached it): the index adds and subtracts a shared
    GPU's shares in the order jobs came and went (0.2 + 0.2 + 0.2 - 0.2 = 0.4000000000000001), a
    fresh build sums the running jobs' shares (0.2 + 0.2 = 0.4), and `_place_fraction` compares
    what is left, so a near tie between two shared GPUs went the other way. Shares are now kept
    on a 1e-9 grid (placement.SHARE_DIGITS)."""
    from gpucluster.core.types import Allocation, NodeSlice

    nodes = (node("n0").gpus(1, "A100", 40960).build(),)
    jobs = [
        RunningJob(k, Allocation((NodeSlice("n0", (0,), 0.2, 8192),)), "a", Priority(1), 0.0, None) for k in (1, 2, 3)
    ]
    index = CapacityIndex()
    index.capacity(nodes, jobs)
    kept = index.capacity(nodes, jobs[1:])
    assert kept.used_share == Capacity(nodes, jobs[1:]).used_share


def _state(cap: Capacity) -> object:
    """What a plan can depend on in a `Capacity`, orders included."""
    return (
        {m: {n: list(i) for n, i in per.items() if i or n in cap.node_models} for m, per in cap.free.items()},
        {m: [list(b) for b in per] for m, per in cap.buckets.items()},
        {m: list(p) for m, p in cap.partial.items()},
        cap.total_free,
        {k: v for k, v in cap.used_mem.items() if v},  # a GPU released to 0 keeps a 0 entry
    )


@pytest.mark.parametrize("seed", range(1, 7))
def test_forks_equal_fresh_builds_and_never_change_their_base(seed: int) -> None:
    """Round 4's fork copies the free lists on write and the buckets whole: a fork equals a fresh
    `Capacity` of the same running jobs (bucket order included), and what a cycle takes on its
    fork never shows in the next fork, nor does a fork's fork's."""
    rng = random.Random(seed)
    policy = Policy(preemption=Preemption(grace_period_s=5.0))
    index = CapacityIndex()
    nodes = _nodes(7)
    running: dict[int, RunningJob] = {}
    next_id = 1
    for cycle in range(40):
        now = cycle * 10.0
        queued = [_job(rng, next_id + k, now) for k in range(rng.randrange(1, 10))]
        queued = [replace(j, gpus=float(max(1, int(j.gpus)))) for j in queued]  # whole GPUs: exact sums
        next_id += len(queued)
        for job_id in [j for j in running if rng.random() < 0.25]:
            del running[job_id]
        snap = Snapshot(nodes, tuple(running.values()), tuple(queued))
        fork = index.capacity(nodes, snap.running)
        assert _state(fork) == _state(Capacity(nodes, snap.running)), f"cycle {cycle}"
        plan = decide(replace(snap, capacity=index), policy, now)  # takes its starts on a fork
        assert plan == decide(snap, policy, now), f"cycle {cycle}"
        child = fork.fork()
        for st in plan.starts:
            fork.take(st.allocation)
            if rng.random() < 0.5:
                child.take(st.allocation)
        for st in plan.starts:
            req = next(j for j in queued if j.job_id == st.job_id)
            running[st.job_id] = RunningJob(st.job_id, st.allocation, req.team, req.priority, now, req.time_limit_s)
    assert running, "the history never started anything: it tests nothing"


@pytest.mark.parametrize("seed", range(1, 7))
@pytest.mark.parametrize("honest", [True, False])
def test_a_told_index_gives_fresh_plans_over_a_history(seed: int, honest: bool) -> None:
    """The simulator's way (`CapacityIndex(told=True)`): it reports each start, end and stop
    under way (which changes the job's expected end, kept sorted in the index's `EndBook`); a
    job replaced by another object with the same allocation and end (a checkpoint) needs none.
    Plans (with reasons) equal fresh ones; one report forgotten between two cycles now and then
    (`honest` False) is caught by the count and sent to the full comparison. Fractional jobs
    included: shared GPUs' sums are kept on a grid (see the test above)."""
    rng = random.Random(seed)
    policy = Policy(preemption=Preemption(grace_period_s=5.0))
    index = CapacityIndex(told=True)
    nodes = _nodes(6)
    running: dict[int, RunningJob] = {}
    queued: dict[int, JobRequest] = {}
    forgot = False
    shared = elastic = False
    next_id = 1
    for cycle in range(50):
        now = cycle * 10.0
        for _ in range(rng.randrange(0, 8)):
            job = _job(rng, next_id, now)
            queued[next_id] = replace(job, nodes=None)
            next_id += 1
        for job_id in [j for j in running if rng.random() < 0.2]:
            gone = running.pop(job_id)
            if honest or forgot or rng.random() > 0.1:
                index.remove(gone)
            else:
                forgot = True
        for job_id in [j for j in running if rng.random() < 0.1]:
            running[job_id] = replace(running[job_id], last_checkpoint_at=now)  # no report needed
        if cycle == 25:
            nodes = _nodes(7)  # a node joins: the index rebuilds
        if rng.random() < 0.1:
            continue  # no cycle: the reports pile up
        snap = Snapshot(nodes, tuple(running.values()), tuple(queued.values()))
        forgot = False
        fresh = decide(snap, policy, now)
        assert decide(replace(snap, capacity=index), policy, now) == fresh, f"cycle {cycle}"
        # What the index keeps of the running jobs the cycle asks it (their lowest class, a
        # share running) is what a pass over them finds.
        assert index.lowest_class() == min((int(j.priority) for j in running.values()), default=None)
        assert index.shares_running() == any(j.allocation.slices[0].share < 1 for j in running.values())
        assert index.elastic_running() == any(j.min_gpus is not None for j in running.values())
        shared = shared or bool(index.shares_running())
        elastic = elastic or bool(index.elastic_running())
        for p in fresh.preemptions:
            running[p.job_id] = replace(running[p.job_id], stopping=True)
            index.stopping(running[p.job_id])  # its expected end changes: the book must know
        for st in fresh.starts:
            req = queued.pop(st.job_id)
            job = RunningJob(st.job_id, st.allocation, req.team, req.priority, now, req.time_limit_s)
            if st.allocation.gpu_count > 1 and rng.random() < 0.2:  # elastic: it could be shrunk
                job = replace(job, min_gpus=1)
            running[st.job_id] = job
            index.add(job)
    assert running, "the history never started anything: it tests nothing"
    assert shared, "no share of a GPU ever ran: the count of them was never tested"
    assert elastic, "no elastic job ever ran: the count of them was never tested"
    assert index.rebuilds == 2
    if honest:
        assert index.diffs == 0
    else:
        assert index.diffs > 0
