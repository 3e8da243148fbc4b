"""Per-user and per-class limits (core/limits.py, issue 16): what `decide` lets a user start, why
the rest wait, and when they may start; plus the property that no user ever runs beyond a limit
over random histories, and the submit-time rule for queued jobs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.limits import queued_refusal, within_limits
from gpucluster.core.policy import Limit, Limits, Policy, Preemption
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.types import JobRequest, Priority, RunningJob
from gpucluster.waits_text import sentence

from .builders import job, node, policy, running, snapshot
from .cycles import Cycles

NOW = 100_000.0
HOUR = 3600.0


def mine(b: object, user: str) -> JobRequest:
    """A built job of `user` (the builders know no users)."""
    built = b.build() if hasattr(b, "build") else b  # type: ignore[attr-defined]
    assert isinstance(built, JobRequest)
    return replace(built, user=user)


def run_by(r: RunningJob, user: str) -> RunningJob:
    return replace(r, user=user)


def limited(per_user: Limit | None = None, **kw: object) -> Policy:
    return policy(limits=Limits(per_user=per_user or Limit(), **kw))  # type: ignore[arg-type]


def started(plan: object) -> set[int]:
    return {s.job_id for s in plan.starts}  # type: ignore[attr-defined]


NODES = [node("n1").gpus(8), node("n2").gpus(8)]


def test_a_user_at_the_gpu_limit_waits_while_a_teammate_starts() -> None:
    alice_runs = run_by(running(1, "n1", 0, 1, 2, 3, 4, 5, started_at=NOW - 600, limit=HOUR), "alice")
    snap = snapshot(
        NODES,
        [alice_runs],
        [mine(job(10).gpus(4).at(NOW - 60), "alice"), mine(job(11).gpus(4).at(NOW - 30), "bob")],
    )
    plan = decide(snap, limited(Limit(max_running_gpus=8)), NOW)
    assert started(plan) == {11}
    wait = plan.waiting[10]
    assert wait.reason is WaitReason.USER_GPUS
    assert "alice runs 6 GPUs, the per-user limit (limits.per_user.max_running_gpus) is 8" in sentence(wait)
    assert "this job asks 4" in sentence(wait)
    # when alice's running job ends (its time limit), 6 GPUs come back and 4 fit
    assert wait.estimated_start == pytest.approx(NOW - 600 + HOUR)


def test_several_jobs_of_one_user_start_in_one_cycle_only_up_to_the_limit() -> None:
    queued = [mine(job(i).gpus(4), "alice") for i in (1, 2, 3)]
    plan = decide(snapshot(NODES, [], queued), limited(Limit(max_running_gpus=8)), NOW)
    assert started(plan) == {1, 2}
    assert plan.waiting[3].reason is WaitReason.USER_GPUS
    assert "alice runs 0 GPUs and 8 more are ahead in line" in sentence(plan.waiting[3])
    assert plan.waiting[3].estimated_start is None  # the jobs ahead have not started: no end known


def test_a_named_user_overrides_the_default_field_by_field() -> None:
    limits = Limits(per_user=Limit(max_running_gpus=4, max_queued_jobs=7), users={"alice": Limit(max_running_gpus=12)})
    queued = [mine(job(i).gpus(4), "alice") for i in (1, 2, 3, 4)] + [mine(job(i).gpus(4), "bob") for i in (5, 6)]
    plan = decide(snapshot([*NODES, node("n3").gpus(8)], [], queued), policy(limits=limits), NOW)
    assert started(plan) == {1, 2, 3, 5}
    assert "(limits.users.alice.max_running_gpus) is 12" in sentence(plan.waiting[4])
    assert "(limits.per_user.max_running_gpus) is 4" in sentence(plan.waiting[6])
    assert limits.of_user("alice", "max_queued_jobs") == (7, "limits.per_user.max_queued_jobs")


def test_a_per_class_limit_holds_each_users_jobs_of_that_class() -> None:
    limits = Limits(per_class={Priority.HIGH: Limit(max_running_gpus=4)})
    queued = [
        mine(job(1).gpus(4).priority("high"), "alice"),
        mine(job(2).gpus(4).priority("high"), "alice"),
        mine(job(3).gpus(4), "alice"),
        mine(job(4).gpus(4).priority("high"), "bob"),
    ]
    plan = decide(snapshot(NODES, [], queued), policy(limits=limits), NOW)
    assert started(plan) == {1, 3, 4}
    assert plan.waiting[2].reason is WaitReason.CLASS_GPUS
    assert "(limits.per_class.high.max_running_gpus) is 4" in sentence(plan.waiting[2])


def test_gpu_hours_in_flight_count_gpus_times_the_time_limit_left() -> None:
    # 4 GPUs with 1.5 h left: 6 GPU-hours in flight; 8 GPUs for 1 h would make 14 > 10.
    alice_runs = run_by(running(1, "n1", 0, 1, 2, 3, started_at=NOW - 1800, limit=2 * HOUR), "alice")
    snap = snapshot(NODES, [alice_runs], [mine(job(2).gpus(8).limit(HOUR), "alice")])
    plan = decide(snap, limited(Limit(max_gpu_hours_in_flight=10)), NOW)
    assert not plan.starts
    wait = plan.waiting[2]
    assert wait.reason is WaitReason.USER_GPU_HOURS
    assert "alice has 6.0 GPU-hours in flight" in sentence(wait) and "this job adds 8.0" in sentence(wait)
    # in flight falls 4 GPU-hours per hour: down to 2 (10 - 8) one hour from now
    assert wait.estimated_start == pytest.approx(NOW + HOUR)
    # a job of 4 GPU-hours fits exactly
    snap = snapshot(NODES, [alice_runs], [mine(job(3).gpus(4).limit(HOUR), "alice")])
    assert started(decide(snap, limited(Limit(max_gpu_hours_in_flight=10)), NOW)) == {3}


def test_a_job_without_a_time_limit_counts_the_default_limit_in_full_and_gives_no_estimate() -> None:
    # running for 5 hours already, without a limit: still 2 GPUs x the default hour
    forever = run_by(running(1, "n1", 0, 1, started_at=NOW - 5 * HOUR), "alice")
    snap = snapshot(NODES, [forever], [mine(job(2).gpus(1).limit(HOUR), "alice")])
    limits = Limits(per_user=Limit(max_gpu_hours_in_flight=2.5))
    plan = decide(snap, policy(limits=limits, default_time_limit_s=HOUR), NOW)
    assert plan.waiting[2].reason is WaitReason.USER_GPU_HOURS
    assert "alice has 2.0 GPU-hours in flight" in sentence(plan.waiting[2])
    assert plan.waiting[2].estimated_start is None


def test_a_job_larger_than_the_limit_says_it_can_never_start() -> None:
    plan = decide(snapshot(NODES, [], [mine(job(1).gpus(16), "alice")]), limited(Limit(max_running_gpus=8)), NOW)
    assert "can never start under this limit" in sentence(plan.waiting[1])
    assert plan.waiting[1].estimated_start is None


def test_a_job_at_a_limit_takes_no_reservation_and_blocks_no_one() -> None:
    # Without backfill a first-in-line job that cannot start holds everyone behind it; alice's
    # 8-GPU job is first in line (high) but at her limit, so bob's job starts.
    alice_runs = run_by(running(1, "n1", 0, 1, 2, 3, limit=HOUR, started_at=NOW), "alice")
    queued = [mine(job(2).gpus(8).priority("high"), "alice"), mine(job(3).gpus(2), "bob")]
    one_node = [node("n1").gpus(8)]
    strict = replace(limited(Limit(max_running_gpus=8)), backfill=False, preemption=Preemption(enabled=False))
    plan = decide(snapshot(one_node, [alice_runs], queued), strict, NOW)
    assert started(plan) == {3}
    assert plan.waiting[2].reason is WaitReason.USER_GPUS
    # the same state without limits: alice's job is first in line and holds bob's back
    plan = decide(snapshot(one_node, [alice_runs], queued), replace(strict, limits=Limits()), NOW)
    assert not plan.starts and plan.waiting[3].reason is WaitReason.BEHIND_RESERVATION


@pytest.mark.parametrize("reasons", [True, False])
def test_equal_jobs_of_two_users_are_never_answered_for_each_other(reasons: bool) -> None:
    """The cycle answers equal requests once (`JobRequest.demand`, `need`): the user is no part
    of them, so a job at its user's limit must never reach the cycle, in either mode."""
    alice_runs = run_by(running(1, "n1", 0, 1, 2, 3, limit=HOUR, started_at=NOW), "alice")
    queued = [mine(job(i).gpus(2).at(i), "alice" if i % 2 else "bob") for i in range(2, 10)]
    pol = policy(limits=Limits(per_user=Limit(max_running_gpus=4), users={"bob": Limit(max_running_gpus=8)}))
    plan = decide(snapshot(NODES, [alice_runs], queued), pol, NOW, reasons=reasons)
    assert started(plan) == {2, 4, 6, 8}  # bob's: 8 GPUs; alice's all wait on her limit
    assert all(plan.waiting[i].reason is WaitReason.USER_GPUS for i in (3, 5, 7, 9))


