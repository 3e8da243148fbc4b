"""The head reads its queue and running jobs whole only after another process wrote (issue 15).

Its own writes, from any thread, tell its caches as they happen; what nobody tells is another
process's write to the same database, and the caches used to read the store whole every 5 s to
catch one (at 100,000 queued, more than the cycle's plan: bench/bench_head_cycle.py). Real
SQLite file, and a real second process for the other writer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucluster.core.states import JobState
from gpucluster.head.full_reads import SAFETY_READ_S
from gpucluster.store import Store
from gpucluster.store.store import KnownRunning

from .builders import allocation, spec
from .headkit import T0, Cluster, make_cluster

SRC = Path(__file__).resolve().parents[2] / "src"
STORE_BACKENDS = ("sqlite", "postgresql")  # tests/unit/conftest.py: each test runs on both


def target_of(store: Store) -> str:
    return str(store.path) if store.path is not None else store.url.render_as_string(hide_password=False)


def other_process(store: Store, code: str) -> None:
    """Run `code` with `store` open on the same database, in a process of its own (the CLI's
    direct writes, a second API process); return once `store` can tell (PostgreSQL delivers the
    write's notification just after its commit)."""
    before = store.others_wrote_token()
    script = f"from gpucluster.store import Store\nstore = Store({target_of(store)!r})\n{code}\nstore.close()\n"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    told(store, before)


def told(store: Store, before: object) -> None:
    """Until the store's answer differs from `before`: another connection's write reached it."""
    deadline = time.monotonic() + 30
    while store.others_wrote_token() == before:
        assert time.monotonic() < deadline, "another process's write was never told"
        time.sleep(0.01)


@pytest.fixture
def cluster(tmp_path: Path, store_target: Path | str) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, store_target=store_target)
    c.head.check_state = False  # check mode reads the store whole each plan by design: count the caches' reads
    try:
        yield c
    finally:
        c.close()


def count_whole_reads(store: Store) -> list[str]:
    """Record each whole read of the queue or the running jobs (no `after_id`, no `ids`)."""
    reads: list[str] = []
    queued, running = store.queued_requests, store.running_records

    def queued_requests(after_id: int | None = None, known: Any = None) -> Any:
        if after_id is None:
            reads.append("queue")
        return queued(after_id, known)

    def running_records(ids: Any = None, known: Any = None) -> Any:
        if ids is None:
            reads.append("running")
        return running(ids, known)

    store.queued_requests = queued_requests  # type: ignore[method-assign]
    store.running_records = running_records  # type: ignore[method-assign]
    return reads


def test_the_store_tells_another_connections_commit_from_its_own(store_target: Path | str) -> None:
    mine, other = Store(store_target), Store(store_target)
    try:
        before = mine.others_wrote_token()
        assert before is not None
        mine.create_job(spec(gpus=1), T0)
        writer = threading.Thread(target=lambda: mine.create_job(spec(gpus=1), T0))  # another of its threads
        writer.start()
        writer.join(timeout=60)
        assert mine.others_wrote_token() == before
        other.create_job(spec(gpus=1), T0)
        told(mine, before)
        assert other.others_wrote_token() is not None
    finally:
        mine.close()
        other.close()


def test_a_queue_changed_by_another_process_is_read_whole_and_not_before(cluster: Cluster) -> None:
    cluster.submit(gpus=8)
    waiting = cluster.submit(gpus=8)
    cluster.tick_at(T0)
    reads = count_whole_reads(cluster.store)
    cluster.tick_at(T0 + 6)
    cluster.tick_at(T0 + 12)
    assert reads == []  # nobody else wrote: 5 s on, no whole read
    other_process(cluster.store, f"store.set_held([{waiting}], True)")
    cluster.tick_at(T0 + 13)  # checked at T0 + 12: the next check is due 5 s later
    assert not cluster.head.queue.state.queued[waiting].held
    cluster.tick_at(T0 + 17)
    assert "queue" in reads
    assert cluster.head.queue.state.queued[waiting].held


