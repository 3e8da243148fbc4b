"""Durable submission without blocking the API's event loop.

Why: one commit (an fsync) per submission, each on its own worker thread, capped the head at
~600 submissions/s on two cores. Here one writer thread commits whatever submissions have
gathered while the previous commit ran, in one transaction; each request is answered only once
its own row is durable, so an acknowledged job is never lost.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

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
        self._pending: list[tuple[JobSpec, float, str | None, asyncio.Future[int], asyncio.AbstractEventLoop]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="submit-writer", daemon=True)
        self._thread.start()

    async def submit(self, spec: JobSpec, now: float, owner: str | None = None) -> int:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("the head is shutting down")
            self._pending.append((spec, now, owner, fut, loop))
            self._cond.notify()
        return await fut

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
                outcomes = self._store.create_jobs_each(
                    [(s, t) for s, t, _, _, _ in batch], [o for _, _, o, _, _ in batch], self._limits()
                )
            except Exception as e:
                outcomes = [e] * len(batch)
            if any(not isinstance(o, BaseException) for o in outcomes):
                self._on_committed()
            for outcome, (_, _, _, fut, loop) in zip(outcomes, batch, strict=True):
                if isinstance(outcome, BaseException):
                    loop.call_soon_threadsafe(_fail, fut, outcome)
                else:
                    loop.call_soon_threadsafe(_resolve, fut, outcome)

    def close(self) -> None:
        """Commit what is pending, then stop."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=10)


def _resolve(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[int], error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(error)
