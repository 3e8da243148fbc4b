"""One group-commit path (issue 15): a submission from a thread (ClusterService.submit, which the
head's tests, services and dependent jobs use) is committed by the same writer as the API's, so
the tests exercise what production runs."""

from __future__ import annotations

import threading
import time
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

    def on_committed() -> None:
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
