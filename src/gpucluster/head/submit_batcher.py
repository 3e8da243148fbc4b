"""Durable submission without blocking the API's event loop.

Why: one commit (an fsync) per submission, each on its own worker thread, capped the head at
~600 submissions/s on two cores. Here one writer thread commits whatever submissions have
gathered while the previous commit ran, in one transaction; each request is answered only once
its own row is durable, so an acknowledged job is never lost.

It is the head's one group-commit path: the API's requests (`submit`, on the event loop) and
every caller on a thread (`submit_wait`: arrays' dependents, services, tests through
ClusterService.submit) queue here, so tests submit the way production does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future

from gpucluster.core.policy import Limits
from gpucluster.models import JobSpec
from gpucluster.store import Store

MAX_BATCH = 512


class SubmitBatcher:
    def __init__(
        self, store: Store, on_committed: Callable[[], None], limits: Callable[[], Limits | None] = lambda: None
    ) -> None:
        self._store = store
        self._limits = limits  # the policy's, read at each commit: `max_queued_jobs` is checked there
        self._on_committed = on_committed
        # (spec, submitted at, owner, what to call with the job's id or the error, from this thread)
        self._pending: list[tuple[JobSpec, float, str | None, Callable[[int | BaseException], None]]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="submit-writer", daemon=True)
        self._thread.start()

    async def submit(self, spec: JobSpec, now: float, owner: str | None = None) -> int:
        """Queue a submission from the event loop; its id once its row is durable."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()

        def done(outcome: int | BaseException) -> None:
            loop.call_soon_threadsafe(_settle, fut, outcome)

        self._queue(spec, now, owner, done)
        return await fut

    def submit_wait(self, spec: JobSpec, now: float, owner: str | None = None) -> int:
        """As `submit`, for a caller on a thread: blocks until its row is durable."""
        fut: Future[int] = Future()
        self._queue(spec, now, owner, lambda outcome: _settle(fut, outcome))
        return fut.result()

    def _queue(self, spec: JobSpec, now: float, owner: str | None, done: Callable[[int | BaseException], None]) -> None:
        with self._cond:
            if self._stopped:
                raise RuntimeError("the head is shutting down")
            self._pending.append((spec, now, owner, done))
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
            # Answered before the loop is woken: once woken it takes the interpreter for a
            # cycle (milliseconds with a long queue), and the answers would wait behind it.
            for outcome, (_, _, _, done) in zip(outcomes, batch, strict=True):
                done(outcome)
            if any(not isinstance(o, BaseException) for o in outcomes):
                self._on_committed()

    def close(self) -> None:
        """Commit what is pending, then stop."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=10)


def _settle(fut: asyncio.Future[int] | Future[int], outcome: int | BaseException) -> None:
    """Answer one submission: its id, or the error that kept it out."""
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)
