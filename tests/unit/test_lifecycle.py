"""core/lifecycle.py: the one table from how an attempt ended to what happens next, which the
head (head/loop.py) and the simulator (sim/engine.py) both apply."""

from __future__ import annotations

import itertools

import pytest

from gpucluster.core.lifecycle import (
    AttemptResult,
    Exit,
    StopReason,
    Why,
    after_attempt,
    stop_overrides,
    stop_wins,
)
from gpucluster.core.restarts import MAX_RESTART_BACKOFF_S, restart_backoff
from gpucluster.core.states import TERMINAL_STATES, JobState, can_transition
from gpucluster.executors.base import Exited, Lost, Status
from gpucluster.head.attempts import stop_reached

PROCESS_ENDS = (Exit.SUCCESS, Exit.REQUEUE, Exit.FAILURE)

# (stop asked, how the processes exited, signalled) -> (why, state, attempt record, via preempted)
TABLE = {
    (None, Exit.SUCCESS, False): (Why.SUCCEEDED, JobState.SUCCEEDED, AttemptResult.SUCCEEDED, False),
    (StopReason.PREEMPT, Exit.SUCCESS, True): (Why.PREEMPTED, JobState.QUEUED, AttemptResult.PREEMPTED, True),
    (StopReason.PREEMPT, Exit.SUCCESS, False): (Why.SUCCEEDED, JobState.SUCCEEDED, AttemptResult.SUCCEEDED, False),
    (StopReason.PREEMPT, Exit.REQUEUE, False): (Why.PREEMPTED, JobState.QUEUED, AttemptResult.PREEMPTED, True),
    (StopReason.PREEMPT, Exit.FAILURE, True): (Why.PREEMPTED, JobState.QUEUED, AttemptResult.PREEMPTED, True),
    (StopReason.CANCEL, Exit.SUCCESS, True): (Why.CANCELLED, JobState.CANCELLED, AttemptResult.CANCELLED, False),
    (StopReason.CANCEL, Exit.FAILURE, True): (Why.CANCELLED, JobState.CANCELLED, AttemptResult.CANCELLED, False),
    (StopReason.TIME_LIMIT, Exit.FAILURE, True): (Why.TIME_LIMIT, JobState.FAILED, AttemptResult.FAILED, False),
    (StopReason.TIME_LIMIT, Exit.SUCCESS, False): (Why.TIME_LIMIT, JobState.FAILED, AttemptResult.FAILED, False),
    (StopReason.POLICY, Exit.REQUEUE, True): (Why.POLICY, JobState.FAILED, AttemptResult.FAILED, False),
    (None, Exit.REQUEUE, False): (Why.ASKED_REQUEUE, JobState.QUEUED, AttemptResult.PREEMPTED, True),
    (None, Exit.NOT_STARTED, False): (Why.NOT_STARTED, JobState.QUEUED, AttemptResult.NOT_STARTED, False),
    (None, Exit.LAUNCH_ERROR, False): (Why.LAUNCH_ERROR, JobState.FAILED, AttemptResult.FAILED, False),
    # restarts left (0 of 3 used), but no restart would help (an image that cannot be pulled)
    (None, Exit.FATAL, False): (Why.FAILED, JobState.FAILED, AttemptResult.FAILED, False),
    (StopReason.PREEMPT, Exit.FATAL, True): (Why.PREEMPTED, JobState.QUEUED, AttemptResult.PREEMPTED, True),
}


@pytest.mark.parametrize(("ended", "expected"), list(TABLE.items()), ids=lambda v: str(v))
def test_the_table(
    ended: tuple[StopReason | None, Exit, bool], expected: tuple[Why, JobState, AttemptResult, bool]
) -> None:
    stop, exit, signalled = ended
    after = after_attempt(stop, exit, signalled=signalled, restarts=0, max_restarts=3)
    assert (after.why, after.state, after.attempt, after.via_preempted) == expected


def test_a_requeue_the_job_asked_for_waits_the_first_backoff_and_uses_no_restart() -> None:
    after = after_attempt(None, Exit.REQUEUE, signalled=False, restarts=2, max_restarts=2, first_backoff_s=7.0)
    assert after.why is Why.ASKED_REQUEUE and after.backoff_s == 7.0 and after.restart == 0


def test_a_preemption_requeues_at_once() -> None:
    after = after_attempt(StopReason.PREEMPT, Exit.FAILURE, restarts=5, max_restarts=1)
    assert after.requeued and after.backoff_s == 0.0 and after.restart == 0 and after.loses_work


