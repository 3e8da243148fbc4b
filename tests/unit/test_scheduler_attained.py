"""Least attained service (issue 25, core/attained.py): the queues, promotion, the rules it runs
inside (classes, fair share, quotas), its preemption and the anti-thrash slice."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gpucluster.core.attained import AGE_ORDER, Ordering, may_be_taken, may_take, rank_of
from gpucluster.core.policy import (
    LAS_STARVATION_AGE_S,
    Policy,
    age_policy,
    fifo_backfill_policy,
    las_gittins_policy,
    las_policy,
)
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Plan, RunningJob
from gpucluster.policyfile import PolicyFileError, load_policy

from .builders import job, node, policy, running, snapshot, team

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"
H = 3600.0
NOW = 100 * H
LAS = Ordering(mode="las", queues=(H, 8 * H), promote_after_s=24 * H, preempt=False)
LAS_PREEMPT = replace(LAS, preempt=True, min_slice_s=1800.0, restart_cost_s=60.0)


def _snap(
    queued: list[JobRequest],
    attained: dict[int, float] | None = None,
    running_jobs: list[RunningJob] | None = None,
    gpus: int = 1,
    usage: dict[str, float] | None = None,
) -> Snapshot:
    s = snapshot(nodes=[node("n1").gpus(gpus)], running=running_jobs or [], queued=queued, usage=usage)
    return replace(s, attained=attained or {})


def _started(plan: Plan) -> list[int]:
    return [s.job_id for s in plan.starts]


def _queued(job_id: int, at: float, team_name: str = "default", priority: str = "normal") -> JobRequest:
    # Entered the queue `at`; `queued_at` so that age counts from there (as a requeued job's).
    return replace(job(job_id).at(at).team(team_name).priority(priority).build(), queued_at=at)


# ---- the queues --------------------------------------------------------------------------------


def test_queue_of_thresholds() -> None:
    assert [LAS.queue_of(x) for x in (0.0, H - 1, H, 8 * H - 1, 8 * H, 1e9)] == [0, 0, 1, 1, 2, 2]
    assert LAS.allowance(0) == H and LAS.allowance(2) == float("inf")


def test_less_attained_goes_first_within_a_team() -> None:
    """One GPU free: the older job has had 10 GPU-hours, the newer none. Age order starts the
    older; LAS, the default since issue 25, the newer."""
    queued = [_queued(1, NOW - 2 * H), _queued(2, NOW - H)]
    attained = {1: 10 * H}
    assert _started(decide(_snap(queued, attained), age_policy(), NOW)) == [1]
    assert _started(decide(_snap(queued, attained), Policy(ordering=LAS), NOW)) == [2]
    assert _started(decide(_snap(queued, attained), Policy(), NOW)) == [2]


def test_same_queue_keeps_age_order() -> None:
    """Attained service is discretised: two jobs in queue 0 (10 and 50 GPU-minutes) go by age."""
    queued = [_queued(1, NOW - 2 * H), _queued(2, NOW - H)]
    assert _started(decide(_snap(queued, {1: 3000.0, 2: 600.0}), Policy(ordering=LAS), NOW)) == [1]


def test_promotion_after_waiting() -> None:
    """A job demoted to the last queue that has waited `promote_after` since it entered the queue
    is back in queue 0, and by age before a newer job there."""
    old = _queued(1, NOW - 25 * H)
    new = _queued(2, NOW - H)
    assert rank_of(old, LAS, {1: 100 * H}, {}, NOW) == 0.0
    assert rank_of(old, replace(LAS, promote_after_s=None), {1: 100 * H}, {}, NOW) == 2.0
    policy_ = Policy(ordering=LAS, starvation_age_s=1000 * H)  # promotion, not the starvation age
    assert _started(decide(_snap([old, new], {1: 100 * H}), policy_, NOW)) == [1]
    never = Policy(ordering=replace(LAS, promote_after_s=None), starvation_age_s=1000 * H)
    assert _started(decide(_snap([old, new], {1: 100 * H}), never, NOW)) == [2]


@pytest.mark.parametrize("make", [las_policy, las_gittins_policy])
def test_a_backlog_of_days_keeps_las_order(make: Callable[[], Policy]) -> None:
    """The built-in `las` policies under a backlog two days old: a job that has had 100 GPU-hours
    and waited 48 h does not go before a fresh job with nothing attained. With the default's
    day as starvation age and promotion, every job past a day went first by age, so in a
    crowded week (Philly days 40-47) LAS was FIFO for most of the queue; a week keeps it LAS."""
    old, new = _queued(1, NOW - 48 * H), _queued(2, NOW - H)
    assert _started(decide(_snap([old, new], {1: 100 * H}), make(), NOW)) == [2]
    # The guard is still there, a week on: the long-waiting job goes first.
    older = _queued(1, NOW - 8 * 24 * H)
    assert _started(decide(_snap([older, new], {1: 100 * H}), make(), NOW)) == [1]


@pytest.mark.parametrize(("name", "make"), [("las", las_policy), ("las-gittins", las_gittins_policy)])
def test_the_example_policy_files_are_the_built_ins(name: str, make: Callable[[], Policy]) -> None:
    """examples/policies/las*.yaml say they are the built-in policies: they load to the same."""
    assert load_policy(EXAMPLES / f"{name}.yaml") == make()


def test_classes_keep_their_order() -> None:
    """A high job with much attained service still goes before a normal one with none."""
    queued = [_queued(1, NOW - H, priority="high"), _queued(2, NOW - H / 2)]
    assert _started(decide(_snap(queued, {1: 50 * H}), Policy(ordering=LAS), NOW)) == [1]


def test_fair_share_between_teams_keeps_its_order() -> None:
    """Team b is far below its share, team a far above: b's job goes first even though it has
    more attained service; LAS orders only inside a team's line."""
    queued = [_queued(1, NOW - 2 * H, "a"), _queued(2, NOW - H, "b")]
    pol = policy(team("a"), team("b"), ordering=LAS)
    snap = _snap(queued, {2: 50 * H}, usage={"a": 1000 * H, "b": 0.0})
    assert _started(decide(snap, pol, NOW)) == [2]


