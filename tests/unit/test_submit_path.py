"""One group-commit path (issue 15): a submission from a thread (ClusterService.submit, which the
head's tests, services and dependent jobs use) is committed by the same writer as the API's, so
the tests exercise what production runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpucluster.core.states import JobState
from gpucluster.head.submit_batcher import SubmitBatcher
from gpucluster.models import JobSpec
from gpucluster.store import Store

from .builders import spec
from .headkit import make_cluster

WAIT_S = 30.0  # generous: a loaded 2-core machine


def test_threads_submitting_through_the_service_share_the_batchers_commits(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path)
    store, batcher = cluster.store, cluster.service.batcher
    real = store.create_jobs_each
    batches: list[int] = []
    entered, release = threading.Event(), threading.Event()

    def held_first_commit(*args: object, **kwargs: object) -> object:
        batches.append(len(args[0]))  # type: ignore[arg-type]
        if len(batches) == 1:
            entered.set()
            release.wait(WAIT_S)  # the writer is busy: the next submissions gather meanwhile
        return real(*args, **kwargs)  # type: ignore[arg-type]

    store.create_jobs_each = held_first_commit  # type: ignore[method-assign]
    ids: list[int] = []
    lock = threading.Lock()

    def submit() -> None:
        job_id = cluster.service.submit(spec(gpus=1)).id
        with lock:
            ids.append(job_id)

    threads = [threading.Thread(target=submit, daemon=True) for _ in range(8)]
    try:
        threads[0].start()
        assert entered.wait(WAIT_S), "ClusterService.submit did not go through the submit batcher"
        for t in threads[1:]:
            t.start()
        deadline = time.monotonic() + WAIT_S
        while len(batcher._pending) < 7:  # all seven queued behind the held commit
            assert time.monotonic() < deadline, f"{len(batcher._pending)} of 7 submissions queued"
            time.sleep(0.01)
        release.set()
        for t in threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in threads)
        assert batches == [1, 7]  # the seven that waited share one commit
        assert len(set(ids)) == 8
        assert all(cluster.state(i) is JobState.QUEUED for i in ids)  # each acknowledged one is stored
    finally:
        release.set()
        cluster.close()


def test_a_submission_is_answered_before_the_loop_is_woken(tmp_path: Path) -> None:
    """Once woken, the loop takes the interpreter for a cycle (milliseconds with a long queue):
    the writer answers the batch's submitters first, so their 201s do not wait behind it."""
    store = Store(tmp_path / "state.db")
    answered = threading.Event()
    answered_when_woken: list[bool] = []

    def on_committed(specs: Sequence[JobSpec]) -> None:
        # Before the fix the loop was woken first: the answer could not come while this waits.
        answered_when_woken.append(answered.wait(WAIT_S))

    batcher = SubmitBatcher(store, on_committed=on_committed)

    def submit() -> None:
        batcher.submit_wait(JobSpec(command=["true"]), 1.0, "u")
        answered.set()

    submitter = threading.Thread(target=submit, daemon=True)
    try:
        submitter.start()
        submitter.join(2 * WAIT_S)
        assert answered.is_set(), "the submission was not answered"
        deadline = time.monotonic() + WAIT_S
        while not answered_when_woken:  # the wake-up follows the answer
            assert time.monotonic() < deadline, "the loop was not woken after the commit"
            time.sleep(0.01)
        assert answered_when_woken == [True]
        assert [r.state for r in store.list_jobs()] == [JobState.QUEUED]
    finally:
        batcher.close()
        store.close()


def test_an_api_submission_is_answered_on_its_event_loop_before_the_loop_is_woken(tmp_path: Path) -> None:
    """Issue 18: for a submission from the event loop (the API's), waking the head's loop from
    the writer right after handing over the answer still let the loop's cycle take the
    interpreter before the task had written its 201. The event loop now wakes it, behind the
    task its answer resumed."""
    store = Store(tmp_path / "state.db")
    order: list[str] = []
    woken = threading.Event()
    event_loop_thread: list[int] = []

    def on_committed(specs: Sequence[JobSpec]) -> None:
        where = "the event loop" if threading.get_ident() in event_loop_thread else "another thread"
        order.append(f"woken on {where}")
        woken.set()

    batcher = SubmitBatcher(store, on_committed=on_committed)

    async def submitter() -> None:
        event_loop_thread.append(threading.get_ident())
        await batcher.submit(JobSpec(command=["true"]), 1.0, "u")
        order.append("answered")  # what the route does next: write its 201, in this same step
        while not woken.is_set():
            await asyncio.sleep(0.01)

    try:
        asyncio.run(asyncio.wait_for(submitter(), WAIT_S))
        assert order == ["answered", "woken on the event loop"]
        assert [r.state for r in store.list_jobs()] == [JobState.QUEUED]
    finally:
        batcher.close()
        store.close()


def test_a_batch_from_threads_and_an_event_loop_is_answered_and_wakes_the_loop_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    wakes: list[int] = []
    real = store.create_jobs_each
    entered, release = threading.Event(), threading.Event()

    def held_first_commit(*args: object, **kwargs: object) -> object:
        if not entered.is_set():
            entered.set()
            release.wait(WAIT_S)  # the others gather behind this commit, into one batch
        return real(*args, **kwargs)  # type: ignore[arg-type]

    store.create_jobs_each = held_first_commit  # type: ignore[method-assign]
    batcher = SubmitBatcher(store, on_committed=lambda specs: wakes.append(len(specs)))
    ids: list[int] = []

    def on_thread() -> None:
        ids.append(batcher.submit_wait(JobSpec(command=["true"]), 1.0, "t"))

    async def on_loop() -> None:
        first = threading.Thread(target=on_thread, daemon=True)
        first.start()
        assert await asyncio.to_thread(entered.wait, WAIT_S)
        second = threading.Thread(target=on_thread, daemon=True)
        second.start()
        pending = asyncio.ensure_future(batcher.submit(JobSpec(command=["true"]), 1.0, "a"))
        deadline = time.monotonic() + WAIT_S
        while len(batcher._pending) < 2:  # the thread's and this loop's, behind the held commit
            assert time.monotonic() < deadline, f"{len(batcher._pending)} of 2 submissions queued"
            await asyncio.sleep(0.01)
        release.set()
        ids.append(await pending)
        for t in (first, second):
            await asyncio.to_thread(t.join, WAIT_S)
        while len(wakes) < 2:  # the first commit's wake, then the shared batch's
            assert time.monotonic() < deadline, f"{len(wakes)} wakes"
            await asyncio.sleep(0.01)

    try:
        asyncio.run(asyncio.wait_for(on_loop(), 2 * WAIT_S))
        assert sorted(ids) == [1, 2, 3]
        assert wakes == [1, 2]  # once per commit, told the specs each stored
        assert [r.state for r in store.list_jobs()] == [JobState.QUEUED] * 3
    finally:
        release.set()
        batcher.close()
        store.close()