def test_a_stop_written_by_another_process_reaches_the_running_job(cluster: Cluster) -> None:
    running = cluster.submit(gpus=8)
    cluster.tick_at(T0)
    reads = count_whole_reads(cluster.store)
    cluster.tick_at(T0 + 6)
    assert reads == []
    other_process(cluster.store, f"store.request_stop({running}, 'cancel', {T0 + 7})")
    cluster.tick_at(T0 + 11)
    assert "running" in reads
    assert cluster.head.cluster.running[running].stopping
    assert cluster.proc(running).signals  # and the loop, reconciling the record read back, sent SIGTERM


def test_with_no_other_writer_a_whole_read_still_comes_every_safety_period(cluster: Cluster) -> None:
    cluster.submit(gpus=8)
    cluster.tick_at(T0)
    reads = count_whole_reads(cluster.store)
    for k in range(1, int(SAFETY_READ_S // 5)):
        cluster.tick_at(T0 + 5 * k)
    assert reads == []
    cluster.tick_at(T0 + SAFETY_READ_S + 1)
    assert sorted(reads) == ["queue", "running"]


def test_a_whole_read_parses_only_the_rows_that_changed(store_target: Path | str) -> None:
    """`known` (the head's queue cache passes it): an unchanged row is answered with the request
    read before, the very object; a row another process changed is read afresh."""
    mine, other = Store(store_target), Store(store_target)
    try:
        ids = [mine.create_job(spec(gpus=1), T0 + k) for k in range(5)]
        known: dict[int, Any] = {}
        first = {r.job_id: r for r in mine.queued_requests(known=known)}
        assert set(first) == set(ids) and set(known) == set(ids)
        other.set_held([ids[1]], True)
        again = {r.job_id: r for r in mine.queued_requests(known=known)}
        assert set(again) == set(ids)
        assert all(again[i] is first[i] for i in (ids[0], ids[2], ids[3], ids[4]))
        assert again[ids[1]] is not first[ids[1]] and again[ids[1]].held and not first[ids[1]].held
        assert again == {r.job_id: r for r in mine.queued_requests()}  # as a read without `known`
    finally:
        mine.close()
        other.close()


def test_a_whole_read_of_running_jobs_parses_only_the_rows_that_changed(store_target: Path | str) -> None:
    """`known` (the head's running cache passes it for a whole read): an unchanged running job is
    answered with the view and record read before, the very objects; one another process
    changed (a stop requested) is read afresh; one that ended leaves `known`."""
    mine, other = Store(store_target), Store(store_target)
    try:
        ids = [mine.create_job(spec(gpus=1), T0 + k) for k in range(4)]
        for k, job_id in enumerate(ids):
            assert mine.transition(
                job_id, JobState.RUNNING, T0 + 10, "started", allocation=allocation("n1", k), attempt=1
            )
        known: KnownRunning = {}
        views, records = mine.running_records(None, known)
        first = {r.id: r for r in records}
        first_views = {v[0].job_id: v for v in views}
        assert set(first) == set(ids) == set(known)
        assert other.request_stop(ids[1], "cancel", T0 + 20)
        assert other.transition(ids[3], JobState.SUCCEEDED, T0 + 21, "done")
        views, records = mine.running_records(None, known)
        again = {r.id: r for r in records}
        assert set(again) == set(known) == {ids[0], ids[1], ids[2]}
        assert again[ids[0]] is first[ids[0]] and again[ids[2]] is first[ids[2]]
        assert {v[0].job_id: v for v in views}[ids[0]] is first_views[ids[0]]
        assert again[ids[1]] is not first[ids[1]] and again[ids[1]].stop_reason == "cancel"
        assert (views, records) == mine.running_records()  # as a read without `known`
    finally:
        mine.close()
        other.close()
