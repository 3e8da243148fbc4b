"""The head's running jobs, kept in its cluster state (core/cluster_state.py) by events.

Why: the snapshot read and parsed every running job from the store each cycle (most of a quiet
cycle at 1,000 nodes x 8 GPUs), where between two cycles only a few jobs start, stop or end. The
store tells this cache the id of each job a write may have changed (`Store.watch_running`:
every end path goes through one of its few writes, whichever thread makes it: the loop's ends,
restarts and requeues, an API cancel, a budget or idle stop, crash recovery). The loop's thread
reads those jobs back and tells the state what became of them: `Started`, `StopRequested`,
`Checkpointed`, `Ended` with its `StopReason`. So the state's running jobs are exactly what a
fresh read gives, and check mode (`GPUCLUSTER_CHECK_STATE`) compares the two.

The loop's reconcile needs each running job's whole record (its launch, the stop under way, the
signals sent): those are kept here too, read back with the same told ids, so a quiet cycle
parses no record at all.

A full read turns anything not told (another process's write to the database) into events too:
only the jobs that differ. It happens only when another process may have written
(head/full_reads.py: checked every `full_refresh_s`; where the store cannot tell, every
`full_refresh_s` as before).
"""

from __future__ import annotations

import threading
from dataclasses import replace

from gpucluster.core.cluster_state import ClusterState, StateMismatch
from gpucluster.core.events import Checkpointed, Ended, Started, StopRequested, Submitted
from gpucluster.core.lifecycle import StopReason
from gpucluster.core.states import JobState
from gpucluster.core.types import RunningJob
from gpucluster.head.full_reads import FullReads
from gpucluster.store import JobRecord, Store
from gpucluster.store.store import KnownRunning, overlapped

# More told jobs than this at once are read with all the others (one query, no long IN list).
_MAX_IDS = 500

# Check mode: how often a difference is read again while other threads' writes keep overlapping
# the reads, and how long each time it waits for such a write to be told (generous: a write on a
# busy machine; the head's loop waits only in check mode, and only while one is under way).
CHECK_ATTEMPTS = 20
CHECK_WAIT_S = 10.0


