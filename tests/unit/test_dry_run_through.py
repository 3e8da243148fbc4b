"""A dry run replays the queue only up to its probe (head/dry_run.py `through`): the probe's
estimate is the one the whole replay gives it. Over seeded random clusters (running jobs with
and without limits, queued jobs of several sizes, models and limits, some asking CPUs and
memory, some not yet eligible), every waiting job in turn is taken as the probe, under replay
limits below, at and above its place in line (past the limit a job gets a lower bound).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpucluster.core.estimate import estimate_starts
from gpucluster.core.policy import Policy
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, RunningJob
from gpucluster.head.dry_run import through
from tests.unit.builders import job, node, running


def _cluster(rng: random.Random) -> Snapshot:
    nodes = [
        node(f"n{i}").gpus(8, rng.choice(["H100", "A100"])).host(cpus=64.0, memory_mb=512 * 1024).build()
        for i in range(rng.randrange(2, 6))
    ]
    held: list[RunningJob] = []
    for nd in nodes:
        used = rng.randrange(0, 9)
        if used:
            limit = rng.choice([None, 600.0, 3600.0])
            held.append(running(len(held) + 1, nd.name, *range(used), started_at=-rng.uniform(0, 500), limit=limit))
    queued: list[JobRequest] = []
    for k in range(rng.randrange(5, 40)):
        b = job(1000 + k).gpus(rng.choice([1, 1, 2, 4, 8, 16])).limit(rng.choice([None, 300.0, 1800.0]))
        b.gpu_types(*rng.choice([(), ("H100",), ("A100", "H100")])).team(rng.choice(["a", "b"]))
        if rng.random() < 0.2:
            b.host(cpus=rng.choice([8.0, 48.0]), mem_mb=rng.choice([0, 64 * 1024]))
        q = b.build()
        if rng.random() < 0.1:  # not before a begin time: its wait carries a floor
            q = replace(q, not_before=rng.uniform(10, 900))
        queued.append(q)
    return Snapshot(nodes=tuple(nodes), running=tuple(held), queued=tuple(queued), usage={})


@pytest.mark.parametrize("seed", range(25))
def test_the_probe_estimate_is_the_whole_replays(seed: int) -> None:
    rng = random.Random(seed)
    snap = _cluster(rng)
    policy = Policy()
    plan = decide(snap, policy, 0.0)
    assert plan.waiting, "every job started: the case tests nothing"
    runs = {q.job_id: rng.uniform(60, 3000) for q in snap.queued if rng.random() < 0.5}
    for place, job_id in enumerate(plan.waiting):
        for limit in (max(place - 1, 0), place, place + 1, 10_000):
            whole = estimate_starts(snap, policy, 0.0, plan, limit, runs=runs)
            cut = through(plan, job_id)
            assert list(cut.waiting) == list(plan.waiting)[: place + 1]
            assert cut.starts == plan.starts and cut.preemptions == plan.preemptions
            assert estimate_starts(snap, policy, 0.0, cut, limit, runs=runs)[job_id] == whole[job_id]
    assert through(plan, -1) is plan  # a job that does not wait: the plan as it is
