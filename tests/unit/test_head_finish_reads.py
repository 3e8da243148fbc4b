"""A cycle's ending jobs are judged on their records as the store has them at the end's commit.

The loop keeps the running jobs' records (head/running_cache.py) and reads again, at a cycle's
ends, only those something may have written to since its refresh (`RunningCache.unchanged`,
issue 18: the head's CPU per job). These tests write a stop in that very window, after the
cycle's refresh and before its ends: by another thread of the head (told to the cache), and by
another process (told to nobody). Either way the end must be the stop's, not the exit's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpucluster.core.states import JobState
from gpucluster.executors.base import Handle, Status
from gpucluster.store import Store

from .headkit import T0, Cluster, closing_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from closing_cluster(tmp_path)


def stop_while_polled(cluster: Cluster, write: Callable[[], object]) -> None:
    """Run `write` when the loop polls the job's processes: after its refresh, before its ends."""
    poll = cluster.fake.poll_ranks
    done: list[bool] = []

    def poll_ranks(handle: Handle) -> list[Status]:
        if not done:
            done.append(True)
            write()
        return poll(handle)

    cluster.fake.poll_ranks = poll_ranks  # type: ignore[method-assign]


def started(cluster: Cluster) -> int:
    job = cluster.submit(gpus=1)
    cluster.tick_at(T0 + 1)
    assert cluster.state(job) is JobState.RUNNING
    cluster.tick_at(T0 + 2)  # its launch record read back: the cache holds its record
    return job


def test_a_cancel_from_another_thread_of_the_head_decides_the_end(cluster: Cluster) -> None:
    job = started(cluster)
    cluster.fake.finish(job, exit_code=0)
    stop_while_polled(cluster, lambda: cluster.store.request_stop(job, "cancel", T0 + 3))
    cluster.tick_at(T0 + 3)
    record = cluster.record(job)
    assert record.state is JobState.CANCELLED, record.reason


def test_a_cancel_written_by_another_process_decides_the_end(cluster: Cluster, tmp_path: Path) -> None:
    job = started(cluster)
    other = Store(tmp_path / "state.db")  # the CLI's direct write, a second API process: nobody tells the head
    try:
        cluster.fake.finish(job, exit_code=0)
        stop_while_polled(cluster, lambda: other.request_stop(job, "cancel", T0 + 3))
        cluster.tick_at(T0 + 3)
    finally:
        other.close()
    record = cluster.record(job)
    assert record.state is JobState.CANCELLED, record.reason


def test_an_end_nothing_wrote_to_is_judged_without_reading_its_record_again(cluster: Cluster) -> None:
    job = started(cluster)
    cluster.fake.finish(job, exit_code=0)
    reads: list[object] = []
    list_jobs = cluster.store.list_jobs

    def counted(*a: object, **k: object) -> object:
        if k.get("ids") is not None:  # the cycle's reads of named jobs (check mode reads all running ones)
            reads.append(list(k["ids"]))  # type: ignore[call-overload]
        return list_jobs(*a, **k)  # type: ignore[arg-type]

    cluster.store.list_jobs = counted  # type: ignore[method-assign]
    cluster.tick_at(T0 + 3)
    assert cluster.state(job) is JobState.SUCCEEDED
    assert [job] not in reads