class RunningCache:
    def __init__(self, store: Store, state: ClusterState, full_refresh_s: float = 5.0) -> None:
        self._store = store
        self.state = state
        self.full = FullReads(store, every_s=full_refresh_s)
        self._lock = threading.Lock()
        self._told: set[int] = set()  # told from any thread, read back on the loop's
        self._reasons: dict[int, StopReason] = {}  # why each stopping job is stopping
        self._running: tuple[RunningJob, ...] = ()  # the state's, in id order, as of event `_at`
        self._at = -1
        self._records: dict[int, JobRecord] = {}  # the running jobs' whole records
        self._records_sorted: list[JobRecord] | None = []  # None: to be sorted again
        self._known: KnownRunning = {}  # the last whole read's rows (`Store.running_records`)
        store.watch_running(self.told)

    def told(self, job_id: int) -> None:
        """A write may have changed this job's running view (any thread)."""
        with self._lock:
            self._told.add(job_id)

    def refresh(self, now: float) -> bool:
        """Tell the state what became of the jobs told since the last refresh (all of them when
        another process may have written: `full`); True if a job started, stopped or ended (not for a checkpoint)."""
        due = self.full.due(now)  # before the told ids are taken: it may raise (the database went away)
        with self._lock:
            ids, self._told = self._told, set()
        full = due or len(ids) > _MAX_IDS
        if not ids and not full:
            return False
        try:
            # One read of the rows; a whole one parses only the rows changed since the last.
            rows, records = self._store.running_records(None, self._known) if full else self._store.running_records(ids)
        except BaseException:
            with self._lock:
                self._told |= ids  # not read: read them next time
            raise
        running = self.state.running
        fresh = {job.job_id: (job, reason) for job, reason in rows}
        gone = [i for i in (running if full else ids) if i in running and i not in fresh]
        changed = False
        for job_id in gone:
            self._end(job_id)
            changed = True
        for job, reason in fresh.values():
            changed = self._tell(job, StopReason(reason) if reason is not None else None) or changed
        self._keep_records(records, full, ids)
        if due:
            self.full.done(now)
        return changed

    def _keep_records(self, records: list[JobRecord], full: bool, ids: set[int]) -> None:
        kept = self._records
        if full:
            fresh = {r.id: r for r in records}
            if fresh != kept:
                self._records, self._records_sorted = fresh, None
            return
        for job_id in ids:
            kept.pop(job_id, None)
        kept.update((r.id, r) for r in records)
        self._records_sorted = None

    def unchanged(self, job_ids: list[int]) -> dict[int, JobRecord]:
        """The kept records of `job_ids` that are certainly the store's own, to be called inside
        the caller's `Store.batch()` (which holds the write lock: nothing commits until it ends).

        Why (issue 18: the head's CPU per job): the loop read each ending job's record again, to
        see a stop another thread asked for since its cycle's refresh, and those reads were a
        tenth of its CPU per job. A kept record is stale only after a write that nobody told
        (another process's: `FullReads.others_wrote`, asked on the batch's own connection), or
        one told since the last refresh (its id is in `_told`), or one under way now (begun,
        not yet told: `Store.running_changes`). None of those: the kept record is what a read
        would give. Any of them for a job: it is left out, and the caller reads it. On
        PostgreSQL, where another process's write is told a moment after its commit, every
        job is read (`Store.others_wrote_at_once`)."""
        if not self._store.others_wrote_at_once or self._store.running_changes()[0] or self.full.others_wrote():
            return {}
        with self._lock:
            told = set(self._told)
        kept = self._records
        return {i: r for i in job_ids if i not in told and (r := kept.get(i)) is not None}

    def check_records(self, now: float) -> None:
        """Check mode: the kept records equal a fresh read. Another thread may write between the
        refresh and the read, or be told of its write only after the read saw it: a difference
        is a mismatch only when no such write overlapped the two reads (`store.overlapped`);
        otherwise it is read again once that write was told, up to CHECK_ATTEMPTS times."""
        for attempt in range(CHECK_ATTEMPTS):
            before = self._store.running_changes()
            self.refresh(now)
            stored = {r.id: r for r in self._store.list_jobs(states=[JobState.RUNNING])}
            if stored == self._records:
                return
            if attempt and not overlapped(before, self._store.running_changes()):
                break
            self._store.wait_running_changes_told(CHECK_WAIT_S)
        differ = sorted(i for i in stored.keys() | self._records.keys() if stored.get(i) != self._records.get(i))
        raise StateMismatch(f"the head's running jobs' records differ from a fresh read: jobs {differ[:5]}")

    def records(self) -> list[JobRecord]:
        """The running jobs' records, in id order, as the store had them at the last refresh."""
        if self._records_sorted is None:
            self._records_sorted = sorted(self._records.values(), key=_record_id)
        return list(self._records_sorted)

    def _tell(self, job: RunningJob, reason: StopReason | None) -> bool:
        """The event that brings the state's copy of `job` to the store's; True unless none or a
        checkpoint."""
        job_id = job.job_id
        old = self.state.running.get(job_id)
        if old is not None and old.started_at != job.started_at:
            self._end(job_id)  # a new attempt whose old one's end was read together with it
            old = None
        if reason is not None:
            self._reasons[job_id] = reason  # a stop that replaced another (a cancel of a preemption)
        else:
            self._reasons.pop(job_id, None)
        if old == job:
            return False
        apply = self.state.apply
        if old is None:
            apply(Started(job))
        elif job.last_checkpoint_at is not None and replace(old, last_checkpoint_at=job.last_checkpoint_at) == job:
            apply(Checkpointed(job_id, job.last_checkpoint_at))
            return False
        elif job.stopping and not old.stopping and reason is not None:
            apply(StopRequested(job, reason))
        else:
            apply(Started(job))  # changed otherwise (its time limit, `gpucluster update`): replaced
        return True

    def _end(self, job_id: int) -> None:
        # Already back in the queue (a restart or requeue the queue read first): it stays there;
        # `Ended` says the attempt ended, not that the queued job left.
        queued = self.state.queued.get(job_id)
        self.state.apply(Ended(job_id, self._reasons.pop(job_id, None)))
        if queued is not None:
            self.state.apply(Submitted(queued))

    def jobs(self) -> tuple[RunningJob, ...]:
        """The running jobs, in id order (as the store's read gave them); kept until the state
        applies another event (the loop's own start is told by the queue, head/queue_cache.py)."""
        if self._at != self.state.applied:
            self._running = tuple(sorted(self.state.running.values(), key=_job_id))
            self._at = self.state.applied
        return self._running


def _job_id(job: RunningJob) -> int:
    return job.job_id


def _record_id(record: JobRecord) -> int:
    return record.id
