"""The head's queue, kept in its cluster state (core/cluster_state.py) by events.

Why: a scheduling cycle must not re-read and re-parse every queued job from the store; at 5,000
queued jobs that cost 70 ms a cycle and starved the API of the interpreter. Nor should it sort the
whole queue into its lines again (O(queued) a cycle: most of a cycle at 100,000 queued): each job
that enters or leaves is told to the state as an event (`Submitted`, `Started`, `Ended`), which
keeps the queue index the simulator keeps (`QueueIndex(told=True)`). The store stays the truth:
new jobs are read incrementally (ids grow in commit order because SQLite serialises writers),
removals are told by whoever made them, and a full reload turns anything missed (e.g. ids
committed out of order on another database, a requeue, a changed request) into events too: only
the jobs that differ, so the index keeps the others. The full reload is due after a requeue
(`invalidate`), and otherwise only when another process may have written (head/full_reads.py:
checked every `full_refresh_s`, and read whole every `full_refresh_s` where the store cannot tell).

Removals may be told from any thread (an API cancel); they wait in `_pending` and are applied on
the loop's thread (`refresh`, `requests`), the only one that touches the state.
"""

from __future__ import annotations

import threading

from gpucluster.core.cluster_state import ClusterState, running_job
from gpucluster.core.events import Ended, Event, Started, Submitted
from gpucluster.core.lifecycle import StopReason
from gpucluster.core.types import Allocation, JobRequest
from gpucluster.head.full_reads import FullReads
from gpucluster.store import Store


class QueueCache:
    def __init__(self, store: Store, state: ClusterState | None = None, full_refresh_s: float = 5.0) -> None:
        self._store = store
        self.state = state if state is not None else ClusterState(keeps_running=False)
        self.full = FullReads(store, every_s=full_refresh_s)
        self._max_id = 0
        self._lock = threading.Lock()
        self._pending: list[Event] = []  # told from any thread, applied on the loop's
        self._removed_since_load: set[int] = set()
        self._left = False  # a job left the queue other than by the loop's own start
        # Job id -> (hash of its row, its request) as last read (`Store.queued_requests`' `known`):
        # a whole read parses only the rows that changed. Loop thread; dropped when a job leaves.
        self._known: dict[int, tuple[int, JobRequest]] = {}

    def refresh(self, now: float) -> bool:
        """Bring the queue up to date with the store; True if the queue changed."""
        full = self.full.due(now)
        with self._lock:
            self._removed_since_load.clear()
        rows = self._store.queued_requests(after_id=None if full else self._max_id, known=self._known)
        with self._lock:
            self._apply_pending()
            jobs, apply = self.state.queued, self.state.apply
            fresh = {r.job_id: r for r in rows if r.job_id not in self._removed_since_load}
            changed = False
            if full:
                for job_id in [i for i in jobs if i not in fresh]:
                    apply(Ended(job_id))
                    changed = True
                for job_id in self._known.keys() - fresh.keys():
                    del self._known[job_id]
                self.full.done(now)
            for job_id, r in fresh.items():
                old = jobs.get(job_id)
                # An equal job keeps its object (the index's key); a row unchanged since the last
                # read is that very object (`_known`), told apart without comparing its fields.
                if old is None or (old is not r and old != r):
                    apply(Submitted(r))
                    changed = True
            if rows:
                self._max_id = max(self._max_id, max(r.job_id for r in rows))
            changed, self._left = changed or self._left, False
        return changed

    def _apply_pending(self) -> None:
        for event in self._pending:
            self.state.apply(event)
        self._pending.clear()

    def remove(self, job_id: int, cancelled: bool = False) -> JobRequest | None:
        """The job left the queue (cancelled, or leaves it by a start told by `started`); safe to
        call from any thread. Returns the request held for it: what the cycle that starts it
        planned with. `cancelled`: it left other than by the loop's start, so the next refresh
        says the queue changed and the jobs behind it are planned, and their estimates replayed,
        soon (head/estimates.py). A start needs neither: the plan that started it planned without it."""
        with self._lock:
            self._removed_since_load.add(job_id)
            self._known.pop(job_id, None)
            self._left = self._left or cancelled
            self._pending.append(Ended(job_id, StopReason.CANCEL if cancelled else None))
            return self.state.queued.get(job_id)

    def started(self, job_id: int, allocation: Allocation, now: float) -> JobRequest | None:
        """The loop starts this queued job (its own thread): the request it planned with."""
        with self._lock:
            self._removed_since_load.add(job_id)
            self._known.pop(job_id, None)
            self._apply_pending()
            job = self.state.queued.get(job_id)
            if job is not None:
                self.state.apply(Started(running_job(job, allocation, now)))
            return job

    def read_so_far(self, rows: list[JobRequest]) -> list[JobRequest]:
        """Of a fresh read of the store's queue, the jobs this cache has read: those up to the last
        id it read. One beyond was committed after that read (an API submission answered
        meanwhile) and the next incremental read takes it by design, so check mode compares
        without it: it called such a job missed while a wave of submissions raced its reads
        (StateMismatch in the PostgreSQL restart test, issue 15). A job this cache read past and
        lacks is still a difference."""
        return [r for r in rows if r.job_id <= self._max_id]

    def invalidate(self) -> None:
        """Something re-entered the queue out of id order (a requeue): reload it all next time."""
        self.full.invalidate()

    def requests(self) -> tuple[JobRequest, ...]:
        """The queue (the loop's thread applies what others told first)."""
        with self._lock:
            self._apply_pending()
            return self.state.queued_jobs()