def test_without_fair_share_rank_decides_between_teams() -> None:
    queued = [_queued(1, NOW - 2 * H, "a"), _queued(2, NOW - H, "b")]
    pol = replace(fifo_backfill_policy(), ordering=LAS)
    assert _started(decide(_snap(queued, {1: 50 * H}), pol, NOW)) == [2]
    assert _started(decide(_snap(queued, {1: 50 * H}), fifo_backfill_policy(), NOW)) == [1]


def test_default_ordering_ignores_attained() -> None:
    """Mode `age` (the default) never reads attained service: the plan is the one without it."""
    queued = [_queued(i, NOW - i * 60.0) for i in range(1, 6)]
    attained = {i: i * 10 * H for i in range(1, 6)}
    assert decide(_snap(queued, attained, gpus=2), Policy(), NOW) == decide(_snap(queued, {}, gpus=2), Policy(), NOW)


def test_sjf_orders_by_expected_runtime() -> None:
    """Mode `sjf` (the oracle's, and the seam for a predictor): shortest expected first; a job
    without an expectation goes last."""
    queued = [_queued(1, NOW - 3 * H), _queued(2, NOW - 2 * H), _queued(3, NOW - H)]
    s = replace(_snap(queued), expected_runtime={1: 5 * H, 3: 60.0})
    assert _started(decide(s, Policy(ordering=Ordering(mode="sjf")), NOW)) == [3]


# ---- preemption --------------------------------------------------------------------------------


def _victim(started: float, checkpoint: float | None, priority: str = "normal") -> RunningJob:
    return running(9, "n1", 0, started_at=started, checkpoint=checkpoint, priority=priority)


def _preempted(plan: Plan) -> list[int]:
    return [p.job_id for p in plan.preemptions]


def test_preempts_a_job_in_a_later_queue_that_checkpoints() -> None:
    """The running job has had 3 GPU-hours (queue 1) and checkpointed 5 minutes ago; a new job
    (queue 0) stops it, with a reason that says why."""
    v = _victim(NOW - 3 * H, NOW - 300)
    plan = decide(_snap([_queued(1, NOW - 60)], running_jobs=[v]), Policy(ordering=LAS_PREEMPT), NOW)
    assert _preempted(plan) == [9]
    assert "attained service" in plan.preemptions[0].reason


