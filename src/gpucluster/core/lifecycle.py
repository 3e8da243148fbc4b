"""How an attempt ends -> what happens to its job next: the one lifecycle of a job.

Why a pure table: the live head (head/loop.py) applies it to the store and the executor, the
simulator (sim/engine.py) to its virtual clock. Before, each had its own copy of these rules
(and the simulator its own integer-coded states), so a change to one (say, a requeue asked by
the job that backs off) silently made the simulator speak for a different system. Nothing here
reads a clock, a store or a process: callers say how the attempt ended, as data, and get back
what to do, as data. Sentences are made by the callers (the head's event log, the CLI).

How an attempt ends is two facts: the stop the head asked for, if any (`StopReason`, kept in the
store's `jobs.stop_reason`), and how its processes exited (`Exit`). Which stop wins when a
second one is asked while the first is under way is `stop_overrides` (the store applies it in
one conditional UPDATE).

| stop asked           | processes exited        | next                                              |
|----------------------|-------------------------|---------------------------------------------------|
| none / failure       | all 0                   | succeeded                                         |
| preempt (signalled)  | any                     | preempted -> queued, no backoff, work since the   |
|                      |                         | last checkpoint lost (node lost, requeue, resize, |
|                      |                         | idle requeue and shutdown are preemptions)        |
| preempt (not yet     | all 0                   | succeeded (finished before the stop reached it:   |
| signalled)           |                         | no SIGTERM sent yet, or sent into a group whose   |
|                      |                         | command had already ended, as the shim reports)   |
| cancel               | any                     | cancelled                                         |
| time_limit           | any                     | failed: time limit exceeded                       |
| policy               | any                     | failed: the policy's message (max cost, budget,   |
|                      |                         | idle stop, memory share)                          |
| none / failure       | asked to requeue (79)   | preempted -> queued after the first backoff       |
| none / failure       | a process failed/lost   | restarts left: queued, restart n after            |
|                      |                         | restart_backoff(n); else failed (no restarts left)|
| none / failure       | failed for good (an     | failed at once: no restart would help             |
|                      | image that cannot be    |                                                   |
|                      | pulled)                 |                                                   |
| -                    | never started           | queued again (the head died before the launch)    |
| -                    | could not be launched   | failed: could not start                           |

A preempted interactive session is not requeued but ends `cancelled` (the head's
`_requeue_after_preemption`): it would start again as a fresh shell with nobody at its terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from gpucluster.core.restarts import MAX_RESTART_BACKOFF_S, RESTART_BACKOFF_S, restart_backoff
from gpucluster.core.states import JobState


class StopReason(StrEnum):
    """Why the head is stopping a running attempt (stored as `jobs.stop_reason`)."""

    PREEMPT = "preempt"  # to make room, a user's requeue, a lost node, an elastic resize, a shutdown
    FAILURE = "failure"  # one process of the attempt failed: the others are being killed
    CANCEL = "cancel"  # the user cancelled the job
    TIME_LIMIT = "time_limit"  # the job ran past its time limit
    POLICY = "policy"  # max cost, a team's budget, an idle or memory policy stopped it for good


class Exit(Enum):
    """How an attempt's processes ended, as the executor saw them."""

    SUCCESS = "success"  # every process exited 0
    REQUEUE = "requeue"  # the job checkpointed and asked to run again (REQUEUE_EXIT_CODE)
    FAILURE = "failure"  # a process exited non-zero (not REQUEUE_EXIT_CODE), was killed, or was lost
    FATAL = "fatal"  # a process failed in a way no restart would help (an image that cannot be pulled)
    NOT_STARTED = "not_started"  # the processes never started (the head stopped before the launch)
    LAUNCH_ERROR = "launch_error"  # the executor could not start them


class Why(Enum):
    """The code of what happened, for the sentence a caller makes of it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a process failed and the job had no restarts at all, or failed for good
    NO_RESTARTS_LEFT = "no_restarts_left"  # a process failed and every restart is used
    RESTART = "restart"  # a process failed: restart `restart` of `max_restarts` after `backoff_s`
    PREEMPTED = "preempted"  # stopped by a preemption (or a requeue, a lost node, ...)
    ASKED_REQUEUE = "asked_requeue"  # the job asked to be requeued without being asked to stop
    CANCELLED = "cancelled"
    TIME_LIMIT = "time_limit"
    POLICY = "policy"
    NOT_STARTED = "not_started"
    LAUNCH_ERROR = "launch_error"


class AttemptResult(StrEnum):
    """What the attempt's own record says (store `attempts.outcome`)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    NOT_STARTED = "not_started"

    @property
    def loses_work(self) -> bool:
        """Whether such an attempt may have lost the work since its last checkpoint (its record
        carries `work_lost_s`): every end but a success and an attempt that never started."""
        return self not in (AttemptResult.SUCCEEDED, AttemptResult.NOT_STARTED)


