"""When a cache the head keeps by events reads the store whole: only after another process wrote.

Why: the head's queue and running jobs are kept from what it is told (head/queue_cache.py,
head/running_cache.py): its own writes, from any of its threads, tell the caches as they happen.
What nobody tells is another process's write to the same database (the CLI writing the store
directly, a second head or API process), and the caches used to catch those by reading the store
whole every 5 s: at 100,000 queued jobs that read cost more than the cycle's plan, whether anyone
else had written or not. The store can say whether another connection committed
(`Store.others_wrote_token`: SQLite's data_version, PostgreSQL's notifications of each write);
then the whole read happens only when the answer changed, checked at most every `every_s` (so
another process's write is still seen within that time, as before). While the store cannot tell
(no listener on PostgreSQL) it reads every `every_s` as before. A rare read every `safety_s`
remains whatever the answer: the caches' events are checked against fresh builds only in check
mode (tests, `--debug`), and this bounds how long a write nobody told of (a missed event) could
mislead the plans in production.
"""

from __future__ import annotations

from gpucluster.store import Store

SAFETY_READ_S = 60.0


class FullReads:
    def __init__(self, store: Store, every_s: float = 5.0, safety_s: float = SAFETY_READ_S) -> None:
        self._store = store
        self.every_s = every_s
        self.safety_s = safety_s
        self._at: float | None = None  # the last whole read (None: read whole next time)
        self._checked_at: float | None = None  # the last time the store said nobody else wrote
        self._token: tuple[int, int] | None = None  # the store's answer as of the last whole read
        self._next: tuple[int, int] | None = None  # its answer as of the read now due
        self.skipped = 0  # whole reads the store's answer saved (tests, benchmarks)

    def due(self, now: float) -> bool:
        """A whole read is due now. The store's answer is taken before that read, so a write
        committed while it runs is seen at the next check."""
        if self._at is not None:
            since = self._checked_at if self._checked_at is not None else self._at
            if now - since < self.every_s:
                return False
        token = self._store.others_wrote_token()
        if self._at is not None and token is not None and token == self._token and now - self._at < self.safety_s:
            self._checked_at = now
            self.skipped += 1
            return False
        self._next = token
        return True

    def others_wrote(self) -> bool:
        """Another process may have written since the last whole read (True when the store
        cannot tell)."""
        token = self._store.others_wrote_token()
        return token is None or token != self._token

    def done(self, now: float) -> None:
        """The whole read that `due` asked for succeeded."""
        self._at, self._checked_at, self._token = now, None, self._next

    def invalidate(self) -> None:
        """Read whole next time (something re-entered out of order: a requeue)."""
        self._at = None