def test_an_elastic_job_starts_at_the_largest_size_its_user_may_run() -> None:
    elastic = replace(mine(job(1).gpus(8), "alice"), min_gpus=2)
    plan = decide(snapshot(NODES, [], [elastic]), limited(Limit(max_running_gpus=6)), NOW)
    assert [s.allocation.gpu_count for s in plan.starts] == [6]


def test_jobs_without_a_user_and_jobs_backing_off_are_not_limited() -> None:
    anon = job(1).gpus(8).build()
    backing_off = replace(mine(job(2).gpus(8), "alice"), not_before=NOW + 60)
    snap, waits = within_limits(
        snapshot(NODES, [], [anon, backing_off, mine(job(3).gpus(8), "alice")]),
        limited(Limit(max_running_gpus=8)),
        NOW,
    )
    assert waits == {} and [j.job_id for j in snap.queued] == [1, 2, 3] and snap.limited


def test_limits_are_applied_once_and_then_change_nothing() -> None:
    queued = [mine(job(i).gpus(4), "alice") for i in (1, 2, 3)]
    pol = limited(Limit(max_running_gpus=8))
    once, waits = within_limits(snapshot(NODES, [], queued), pol, NOW)
    assert set(waits) == {3}
    twice, again = within_limits(replace(once, limited=False), pol, NOW)
    assert again == {} and twice.queued == once.queued
    # the head applies them where it builds its snapshot; decide then leaves the queue as it is
    assert started(decide(once, pol, NOW)) == {1, 2}