@pytest.mark.parametrize(
    ("started", "checkpoint", "why"),
    [
        (NOW - 3 * H, None, "never checkpointed: it would lose everything"),
        (NOW - 3 * H, NOW - 2 * H, "loses 2 GPU-hours, more than queue 0's 1 GPU-hour allowance"),
        (NOW - 1200.0, NOW - 300, "within its minimum slice (anti-thrash)"),
        (NOW - 1900.0, NOW - 300, "past its slice but only 0.5 GPU-hours: queue 0, like the asker"),
    ],
)
def test_no_preemption(started: float, checkpoint: float | None, why: str) -> None:
    v = _victim(started, checkpoint)
    plan = decide(_snap([_queued(1, NOW - 60)], running_jobs=[v]), Policy(ordering=LAS_PREEMPT), NOW)
    assert _preempted(plan) == [], why


def test_a_restarted_job_gets_its_slice_again() -> None:
    """A victim restarted 10 minutes ago with 20 GPU-hours from earlier attempts is in the last
    queue, but within its new slice: not preempted again (no thrashing); past it, it is."""
    q = [_queued(1, NOW - 60)]
    fresh = _victim(NOW - 600, NOW - 60)
    assert _preempted(decide(_snap(q, {9: 20 * H}, [fresh]), Policy(ordering=LAS_PREEMPT), NOW)) == []
    later = _victim(NOW - 1900, NOW - 60)
    assert _preempted(decide(_snap(q, {9: 20 * H}, [later]), Policy(ordering=LAS_PREEMPT), NOW)) == [9]


def test_preempt_is_optional_and_needs_preemption_enabled() -> None:
    v = _victim(NOW - 3 * H, NOW - 300)
    q = [_queued(1, NOW - 60)]
    assert _preempted(decide(_snap(q, running_jobs=[v]), Policy(ordering=LAS), NOW)) == []
    off = replace(fifo_backfill_policy(), ordering=LAS_PREEMPT)  # preemption disabled
    assert _preempted(decide(_snap(q, running_jobs=[v]), off, NOW)) == []


def test_never_preempts_a_higher_class() -> None:
    v = _victim(NOW - 3 * H, NOW - 300, priority="high")
    assert _preempted(decide(_snap([_queued(1, NOW - 60)], running_jobs=[v]), Policy(ordering=LAS_PREEMPT), NOW)) == []


def test_quota_guarantee_protects_the_victim() -> None:
    """Team a is within its guaranteed quota: b's job of the same class may not stop a's job for
    attained service (a quota is a guarantee, whatever the ordering)."""
    v = replace(_victim(NOW - 3 * H, NOW - 300), team="a")
    pol = policy(team("a", quota={"H100": 1}), team("b"), ordering=LAS_PREEMPT)
    assert _preempted(decide(_snap([_queued(1, NOW - 60, "b")], running_jobs=[v]), pol, NOW)) == []
    pol_free = policy(team("a"), team("b"), ordering=LAS_PREEMPT)
    assert _preempted(decide(_snap([_queued(1, NOW - 60, "b")], running_jobs=[v]), pol_free, NOW)) == [9]


def test_may_take_counts_gpus_in_the_loss() -> None:
    """An 8-GPU victim 10 minutes past its checkpoint loses 8 x 11 GPU-minutes: over 1 GPU-hour."""
    big = RunningJob(9, running(9, "n1", *range(8)).allocation, started_at=NOW - 3 * H, last_checkpoint_at=NOW - 600)
    assert not may_take(0.0, big, LAS_PREEMPT, {}, NOW)
    assert may_take(1.0, big, LAS_PREEMPT, {}, NOW)  # queue 1's allowance: 8 GPU-hours


# ---- the policy file ---------------------------------------------------------------------------


