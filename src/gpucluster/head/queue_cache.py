"""The head's in-memory copy of the queue.

Why: a scheduling cycle must not re-read and re-parse every queued job from the store; at 5,000
queued jobs that cost 70 ms a cycle and starved the API of the interpreter. The store stays the
truth: new jobs are read incrementally (ids grow in commit order because SQLite serialises
writers), removals are told to the cache by whoever made them, and a full reload every
`full_refresh_s` corrects anything missed (e.g. ids committed out of order on another database).
"""

from __future__ import annotations

import threading

from gpucluster.core.types import JobRequest
from gpucluster.store import Store


class QueueCache:
    def __init__(self, store: Store, full_refresh_s: float = 5.0) -> None:
        self._store = store
        self._full_refresh_s = full_refresh_s
        self._jobs: dict[int, JobRequest] = {}
        self._max_id = 0
        self._last_full: float | None = None
        self._lock = threading.Lock()
        self._removed_since_load: set[int] = set()
        self._left = False  # a job left the queue other than by the loop's own start

    def refresh(self, now: float) -> bool:
        """Bring the cache up to date with the store; True if the queue changed."""
        full = self._last_full is None or now - self._last_full >= self._full_refresh_s
        with self._lock:
            self._removed_since_load.clear()
        rows = self._store.queued_requests(after_id=None if full else self._max_id)
        with self._lock:
            fresh = {r.job_id: r for r in rows if r.job_id not in self._removed_since_load}
            if full:
                changed = fresh.keys() != self._jobs.keys()
                self._jobs = fresh
                self._last_full = now
            else:
                changed = bool(fresh)
                self._jobs.update(fresh)
            if rows:
                self._max_id = max(self._max_id, max(r.job_id for r in rows))
            changed, self._left = changed or self._left, False
        return changed

    def remove(self, job_id: int, cancelled: bool = False) -> JobRequest | None:
        """The job left the queue (started or cancelled); safe to call from any thread. Returns
        the request the cache held for it: what the cycle that starts it planned with.
        `cancelled`: it left other than by the loop's start, so the next refresh says the queue
        changed and the jobs behind it are planned, and their estimates replayed, soon
        (head/estimates.py). A start needs neither: the plan that started it planned without it."""
        with self._lock:
            self._removed_since_load.add(job_id)
            self._left = self._left or cancelled
            return self._jobs.pop(job_id, None)

    def invalidate(self) -> None:
        """Something re-entered the queue out of id order (a requeue): reload it all next time."""
        self._last_full = None

    def requests(self) -> tuple[JobRequest, ...]:
        with self._lock:
            return tuple(self._jobs.values())
