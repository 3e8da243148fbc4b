"""Durable submission without blocking the API's event loop.

Why: one commit (an fsync) per submission, each on its own worker thread, capped the head at
~600 submissions/s on two cores. Here one writer thread commits whatever submissions have
gathered while the previous commit ran, in one transaction; each request is answered only once
its own row is durable, so an acknowledged job is never lost.

It is the head's one group-commit path: the API's requests (`submit`, on the event loop) and
every caller on a thread (`submit_wait`: arrays' dependents, services, tests through
ClusterService.submit) queue here, so tests submit the way production does.

The head is told of each commit that stored a job (`Head.submitted`, which wakes its loop unless
head/idle_wake.py says the jobs cannot start yet), and only once the batch's API
submitters have been answered: from their event loop, behind the tasks their answers resumed
(see `_answer`). Woken earlier, the loop takes the interpreter for a cycle while the event loop
still has the 201s to write, and a lone client waits for both (issue 18).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial

from gpucluster.core.policy import Limits
from gpucluster.models import JobSpec
from gpucluster.store import Store

MAX_BATCH = 512


class SubmitBatcher:
    def __init__(
        self,
        store: Store,
        on_committed: Callable[[Sequence[JobSpec]], None],
        limits: Callable[[], Limits | None] = lambda: None,
    ) -> None:
        self._store = store
        self._limits = limits  # the policy's, read at each commit: `max_queued_jobs` is checked there
        self._on_committed = on_committed  # told the specs each commit stored (Head.submitted)
        # (spec, submitted at, owner, the future its id or error goes to: an event loop's or a thread's)
        self._pending: list[tuple[JobSpec, float, str | None, asyncio.Future[int] | Future[int]]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="submit-writer", daemon=True)
        self._thread.start()

    async def submit(self, spec: JobSpec, now: float, owner: str | None = None) -> int:
        """Queue a submission from the event loop; its id once its row is durable."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue(spec, now, owner, fut)
        return await fut

    def submit_wait(self, spec: JobSpec, now: float, owner: str | None = None) -> int:
        """As `submit`, for a caller on a thread: blocks until its row is durable."""
        fut: Future[int] = Future()
        self._queue(spec, now, owner, fut)
        return fut.result()

    def _queue(self, spec: JobSpec, now: float, owner: str | None, fut: asyncio.Future[int] | Future[int]) -> None:
        with self._cond:
            if self._stopped:
                raise RuntimeError("the head is shutting down")
            self._pending.append((spec, now, owner, fut))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if not self._pending and self._stopped:
                    return
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            try:
                # One submission that cannot be stored fails alone; the others are committed.
                outcomes: list[int | Exception] = self._store.create_jobs_each(
                    [(s, t) for s, t, _, _ in batch], [o for _, _, o, _ in batch], self._limits()
                )
            except Exception as e:
                outcomes = [e] * len(batch)
            stored = [spec for (spec, _, _, _), o in zip(batch, outcomes, strict=True) if not isinstance(o, Exception)]
            self._answer_all(outcomes, [fut for _, _, _, fut in batch], stored)

    def _answer_all(
        self,
        outcomes: list[int | Exception],
        futures: list[asyncio.Future[int] | Future[int]],
        stored: list[JobSpec],
    ) -> None:
        """Answer a batch's submitters, then wake the head's loop if a job was stored.

        Answered first: once woken the loop takes the interpreter for a cycle (milliseconds with
        a long queue), and the answers would wait behind it. A thread's submitter is answered
        here; an event loop's on its loop, in one hop for all of them, and that loop then wakes
        the head's loop itself, once their tasks have run (`_answer`)."""
        wake: Callable[[], None] | None = None
        if stored:
            wake = partial(self._on_committed, stored)
        on_loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[int], int | BaseException]]] = {}
        for outcome, fut in zip(outcomes, futures, strict=True):
            if isinstance(fut, asyncio.Future):
                on_loops.setdefault(fut.get_loop(), []).append((fut, outcome))
            else:
                _settle(fut, outcome)
        for loop, answers in on_loops.items():
            try:
                loop.call_soon_threadsafe(_answer, answers, wake)
            except RuntimeError:  # that loop is closed: no one waits on it any more
                continue
            wake = None  # the first loop reached wakes the head's loop
        if wake is not None:
            wake()

    def close(self) -> None:
        """Commit what is pending, then stop."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=10)


def _answer(answers: list[tuple[asyncio.Future[int], int | BaseException]], wake: Callable[[], None] | None) -> None:
    """On the submitters' event loop: settle each future, then wake the head's loop. The wake is
    queued behind the task steps the settlements queued, so each submitter's task writes its 201
    (in that step: nothing between its answer and its response suspends) before the loop's cycle
    can take the interpreter."""
    for fut, outcome in answers:
        _settle(fut, outcome)
    if wake is not None:
        asyncio.get_running_loop().call_soon(wake)


def _settle(fut: asyncio.Future[int] | Future[int], outcome: int | BaseException) -> None:
    """Answer one submission: its id, or the error that kept it out."""
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)