def test_policy_file_ordering(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("ordering: {mode: las, queues: [30m, 4h], promote_after: 12h, preempt: true, min_slice: 10m}\n")
    o = load_policy(f).ordering
    assert o == Ordering(mode="las", queues=(1800.0, 4 * H), promote_after_s=12 * H, preempt=True, min_slice_s=600.0)
    f.write_text("ordering: {runtime_model: gittins, relearn_every: 1h}\n")
    assert load_policy(f).ordering == Ordering(runtime_model="gittins", relearn_every_s=H)
    f.write_text("ordering: {runtime_model: gittins, relearn_every: 0s}\n")
    assert load_policy(f).ordering.relearn_every_s == 0.0  # at every plan


@pytest.mark.parametrize(
    ("text", "ordering", "starvation_age_s"),
    [
        # what no file means: las with its preemption and a week's ages (issue 25's default)
        ("", Ordering(), LAS_STARVATION_AGE_S),
        ("priorities: true\n", las_policy().ordering, LAS_STARVATION_AGE_S),
        # a file that switches preemption off still loads: las order, no las preemption
        ("preemption: {enabled: false}\n", replace(Ordering(), preempt=False), LAS_STARVATION_AGE_S),
        # the old order back, with its day
        ("ordering: {mode: age}\n", AGE_ORDER, 86400.0),
        ("ordering: {mode: age}\nstarvation_age: 3d\n", AGE_ORDER, 3 * 86400.0),
        ("starvation_age: 2h\n", Ordering(), 2 * H),
    ],
)
def test_policy_file_defaults_follow_the_ordering(
    tmp_path: Path, text: str, ordering: Ordering, starvation_age_s: float
) -> None:
    """What a policy file leaves out means the default: `las` since issue 25. Its preemption
    follows `preemption.enabled` unless the file says, and the starvation age is the mode's."""
    f = tmp_path / "p.yaml"
    f.write_text(text)
    got = load_policy(f)
    assert (got.ordering, got.starvation_age_s) == (ordering, starvation_age_s)
    if not text:
        assert got == Policy() == las_policy()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("ordering: {mode: las, queues: [8h, 1h]}\n", "ascending"),
        ("ordering: {mode: fastest}\n", "mode"),
        ("ordering: {mode: las, preempt: true}\npreemption: {enabled: false}\n", "preemption.enabled"),
        ("ordering: {runtime_model: gittins, relearn_every: -5m}\n", "relearn_every: cannot read"),
        ("ordering: {runtime_model: gittins, relearn_every: soon}\n", "relearn_every"),
    ],
)
def test_policy_file_ordering_errors(tmp_path: Path, text: str, words: str) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(PolicyFileError, match=words):
        load_policy(f)


# ---- the head supplies attained service --------------------------------------------------------


def test_the_head_reads_attained_service_from_attempt_rows(tmp_path: Path) -> None:
    """A low job runs 100 s on 8 GPUs and is preempted: its ended attempt is 800 GPU-seconds, the
    head's snapshot carries it under an attained-service policy (the default), and nothing under
    age ordering."""
    from gpucluster.core.states import JobState
    from gpucluster.executors.base import Exited
    from gpucluster.head.policy_source import PolicySource

    from .headkit import T0, make_cluster

    path = tmp_path / "policy.yaml"
    path.write_text("ordering: {mode: las}\n")
    c = make_cluster(tmp_path, policy=PolicySource(path))
    try:
        low = c.submit(gpus=8, priority="low")
        c.tick_at(T0)
        high = c.submit(gpus=8, priority="high")
        c.tick_at(T0 + 100)  # plans the preemption
        c.tick_at(T0 + 101)  # SIGTERM
        c.proc(low).status = Exited(143, 15)
        c.tick_at(T0 + 102)
        assert c.state(low) is JobState.QUEUED and c.state(high) is JobState.RUNNING
        (attempt,) = c.store.attempts(low)
        assert attempt.started_at is not None
        expected = 8 * (attempt.ended_at - attempt.started_at)
        assert expected > 0
        assert c.store.attained_gpu_seconds() == {low: expected}
        assert c.head.snapshot().attained == {low: expected}
        path.write_text("ordering: {mode: age}\n")
        later = path.stat().st_mtime + 10  # the head reloads on a new mtime: make sure it is one
        os.utime(path, (later, later))
        c.tick_at(T0 + 200)  # the head reloads the file
        assert c.head.snapshot().attained == {}
    finally:
        c.close()


def test_never_takes_from_a_team_further_below_its_share() -> None:
    """LAS preemption must not move GPUs from a team that has had less than its share to one that
    has had more: b's job (b far over its share) may not stop a's; a's job may stop b's."""
    pol = policy(team("a"), team("b"), ordering=LAS_PREEMPT)
    usage = {"a": 0.0, "b": 1000 * H}
    a_runs = replace(_victim(NOW - 3 * H, NOW - 300), team="a")
    assert _preempted(decide(_snap([_queued(1, NOW - 60, "b")], running_jobs=[a_runs], usage=usage), pol, NOW)) == []
    b_runs = replace(_victim(NOW - 3 * H, NOW - 300), team="b")
    assert _preempted(decide(_snap([_queued(1, NOW - 60, "a")], running_jobs=[b_runs], usage=usage), pol, NOW)) == [9]


