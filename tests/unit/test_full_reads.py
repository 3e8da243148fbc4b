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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucluster.head.full_reads import SAFETY_READ_S
from gpucluster.store import Store

from .builders import spec
from .headkit import T0, Cluster, make_cluster

SRC = Path(__file__).resolve().parents[2] / "src"


def other_process(db: Path, code: str) -> None:
    """Run `code` with `store` open on the same file, in a process of its own (the CLI's direct
    writes, a second API process)."""
    script = f"from gpucluster.store import Store\nstore = Store({str(db)!r})\n{code}\nstore.close()\n"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(tmp_path)
    c.head.check_state = False  # check mode reads the store whole each plan by design: count the caches' reads
    try:
        yield c
    finally:
        c.close()


def count_whole_reads(store: Store) -> list[str]:
    """Record each whole read of the queue or the running jobs (no `after_id`, no `ids`)."""
    reads: list[str] = []
    queued, running = store.queued_requests, store.running_records

    def queued_requests(after_id: int | None = None) -> Any:
        if after_id is None:
            reads.append("queue")
        return queued(after_id)

    def running_records(ids: Any = None) -> Any:
        if ids is None:
            reads.append("running")
        return running(ids)

    store.queued_requests = queued_requests  # type: ignore[method-assign]
    store.running_records = running_records  # type: ignore[method-assign]
    return reads


def test_the_store_tells_another_connections_commit_from_its_own(tmp_path: Path) -> None:
    mine, other = Store(tmp_path / "state.db"), Store(tmp_path / "state.db")
    try:
        before = mine.others_wrote_token()
        assert before is not None
        mine.create_job(spec(gpus=1), T0)
        writer = threading.Thread(target=lambda: mine.create_job(spec(gpus=1), T0))  # another of its threads
        writer.start()
        writer.join(timeout=60)
        assert mine.others_wrote_token() == before
        other.create_job(spec(gpus=1), T0)
        assert mine.others_wrote_token() != before
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
    other_process(cluster.store.path, f"store.set_held([{waiting}], True)")  # type: ignore[arg-type]
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
    other_process(cluster.store.path, f"store.request_stop({running}, 'cancel', {T0 + 7})")  # type: ignore[arg-type]
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
