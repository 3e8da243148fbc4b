"""The LAS victim pool passes over a running job of the asker's class that never checkpointed
(no LAS victim) before any other test, but only when no job shares a GPU: a job sharing one
still tells the pool that its model's victims are counted GPU by GPU (`_shared_pool`)."""

from __future__ import annotations

from gpucluster.core.policy import Policy
from gpucluster.core.scheduler import _Cycle
from gpucluster.core.types import Allocation, NodeSlice, Priority, RunningJob

from .builders import job, node, running, snapshot

NOW = 10_000.0


def _pool(jobs: list[RunningJob], las_filter: bool) -> tuple[dict[str, list[int]], set[str]]:
    """A normal job's pool (its class's LAS victims and every lower class's jobs) and the
    models it found a shared GPU on."""
    snap = snapshot([node("a").gpus(4), node("b").gpus(4, "A100")], jobs, [job(50).gpus(4).at(NOW)])
    cycle = _Cycle(snap, Policy(), NOW, reasons=False)
    assert cycle._las
    cycle.las_pool_filter = las_filter
    pool = cycle._victim_pool(int(Priority.NORMAL) + 1, 0.0 if las_filter else None)
    return {m: [v.job_id for v in p.jobs] for m, p in pool.items()}, cycle._shared_pool


def test_a_shared_gpu_of_a_job_that_never_checkpointed_is_still_seen() -> None:
    """Job 1 (normal, no checkpoint) holds half of an H100: the H100 pool is counted GPU by GPU
    with the filter as without it. Skipping such a job whatever is shared would miss it."""
    half = Allocation((NodeSlice("a", (0,), 0.5, 1024),))
    jobs = [
        RunningJob(1, half, started_at=0.0),
        running(2, "a", 1, 2, 3, priority="low", started_at=0.0),
        running(3, "b", 0, 1, started_at=0.0, checkpoint=NOW - 60.0),
    ]
    pool, shared = _pool(jobs, las_filter=True)
    whole, shared_whole = _pool(jobs, las_filter=False)
    assert shared == shared_whole == {"H100"}
    assert pool == {"H100": [2], "A100": [3]}
    assert whole["H100"] == [2, 1]  # unfiltered: job 1 too (its class is kept for LAS alone)


def test_without_shares_a_job_that_never_checkpointed_is_no_victim() -> None:
    """Whole GPUs only: the normal job without a checkpoint is left out, the one that
    checkpointed a minute ago (within the first queue's allowance) is in."""
    jobs = [
        running(1, "a", 0, started_at=0.0),
        running(2, "a", 1, 2, 3, priority="low", started_at=0.0),
        running(3, "b", 0, 1, started_at=0.0, checkpoint=NOW - 60.0),
    ]
    pool, shared = _pool(jobs, las_filter=True)
    assert shared == set()
    assert pool == {"H100": [2], "A100": [3]}
