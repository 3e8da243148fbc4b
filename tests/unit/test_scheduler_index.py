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
        for st in fresh.starts:
            req = queued.pop(st.job_id)
            running[st.job_id] = RunningJob(st.job_id, st.allocation, req.team, req.priority, now, req.time_limit_s)
    assert index.rebuilds == 2  # the first cycle and the node change; every other cycle applied deltas
    assert running, "the history never started anything: it tests nothing"