@pytest.mark.parametrize("stop", [None, StopReason.FAILURE])
def test_failures_restart_with_a_doubling_backoff_until_none_is_left(stop: StopReason | None) -> None:
    seen = []
    for used in range(4):
        after = after_attempt(stop, Exit.FAILURE, restarts=used, max_restarts=3, first_backoff_s=2.0)
        seen.append((after.why, after.state, after.restart, after.backoff_s))
    assert seen == [
        (Why.RESTART, JobState.QUEUED, 1, 2.0),
        (Why.RESTART, JobState.QUEUED, 2, 4.0),
        (Why.RESTART, JobState.QUEUED, 3, 8.0),
        (Why.NO_RESTARTS_LEFT, JobState.FAILED, 0, 0.0),
    ]
    never = after_attempt(stop, Exit.FAILURE, restarts=0, max_restarts=0)
    assert (never.why, never.state) == (Why.FAILED, JobState.FAILED)


def test_the_backoff_is_the_restart_rule() -> None:
    for n in range(1, 40):
        after = after_attempt(None, Exit.FAILURE, restarts=n - 1, max_restarts=100)
        assert after.backoff_s == restart_backoff(n) <= MAX_RESTART_BACKOFF_S


def test_every_end_is_a_transition_the_store_allows() -> None:
    """Whatever the inputs, the next state is reachable from RUNNING (through PREEMPTED when the
    lifecycle says so), and only a requeue is not terminal."""
    stops: list[StopReason | None] = [None, *StopReason]
    for stop, exit, signalled in itertools.product(stops, list(Exit), (False, True)):
        for used, limit in ((0, 0), (0, 2), (2, 2)):
            after = after_attempt(stop, exit, signalled=signalled, restarts=used, max_restarts=limit)
            if after.via_preempted:
                assert can_transition(JobState.RUNNING, JobState.PREEMPTED)
                assert can_transition(JobState.PREEMPTED, after.state)
            else:
                assert can_transition(JobState.RUNNING, after.state)
            assert (after.state in TERMINAL_STATES) != after.requeued
            assert after.loses_work == (after.attempt not in (AttemptResult.SUCCEEDED, AttemptResult.NOT_STARTED))
            assert after.restart == 0 or after.why is Why.RESTART


def test_which_stop_wins() -> None:
    """Only a cancel replaces a stop under way: a preemption's (it must not be requeued) and a
    failure's (it must not be restarted, and keeps the message naming the failed process)."""
    for new in StopReason:
        assert stop_wins(None, new)
    for current, new in itertools.product(StopReason, StopReason):
        expected = new is StopReason.CANCEL and current in (StopReason.PREEMPT, StopReason.FAILURE)
        assert stop_wins(current, new) == expected, (current, new)
    keeps = {o.replaces: o.keeps_message for o in stop_overrides(StopReason.CANCEL)}
    assert keeps == {StopReason.PREEMPT: False, StopReason.FAILURE: True}


# ---- signalled: did the stop reach the attempt before it ended (head/attempts.stop_reached) ----

ON_ITS_OWN = Exited(0, stopped=False)  # the shim: the command ended before any stop reached it
STOPPED = Exited(143, 15, stopped=True)
UNSAID = Exited(0)  # a record from before the shim said it


@pytest.mark.parametrize(
    ("term_sent", "statuses", "signalled"),
    [
        (False, [STOPPED], False),  # no SIGTERM from the head: whatever ended it, not the head's stop
        (True, [ON_ITS_OWN], False),  # the SIGTERM landed in an empty process group
        (True, [ON_ITS_OWN, ON_ITS_OWN], False),
        (True, [STOPPED], True),
        (True, [ON_ITS_OWN, STOPPED], True),  # one rank was still running when the stop came
        (True, [UNSAID], True),  # not known: the head's intent rules, as before
        (True, [ON_ITS_OWN, Lost("gone")], True),
        (True, [], True),
    ],
)
def test_a_stop_reaches_an_attempt_only_if_a_process_was_still_running_for_it(
    term_sent: bool, statuses: list[Status], signalled: bool
) -> None:
    assert stop_reached(term_sent, statuses) is signalled


def test_a_preempted_job_whose_command_exited_0_before_the_sigterm_landed_succeeded() -> None:
    """The race test_crash_consistency.py found: the head sent SIGTERM to a job that had just
    exited 0 by itself; it must succeed, not be requeued to run finished work again."""
    ended = [ON_ITS_OWN]
    after = after_attempt(StopReason.PREEMPT, Exit.SUCCESS, signalled=stop_reached(True, ended))
    assert after.why is Why.SUCCEEDED and after.state is JobState.SUCCEEDED
    stopped = after_attempt(StopReason.PREEMPT, Exit.SUCCESS, signalled=stop_reached(True, [Exited(0, stopped=True)]))
    assert stopped.why is Why.PREEMPTED and stopped.requeued