def test_no_limits_leave_the_snapshot_untouched() -> None:
    snap = snapshot(NODES, [], [mine(job(1).gpus(4), "alice")])
    assert within_limits(snap, Policy(), NOW) == (snap, {})


# ---- queued jobs, at submit ----------------------------------------------------------------------


def test_queued_refusal_names_the_limit_the_count_and_what_to_do() -> None:
    limits = Limits(per_user=Limit(max_queued_jobs=3), per_class={Priority.HIGH: Limit(max_queued_jobs=1)})
    assert queued_refusal(limits, "alice", Priority.NORMAL, 2, 2, 1) is None
    why = queued_refusal(limits, "alice", Priority.NORMAL, 2, 2, 2)  # an array of 2
    assert why is not None
    assert "alice has 2 jobs queued, the per-user limit (limits.per_user.max_queued_jobs) is 3" in why
    assert "this submission adds 2" in why and "gpucluster cancel" in why
    why = queued_refusal(limits, "alice", Priority.HIGH, 1, 1, 1)
    assert why is not None and "1 job of class high queued" in why and "limits.per_class.high.max_queued_jobs" in why


# ---- the property: no user ever runs beyond a limit -------------------------------------------------

USERS = ("ann", "ben", "cat")


@st.composite
def histories(draw: st.DrawFn) -> tuple[Limits, list[JobRequest], dict[int, float]]:
    def limit() -> Limit:
        return Limit(
            max_running_gpus=draw(st.sampled_from([None, 1, 2, 4, 6, 8])),
            max_gpu_hours_in_flight=draw(st.sampled_from([None, 2.0, 5.0, 12.0])),
        )

    limits = Limits(
        per_user=limit(),
        users={u: limit() for u in draw(st.lists(st.sampled_from(USERS), max_size=2, unique=True))},
        per_class={p: limit() for p in draw(st.lists(st.sampled_from(list(Priority)), max_size=2, unique=True))},
    )
    jobs: list[JobRequest] = []
    runtime: dict[int, float] = {}
    for i in range(1, draw(st.integers(1, 25)) + 1):
        gpus = draw(st.sampled_from([0.5, 1, 1, 2, 4, 8]))
        j = JobRequest(
            i,
            float(gpus),
            priority=draw(st.sampled_from(list(Priority))),
            submitted_at=draw(st.floats(0, 4 * HOUR)),
            team=draw(st.sampled_from(["a", "b"])),
            time_limit_s=draw(st.sampled_from([None, 600.0, HOUR, 3 * HOUR])),
            min_gpus=1 if gpus >= 2 and draw(st.booleans()) else None,
            user=draw(st.sampled_from(USERS)),
        )
        jobs.append(j)
        runtime[i] = draw(st.floats(60, 4 * HOUR))
    return limits, jobs, runtime


History = tuple[Limits, list[JobRequest], dict[int, float]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.booleans())
def test_no_user_ever_runs_beyond_a_limit(history: History, pre: bool) -> None:
    limits, jobs, runtime = history
    pol = Policy(limits=limits, preemption=Preemption(enabled=pre, grace_period_s=30), default_time_limit_s=HOUR)
    c = Cycles((node("n1").gpus(8).build(), node("n2").gpus(4).build()), pol, jobs, runtime=runtime)
    requests = {j.job_id: j for j in jobs}
    for _ in range(150):
        c.cycle()
        gpus: dict[tuple[str, Priority | None], float] = defaultdict(float)
        hours: dict[tuple[str, Priority | None], float] = defaultdict(float)
        for r in c.running.values():
            user = requests[r.job_id].user
            assert r.user == user
            left = pol.default_time_limit_s if not r.time_limit_s else max(0.0, r.started_at + r.time_limit_s - c.now)
            for key in ((user, None), (user, r.priority)):
                gpus[key] += r.allocation.gpu_count
                hours[key] += r.allocation.gpu_count * left / HOUR
        for (user, cls), held in gpus.items():
            got = limits.of_user(user, "max_running_gpus") if cls is None else limits.of_class(cls, "max_running_gpus")
            assert got is None or held <= got[0] + 1e-9, (user, cls, held, got)
            got = (
                limits.of_user(user, "max_gpu_hours_in_flight")
                if cls is None
                else limits.of_class(cls, "max_gpu_hours_in_flight")
            )
            assert got is None or hours[(user, cls)] <= got[0] + 1e-6, (user, cls, hours[(user, cls)], got)
        if not c.queued and not c.arrivals and not c.running:
            break
        c.advance(600.0)