@dataclass(frozen=True)
class Next:
    """What happens once an attempt has ended."""

    why: Why
    state: JobState  # where the job ends up: a terminal state, or QUEUED to run again
    attempt: AttemptResult
    via_preempted: bool = False  # passes through PREEMPTED first (the head commits that, then QUEUED)
    restart: int = 0  # with Why.RESTART: which restart this is (1-based; counts against max_restarts)
    backoff_s: float = 0.0  # how long the next attempt waits before it may start (not_before = now + this)

    @property
    def requeued(self) -> bool:
        return self.state is JobState.QUEUED

    @property
    def loses_work(self) -> bool:
        return self.attempt.loses_work


def after_attempt(
    stop: StopReason | None,
    exit: Exit,
    *,
    signalled: bool = True,
    restarts: int = 0,
    max_restarts: int = 0,
    first_backoff_s: float = RESTART_BACKOFF_S,
    max_backoff_s: float = MAX_RESTART_BACKOFF_S,
) -> Next:
    """What happens to a job whose attempt ended so.

    `signalled`: the stop (SIGTERM) had reached the processes before they ended (the head sent
    it and the shim did not report an end before it: head/attempts.py `stop_reached`). A job
    that finished before a preemption reached it succeeded: requeueing it would run finished
    work again; once signalled, the head's intent rules. `restarts`: restarts after failures
    already used; `max_restarts`: the job's limit.
    """
    if exit is Exit.NOT_STARTED:
        return Next(Why.NOT_STARTED, JobState.QUEUED, AttemptResult.NOT_STARTED)
    if exit is Exit.LAUNCH_ERROR:
        return Next(Why.LAUNCH_ERROR, JobState.FAILED, AttemptResult.FAILED)
    if stop is StopReason.PREEMPT and (signalled or exit is not Exit.SUCCESS):
        return Next(Why.PREEMPTED, JobState.QUEUED, AttemptResult.PREEMPTED, via_preempted=True)
    if stop is StopReason.CANCEL:
        return Next(Why.CANCELLED, JobState.CANCELLED, AttemptResult.CANCELLED)
    if stop is StopReason.TIME_LIMIT:
        return Next(Why.TIME_LIMIT, JobState.FAILED, AttemptResult.FAILED)
    if stop is StopReason.POLICY:
        return Next(Why.POLICY, JobState.FAILED, AttemptResult.FAILED)
    if exit is Exit.SUCCESS:
        return Next(Why.SUCCEEDED, JobState.SUCCEEDED, AttemptResult.SUCCEEDED)
    if exit is Exit.REQUEUE:
        return Next(
            Why.ASKED_REQUEUE, JobState.QUEUED, AttemptResult.PREEMPTED, via_preempted=True, backoff_s=first_backoff_s
        )
    if exit is Exit.FATAL:
        return Next(Why.FAILED, JobState.FAILED, AttemptResult.FAILED)
    if restarts >= max_restarts:
        why = Why.NO_RESTARTS_LEFT if max_restarts else Why.FAILED
        return Next(why, JobState.FAILED, AttemptResult.FAILED)
    n = restarts + 1
    return Next(
        Why.RESTART,
        JobState.QUEUED,
        AttemptResult.FAILED,
        restart=n,
        backoff_s=restart_backoff(n, first_backoff_s, max_backoff_s),
    )


@dataclass(frozen=True)
class Override:
    """A stop asked while another is under way replaces it: `keeps_message` says whether the
    earlier stop's message (which names the process that failed) stays."""

    replaces: StopReason
    keeps_message: bool


# Which stop outranks which: none is replaced but by a user's cancel, which must win over a
# preemption under way (the job must not be requeued, but keeps its grace timer) and over a
# failure being handled (the job must not be restarted; the message still names the process
# that failed). A second request never restarts the grace period.
_OVERRIDES: dict[StopReason, tuple[Override, ...]] = {
    StopReason.CANCEL: (Override(StopReason.PREEMPT, keeps_message=False), Override(StopReason.FAILURE, True)),
}


def stop_overrides(new: StopReason) -> tuple[Override, ...]:
    """The stops under way that a request for `new` replaces (none: only a running job with no
    stop under way takes it)."""
    return _OVERRIDES.get(new, ())


def stop_wins(current: StopReason | None, new: StopReason) -> bool:
    """Whether a request for `new` takes effect on a running job whose stop under way is `current`."""
    return current is None or any(o.replaces is current for o in stop_overrides(new))
