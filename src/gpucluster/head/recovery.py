"""Crash recovery: what a head finds of the attempts a previous head (or a failed cycle) left.

Split out of head/loop.py. Order matters for crash safety: an allocation is committed (state
`running`, attempt n) before the process is launched, and the launch handle is committed after;
a head that dies in between finds, on restart, either the shim's own pid file (the job started:
adopt it) or nothing after a grace period (it never started: back to the queue). A distributed
attempt's executor records how many processes before starting the first, so an incomplete set
is found too: after the grace period those that did start are killed and the job is requeued.
Jobs left `preempted` (a head that committed a preemption's two writes apart died between them,
or a cycle failed there; the loop now commits them together with the cycle's other ends) are
requeued.
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING

from gpucluster.core.lifecycle import Exit, after_attempt
from gpucluster.core.states import JobState
from gpucluster.executors.base import Handle, complete
from gpucluster.store import JobRecord

if TYPE_CHECKING:
    from gpucluster.head.loop import Head

log = logging.getLogger("gpucluster.head")

# A running job with no recorded launch and no shim pid file after this long never started.
LAUNCH_GRACE_S = 10.0


def adopt_launch(head: Head, job: JobRecord, now: float) -> Handle | None:
    """The launch of a running job that has none recorded: the executor's record of it, adopted
    (committed) when complete; None while it may still be starting, or once it was requeued."""
    handle = head.executor.recover(head.data_dir.run_dir(job.id, job.attempt))
    overdue = job.started_at is not None and now - job.started_at > LAUNCH_GRACE_S
    if handle is not None and not complete(handle):
        # The head stopped while starting the processes: the missing ones never will.
        if overdue:
            head.executor.signal(handle, signal.SIGKILL)
            head.executor.cleanup(handle)
            requeue_unlaunched(head, job, now, "the head stopped while starting the job's processes")
        return None
    if handle is None:
        if overdue:
            requeue_unlaunched(head, job, now, "the head stopped before the process was launched")
        return None
    head.store.update_job(job.id, JobState.RUNNING, launch=handle)
    return handle


def requeue_unlaunched(head: Head, job: JobRecord, now: float, why: str) -> None:
    """An attempt that provably never started goes back to the queue (the lifecycle's NOT_STARTED)."""
    head.queue.invalidate()
    head._capacity_changed = True
    after = after_attempt(None, Exit.NOT_STARTED)
    head.store.transition(
        job.id,
        after.state,
        now,
        f"requeued: {why}",
        expect=[JobState.RUNNING],
        ended_attempt=head._attempt_record(job, now, after.attempt.value, why, ()),
        queued_at=now,
        allocation=None,
        started_at=None,
    )


def requeue_left_preempted(head: Head, now: float) -> None:
    """Jobs preempted but not requeued (the head stopped, or a cycle failed, in between)."""
    for job in head.store.list_jobs(states=[JobState.PREEMPTED]):
        log.info("job %s: left preempted, not requeued (the head stopped or a cycle failed); requeued", job.id)
        head._requeue_after_preemption(job.id, now, job.not_before)
