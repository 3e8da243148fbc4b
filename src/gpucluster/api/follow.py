"""`GET /v1/jobs/{id}/logs?follow=true`: many open log streams at the cost of a few.

Why this shape: a follow used to be a sync generator that slept between polls on a worker
thread, so ~40 quiet follows (a few dashboard tabs) held every thread of the pool and the whole
API (whoami, submit, even /v1/health) stopped answering; a closed client freed nothing, as the
thread only noticed at its next write. Now each follow is a coroutine that waits on an event,
holding no thread, and one watcher task per event loop decides whom to wake:

- every `poll_s` it stats the files being followed (one stat per distinct file, on a worker
  thread) and wakes the followers of a file that changed;
- every `check_s` it reads the followed jobs' records (one query) and wakes followers whose job
  changed state or attempt, and re-checks every follower's token: a token revoked or expired,
  a user removed or taken out of the job's team ends the stream at once;
- a woken follower reads what is new on a worker thread of a small pool of its own
  (`READERS`), so follows can never take the threads that other requests run on.

A client that goes away is noticed by Starlette's StreamingResponse, which waits for the
disconnect while it streams, and the follow is cancelled there and then. Each user may hold at
most `per_user` follows at once; the next one is refused with 429 (`FollowLimit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gpucluster.auth.control import AccessControl
from gpucluster.auth.identity import Identity, RateLimited, Unauthorized
from gpucluster.executors.logfile import read_log
from gpucluster.head.service import ClusterService, NotFound

DEFAULT_PER_USER = 100  # a few dashboard tabs of a user need ~40
POLL_S = 0.2  # how soon new output is sent
CHECK_S = 1.0  # how soon a job's end, or a revoked token, ends a stream
CHUNK_BYTES = 1024 * 1024  # read at most this much per step: a follower's memory stays bounded
READERS = 8  # worker threads for follows (reads and the watcher's scans), apart from the API's 40
RETRY_AFTER_S = 5.0

Signature = tuple[int, int, int] | None  # (inode, size, mtime_ns) of a log file; None: not there


class FollowLimit(RateLimited):
    """The user holds as many follows as they may (HTTP 429)."""


@dataclass(eq=False)
class Follower:
    """One open follow: what it reads, and what the watcher compares to wake it."""

    who: Identity
    token: str
    job_id: int
    attempt: int | None
    rank: int | None
    team: str
    loop: asyncio.AbstractEventLoop
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    path: Path | None = None  # the file last read (None: the attempt has no log yet)
    sig: Signature = None  # the file's signature just before that read
    job_state: tuple[str, int] | None = None  # (state, attempt) of the job at that read
    ended: str | None = None  # why the stream must stop (revoked token, ...)


class LogFollows:
    """Open follows of one app, and the watcher task (one per event loop) that wakes them."""

    def __init__(
        self,
        service: ClusterService,
        access: AccessControl,
        per_user: int = DEFAULT_PER_USER,
        poll_s: float = POLL_S,
        check_s: float = CHECK_S,
    ) -> None:
        self.service = service
        self.access = access
        self.per_user = per_user
        self.poll_s = poll_s
        self.check_s = check_s
        self.readers = anyio.CapacityLimiter(READERS)
        self._open: dict[asyncio.AbstractEventLoop, set[Follower]] = {}
        self._per_user: dict[str, int] = {}
        self._watchers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}

    @property
    def count(self) -> int:
        return sum(len(s) for s in self._open.values())

    def open(
        self, who: Identity, token: str, job_id: int, attempt: int | None, rank: int | None, team: str
    ) -> Follower:
        """Register a follow, or FollowLimit when the user holds `per_user` already."""
        held = self._per_user.get(who.user, 0)
        if held >= self.per_user:
            raise FollowLimit(
                f"follow: you ({who.user}) already follow {held} logs, the most one user may at once; "
                "close one (a dashboard tab, a `logs --follow`) or read without follow",
                RETRY_AFTER_S,
            )
        loop = asyncio.get_running_loop()
        f = Follower(who, token, job_id, attempt, rank, team, loop)
        self._per_user[who.user] = held + 1
        self._open.setdefault(loop, set()).add(f)
        task = self._watchers.get(loop)
        if task is None or task.done():
            self._watchers[loop] = loop.create_task(self._watch(loop), name="log-follow-watcher")
        return f

    def close(self, f: Follower) -> None:
        followers = self._open.get(f.loop)
        if followers is None or f not in followers:
            return
        followers.discard(f)
        left = self._per_user.get(f.who.user, 1) - 1
        if left > 0:
            self._per_user[f.who.user] = left
        else:
            self._per_user.pop(f.who.user, None)
        if not followers:
            del self._open[f.loop]
            task = self._watchers.pop(f.loop, None)
            if task is not None:
                task.cancel()

    def response(self, f: Follower, offset: int) -> StreamingResponse:
        """The streaming answer; the follow is closed however the stream ends (or never starts)."""
        return _FollowResponse(self._stream(f, offset), media_type="text/plain", on_close=lambda: self.close(f))

    async def _stream(self, f: Follower, offset: int) -> AsyncIterator[bytes]:
        """The log from `offset` as it grows, until the attempt has ended and all of it was sent."""
        pos = offset
        while f.ended is None:
            f.wake.clear()  # before the read: a change seen after it wakes the next wait
            try:
                chunk, pos, over = await anyio.to_thread.run_sync(self._step, f, pos, limiter=self.readers)
            except NotFound:
                return
            if chunk:
                yield chunk
                continue
            if over:
                return
            await f.wake.wait()

    def _step(self, f: Follower, pos: int) -> tuple[bytes, int, bool]:
        """On a worker thread: what is new in the log past `pos`, and whether the attempt is over."""
        path, record = self.service.log_path(f.job_id, f.attempt, f.rank)
        over = record.state.terminal or (f.attempt is not None and f.attempt < record.attempt)
        f.job_state = (record.state.value, record.attempt)
        f.path = path
        if path is None:
            f.sig = None
            return b"", pos, over
        f.sig = _signature(path)
        chunk, new_pos = read_log(path, pos, CHUNK_BYTES)  # offsets count rotated bytes too
        return chunk, new_pos, over

    async def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the followers on this loop whose file, job or token changed (see the docstring)."""
        last_check = loop.time()
        while self._open.get(loop):
            await asyncio.sleep(self.poll_s)
            followers = list(self._open.get(loop, ()))
            check = loop.time() - last_check >= self.check_s
            if check:
                last_check = loop.time()
            try:
                woken = await anyio.to_thread.run_sync(self._scan, followers, check, limiter=self.readers)
            except Exception:  # a failed scan (the store briefly unreadable) must not end every follow
                await asyncio.sleep(self.check_s)
                continue
            for f in woken:
                f.wake.set()

    def _scan(self, followers: list[Follower], check: bool) -> list[Follower]:
        """On a worker thread: the followers to wake now."""
        sigs: dict[Path, Signature] = {}
        woken: list[Follower] = []
        for f in followers:
            if f.path is None or f.wake.is_set():
                continue
            if f.path not in sigs:
                sigs[f.path] = _signature(f.path)
            if sigs[f.path] != f.sig:
                woken.append(f)
        if not check:
            return woken
        ids = sorted({f.job_id for f in followers})
        states = {r.id: (r.state.value, r.attempt) for r in self.service.store.list_jobs(ids=ids)}
        identities: dict[str, Identity | str] = {}
        for f in followers:
            if f.token not in identities:
                identities[f.token] = self._identity(f.token)
            who = identities[f.token]
            if isinstance(who, str):
                f.ended = who
            elif not who.can_see(f.team):
                f.ended = f"you ({who.user}) are no longer in team {f.team}"
            if f.ended is not None or states.get(f.job_id) != f.job_state:
                woken.append(f)
        return woken

    def _identity(self, token: str) -> Identity | str:
        try:
            return self.access.authenticate(token)
        except Unauthorized as e:
            return str(e)


def _signature(path: Path) -> Signature:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class _FollowResponse(StreamingResponse):
    """A StreamingResponse that runs `on_close` however it ends: done, client gone, cancelled."""

    def __init__(self, content: AsyncIterator[bytes], media_type: str, on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type=media_type)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose: Any = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