@pytest.mark.parametrize("started", [NOW - 600, NOW - 1900, NOW - 3 * H, NOW - 30 * H])
@pytest.mark.parametrize("checkpoint_ago", [None, 60.0, 900.0, 3 * H])
@pytest.mark.parametrize("before", [0.0, 2 * H, 20 * H])
def test_the_full_cluster_shortcut_is_exact(started: float, checkpoint_ago: float | None, before: float) -> None:
    """`may_be_taken` (the check that lets a full cluster skip ordering its queue) is true
    whenever some asker's rank would `may_take` the job."""
    ckpt = None if checkpoint_ago is None else NOW - checkpoint_ago
    v = _victim(started, ckpt)
    attained = {9: before}
    any_asker = any(may_take(float(r), v, LAS_PREEMPT, attained, NOW) for r in range(len(LAS_PREEMPT.queues) + 1))
    assert may_be_taken(v, LAS_PREEMPT, attained, NOW) == any_asker


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            None,
            "order in a team's line: las (least GPU-time first; queues at 1h, 8h of GPU-time; promoted after "
            "7d waiting; stops checkpointed jobs of a later queue after 30m); starvation age 7d",
        ),
        ("ordering: {mode: age}\n", "order in a team's line: age (oldest first); starvation age 1d"),
        (
            "preemption: {enabled: false}\nordering: {promote_after: null, runtime_model: gittins}\n",
            "order in a team's line: las (least GPU-time first; queues at 1h, 8h of GPU-time; never promoted; "
            "by learned run times inside a queue, relearned every 10m); starvation age 7d",
        ),
    ],
)
def test_the_head_says_the_ordering_in_force(tmp_path: Path, text: str | None, line: str) -> None:
    """GET /v1/policy and `policy show` say the order inside a team's line: with `las` the
    default, an admin must see why a newer job went first, and whether a job may be stopped for
    one of its own class (only with preemption on)."""
    from gpucluster.cli.main import _ordering_line
    from gpucluster.head.policy_source import PolicySource

    from .headkit import api_client, make_cluster

    source = None
    if text is not None:
        path = tmp_path / "policy.yaml"
        path.write_text(text)
        source = PolicySource(path)
    c = make_cluster(tmp_path, policy=source) if source is not None else make_cluster(tmp_path)
    try:
        got = api_client(c.service, "admin").get("/v1/policy").json()
        assert _ordering_line(got["ordering"], got["starvation_age_s"]) == line
    finally:
        c.close()


def test_an_answer_kept_across_a_start_is_kept_per_queue() -> None:
    """Answers kept across starts (`_Cycle.run`'s `kept`, plan-only cycles) are per request and
    attained-service queue. Job 1 holds model A (node n1) for its 8 GPUs. Job 2 (queue 0), 4 GPUs
    of any model, is held off n1 by that reservation and may not take job 9 on n2 (its loss,
    4 x ~2,060 GPU-s, is over queue 0's allowance): it waits behind job 1, adding nothing to the
    plan. Job 3 (short) starts on n1 before job 1's reservation (backfill). Job 4 asks what job 2 asked but
    is in queue 1 (2 GPU-hours had): job 9 (queue 2) is within its allowance, so it preempts it
    rather than take job 2's answer (keyed by the request alone, it waited)."""
    nodes = [node("n1").gpus(8, model="A"), node("n2").gpus(8, model="B")]
    run = [
        running(8, "n1", 4, 5, 6, 7, started_at=NOW - 3 * H, limit=10 * H),
        running(9, "n2", 0, 1, 2, 3, started_at=NOW - 3 * H, checkpoint=NOW - 2000.0),
        running(10, "n2", 4, 5, 6, 7, started_at=NOW - 3 * H),
    ]
    queued = [
        job(1).at(NOW - 4 * H).gpus(8).gpu_types("A").build(),
        job(2).at(NOW - 3 * H).gpus(4).limit(20 * H).build(),
        job(3).at(NOW - 2 * H).gpus(1).limit(60.0).build(),
        replace(job(4).at(NOW - H).gpus(4).limit(20 * H).build(), queued_at=NOW - H),
    ]
    snap = replace(snapshot(nodes=nodes, running=run, queued=queued), attained={4: 2 * H})
    plan = decide(snap, Policy(ordering=LAS_PREEMPT, backfill=True), NOW, reasons=False)
    assert _started(plan) == [3]
    assert [(p.job_id, p.for_job) for p in plan.preemptions] == [(9, 4)]
