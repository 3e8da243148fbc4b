"""The walk's skips (`scheduler._AfterPreemptor.skip_kept`, `skip_same`) asked directly: each
takes off the line only the jobs `pop` would hand out as they are and the cycle would answer
the same way. The plan-level property tests (test_scheduler_plan_only.py,
test_scheduler_attained_fast.py) compare whole plans with and without the skips; these name the
two rules a skip may not break: a job held for its preemptor stays in line, and under LAS a job
of another attained-service queue is not answered by the wait of a job of queue 0."""

from __future__ import annotations

from dataclasses import replace

from gpucluster.core.queueing import TeamQueues
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import _AfterPreemptor
from gpucluster.core.types import JobRequest, Wait

from .builders import job, policy, snapshot, team

NOW = 1000.0
POLICY = policy(team("default"))


def _walk(queued: list[JobRequest], preempted_for: dict[int, int] | None = None) -> _AfterPreemptor:
    snap = replace(snapshot(queued=queued), preempted_for=preempted_for or {})
    return _AfterPreemptor(snap, TeamQueues(snap.queued, POLICY, {}, NOW), NOW)


def _rest(after: _AfterPreemptor) -> list[int]:
    """The job ids the walk still hands out, each put back as not started."""
    out = []
    while (j := after.pop()) is not None:
        out.append(j.job_id)
        after.done(j, False)
    return out


def test_skip_kept_stops_before_a_job_held_for_its_preemptor() -> None:
    """Job 2 was preempted for job 4, which backs off (not to be considered yet): `pop` puts job 2
    aside until the end of the line, after every other job. Though its `need` has an answer,
    `skip_kept` must leave it, and the jobs behind it, in line."""
    jobs = [job(i).build() for i in range(1, 4)]
    preemptor = replace(job(4).build(), not_before=NOW + 60.0)
    after = _walk([*jobs, preemptor], {2: 4})
    first = after.pop()
    assert first is not None and first.job_id == 1
    after.done(first, False)
    after.skip_kept({first.need})  # every job here asks the same
    assert _rest(after) == [3, 2]  # job 3 in turn, job 2 last: its preemptor never came


def test_skip_kept_takes_the_answered_jobs_up_to_another_need() -> None:
    """The rule itself, that the test above guards an exception to: answered jobs next in line
    go, up to the first one whose `need` has no answer."""
    jobs = [job(1).build(), job(2).build(), job(3).gpus(2).build(), job(4).build()]
    after = _walk(jobs)
    first = after.pop()
    assert first is not None
    after.done(first, False)
    after.skip_kept({first.need})
    assert _rest(after) == [3, 4]


def test_skip_same_answers_only_jobs_of_the_same_attained_service_queue() -> None:
    """Under LAS preemption a wait is shared per (request, queue): whom a job may preempt depends
    on its queue (`int(rank)`). Jobs of queue 0 (whatever their Gittins fraction) take the wait
    of an earlier job of queue 0; the first job of queue 1 stops the skip, though it asks the same."""
    jobs = [job(i).build() for i in range(1, 6)]
    ranks = {2: 0.25, 3: 0.75, 4: 1.5}  # job 5 (not named) ranks 0
    after = _walk(jobs)
    first = after.pop()
    assert first is not None and first.job_id == 1
    after.done(first, False)
    wait = Wait(WaitReason.RESOURCES)
    waiting: dict[int, Wait] = {}
    after.skip_same({(first.demand, 0.0): wait}, waiting, ranks)
    assert waiting == {2: wait, 3: wait}
    assert _rest(after) == [4, 5]
