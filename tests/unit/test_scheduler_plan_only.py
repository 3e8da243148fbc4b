"""`decide(..., reasons=False)`, the simulator's cycle, against the full one: the same starts and
preemptions, in the same order, on random snapshots, above all crowded ones (a loaded cluster,
long queues, many jobs that cannot start), where the plan-only cycle stops early or never orders
the queue at all. Any job it names waits for the reason the full cycle gives it."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.attained import Ordering
from gpucluster.core.policy import Policy, fifo_policy
from gpucluster.core.queueing import sort_in, sort_in_plain
from gpucluster.core.reasons import NO_FACTS
from gpucluster.core.scheduler import _AfterPreemptor, _Cycle, certainly_idle, decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node, NodeSlice, Plan, Priority, RunningJob

from .builders import job, node
from .test_scheduler_properties import MODELS, NOW, TEAMS, nodes, policies, repetitive, requests, scenarios

# 100 random crowded states per property on every run (each run draws new ones); ~15 s each on
# this 2-core machine, where 300 took ~45 s and these 7 tests were the suite's largest unit cost.
# A deeper search before changing the plan-only cycle: GPUCLUSTER_PLAN_ONLY_EXAMPLES=1000.
EXAMPLES = int(os.environ.get("GPUCLUSTER_PLAN_ONLY_EXAMPLES", "100"))
MANY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same_plan(snap: Snapshot, policy: Policy) -> None:
    full = decide(snap, policy, now=NOW)
    fast = decide(snap, policy, now=NOW, reasons=False)
    assert fast.starts == full.starts
    assert fast.preemptions == full.preemptions
    for job_id, wait in fast.waiting.items():
        # Without reasons a wait for busy GPUs or a reservation is not worded; the rest is the same.
        whole = full.waiting[job_id]
        assert (wait.reason, wait.estimated_start) == (whole.reason, whole.estimated_start)
        assert wait.facts in (NO_FACTS, whole.facts)


@st.composite
def crowded(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    """Most GPUs busy (whole, multi-node and shared GPUs, some stopping), a few left free, and a
    long queue of repeated requests with a few odd ones: the state a loaded cluster is in."""
    cluster: tuple[Node, ...] = draw(nodes(max_nodes=6))
    runs: list[RunningJob] = []
    next_id = 1000
    for nd in cluster:
        by_model: dict[str, list[int]] = {}
        for g in nd.gpus:
            by_model.setdefault(g.model, []).append(g.index)
        for idxs in by_model.values():
            keep_free = draw(st.sampled_from([0, 0, 0, 1, 2]))
            busy = idxs[: max(0, len(idxs) - keep_free)]
            while busy:
                k = draw(st.integers(1, len(busy)))
                take, busy = busy[:k], busy[k:]
                if k == 1 and draw(st.integers(0, 3)) == 0:
                    share = draw(st.sampled_from([0.25, 0.5, 0.75]))
                    mem = int(share * MODELS[nd.gpus[0].model])
                    alloc = Allocation((NodeSlice(nd.name, tuple(take), share, mem),))
                else:
                    alloc = Allocation((NodeSlice(nd.name, tuple(take)),))
                started = draw(st.sampled_from([0.0, NOW - 5000, NOW - 100]))
                runs.append(
                    RunningJob(
                        next_id,
                        alloc,
                        team=draw(st.sampled_from(TEAMS)),
                        priority=draw(st.sampled_from([Priority.LOW, Priority.NORMAL, Priority.NORMAL])),
                        started_at=started,
                        time_limit_s=draw(st.sampled_from([None, 600.0, 7200.0, 86400.0])),
                        stopping=draw(st.integers(0, 12)) == 0,
                    )
                )
                next_id += 1
    templates = draw(requests(draw(st.integers(1, 4))))
    if draw(st.booleans()):  # Philly-like: one class, whole GPUs, one to eight on one node
        templates = [
            replace(t, priority=Priority.NORMAL, gpu_memory_mb=None, nodes=None, gpu_types=()) for t in templates
        ]
        templates = [replace(t, gpus=float(draw(st.sampled_from([1, 1, 2, 4, 8])))) for t in templates]
    copies = draw(
        st.lists(
            st.tuples(
                st.sampled_from(templates),
                st.sampled_from([0.0, 1.0, 30.0]),
                st.sampled_from([None, None, None, NOW + 50]),
                st.sampled_from([None, None, None, 300.0, 20000.0]),
            ),
            min_size=5,
            max_size=80,
        )
    )
    queued = [
        replace(
            t, job_id=100 + k, submitted_at=t.submitted_at + dt, not_before=held, time_limit_s=limit or t.time_limit_s
        )
        for k, (t, dt, held, limit) in enumerate(copies)
    ]
    if draw(st.booleans()):
        queued += draw(requests(draw(st.integers(0, 4)), first_id=50))
    usage = {t: draw(st.sampled_from([0.0, 100.0, 1e5])) for t in TEAMS}
    return Snapshot(cluster, tuple(runs), tuple(draw(st.permutations(queued))), usage), draw(policies())


@MANY
@given(crowded())
def test_plan_only_equals_the_full_plan_on_crowded_clusters(scenario: tuple[Snapshot, Policy]) -> None:
    assert_same_plan(*scenario)


@MANY
@given(scenarios())
def test_plan_only_equals_the_full_plan(scenario: tuple[Snapshot, Policy]) -> None:
    assert_same_plan(*scenario)


@MANY
@given(repetitive())
def test_plan_only_equals_the_full_plan_on_repeated_requests(scenario: tuple[Snapshot, Policy]) -> None:
    assert_same_plan(*scenario)


def assert_idle_means_no_plan(snap: Snapshot, policy: Policy) -> None:
    """`certainly_idle` (the head skips such cycles' planning) only when the full cycle would
    start and preempt nothing."""
    if certainly_idle(snap, policy, NOW):
        plan = decide(snap, policy, now=NOW)
        assert plan.starts == () and plan.preemptions == ()


@MANY
@given(crowded())
def test_certainly_idle_only_when_the_full_plan_is_empty_on_crowded_clusters(scenario: tuple[Snapshot, Policy]) -> None:
    assert_idle_means_no_plan(*scenario)


@MANY
@given(scenarios())
def test_certainly_idle_only_when_the_full_plan_is_empty(scenario: tuple[Snapshot, Policy]) -> None:
    assert_idle_means_no_plan(*scenario)


# ---- it does stop early ------------------------------------------------------------------------


def _full_cluster(free: int) -> tuple[tuple[Node, ...], tuple[RunningJob, ...]]:
    nodes_ = (node("n0").gpus(8, "H100", MODELS["H100"]).build(), node("n1").gpus(8, "H100", MODELS["H100"]).build())
    runs = (
        RunningJob(1, Allocation((NodeSlice("n0", tuple(range(8))),)), started_at=NOW - 100, time_limit_s=3600.0),
        RunningJob(2, Allocation((NodeSlice("n1", tuple(range(8 - free))),)), started_at=NOW - 50, time_limit_s=600.0),
    )
    return nodes_, runs


def _queue(count: int, gpus: float, limit: float | None = None) -> tuple[JobRequest, ...]:
    return tuple(job(10 + k).gpus(gpus).team(TEAMS[k % 3]).at(float(k)).limit(limit).build() for k in range(count))


def test_a_full_cluster_without_victims_is_certainly_idle() -> None:
    nodes_, runs = _full_cluster(free=0)
    snap = Snapshot(nodes_, runs, _queue(2000, 1))
    assert certainly_idle(snap, Policy(), NOW)
    assert not certainly_idle(Snapshot(*_full_cluster(free=1), _queue(2000, 1)), Policy(), NOW)
    urgent = replace(_queue(1, 1)[0], priority=Priority.HIGH)
    assert not certainly_idle(Snapshot(nodes_, runs, (*_queue(20, 1), urgent)), Policy(), NOW)  # it may preempt


def test_a_full_cluster_without_victims_is_answered_without_ordering_the_queue() -> None:
    nodes_, runs = _full_cluster(free=0)
    snap = Snapshot(nodes_, runs, _queue(2000, 1))
    fast = decide(snap, Policy(), now=NOW, reasons=False)
    assert fast.starts == () and fast.preemptions == () and fast.waiting == {}
    assert len(decide(snap, Policy(), now=NOW).waiting) == 2000


def test_the_cycle_stops_once_the_free_gpus_are_taken() -> None:
    nodes_, runs = _full_cluster(free=2)
    snap = Snapshot(nodes_, runs, (job(5).gpus(8).at(-1.0).build(), *_queue(2000, 1, limit=600.0)))
    for policy in (Policy(), fifo_policy()):
        full = decide(snap, policy, now=NOW)
        fast = decide(snap, policy, now=NOW, reasons=False)
        assert fast.starts == full.starts
        assert len(fast.waiting) < 10 < len(full.waiting)


def test_a_job_that_could_still_backfill_keeps_the_cycle_going() -> None:
    """The reservation for the 8-GPU job holds node n1 (its GPUs free first); short jobs may
    still use its two free GPUs, and one is far back in line."""
    nodes_, runs = _full_cluster(free=2)
    queue = (
        job(5).gpus(8).at(-1.0).build(),
        *_queue(300, 1, limit=7200.0),
        job(999).gpus(1).at(500.0).limit(60.0).build(),
    )
    snap = Snapshot(nodes_, runs, queue)
    full = decide(snap, Policy(), now=NOW)
    fast = decide(snap, Policy(), now=NOW, reasons=False)
    assert [s.job_id for s in full.starts] == [999]
    assert fast.starts == full.starts


def _fragmented(count: int, free: int) -> tuple[tuple[Node, ...], tuple[RunningJob, ...]]:
    """`count` nodes of 8 GPUs, each with `free` GPUs left: as many free in all as a larger job
    asks, but not on one node."""
    nodes_ = tuple(node(f"n{k}").gpus(8, "H100", MODELS["H100"]).build() for k in range(count))
    runs = tuple(
        RunningJob(
            1 + k,
            Allocation((NodeSlice(f"n{k}", tuple(range(8 - free))),)),
            started_at=NOW - 100,
            time_limit_s=3600.0 + k,
        )
        for k in range(count)
    )
    return nodes_, runs


def _popped(snap: Snapshot, policy: Policy, monkeypatch: pytest.MonkeyPatch) -> tuple[Plan, int]:
    """The plan-only cycle's plan and how many queued jobs its walk took from the line (its
    `waiting` does not say: under the default policy jobs answered like an earlier one are not
    named)."""
    count = 0
    pop = _AfterPreemptor.pop

    def counted(self: _AfterPreemptor) -> JobRequest | None:
        nonlocal count
        job_ = pop(self)
        count += job_ is not None
        return job_

    with monkeypatch.context() as m:
        m.setattr(_AfterPreemptor, "pop", counted)
        plan = decide(snap, policy, now=NOW, reasons=False)
    return plan, count


def test_free_gpus_spread_over_nodes_stop_the_cycle_when_no_job_fits_on_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine GPUs free, three a node: no 4-GPU job fits, though the sum would hold two. Before,
    the cycle counted only the sum, reserved n0 for the 8-GPU job and walked every queued job
    (what LAS's one-node reservations left on Philly); now it sees that no node has room for
    the smallest request and answers before ordering the queue."""
    nodes_, runs = _fragmented(3, free=3)
    snap = Snapshot(nodes_, runs, (job(5).gpus(8).at(-1.0).build(), *_queue(2000, 4)))
    for policy in (Policy(), fifo_policy()):
        full = decide(snap, policy, now=NOW)
        fast, popped = _popped(snap, policy, monkeypatch)
        assert fast.starts == full.starts == ()
        assert popped < 10


def test_the_cycle_stops_once_no_job_left_in_line_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under LAS preemption (where the sizes left in line are counted): a 2-GPU job early in
    line starts; every job after it asks 4, more than any node has left. The queue's smallest
    request (2) still fits, so only the count of what is left in line tells the cycle it may
    stop."""
    nodes_, runs = _fragmented(3, free=3)
    queue = (job(5).gpus(8).at(-2.0).build(), job(6).gpus(2).at(-1.0).build(), *_queue(2000, 4))
    snap = Snapshot(nodes_, runs, queue)
    las = Policy(ordering=Ordering(mode="las", preempt=True))
    assert _Cycle(snap, las, NOW)._las
    full = decide(snap, las, now=NOW)
    fast, popped = _popped(snap, las, monkeypatch)
    assert [s.job_id for s in full.starts] == [6]
    assert fast.starts == full.starts
    assert popped < 10


def test_a_job_larger_than_a_node_may_still_take_the_scattered_gpus() -> None:
    """Three GPUs free on each of seven nodes: no job of up to 8 GPUs fits on one, but a
    16-GPU job far back in line is placed over several; the cycle must reach it."""
    nodes_, runs = _fragmented(7, free=3)
    queue = (job(5).gpus(8).at(-1.0).build(), *_queue(300, 4), job(999).gpus(16).at(500.0).build())
    snap = Snapshot(nodes_, runs, queue)
    full = decide(snap, Policy(), now=NOW)
    fast = decide(snap, Policy(), now=NOW, reasons=False)
    assert [s.job_id for s in full.starts] == [999]
    assert fast.starts == full.starts


def test_every_job_is_considered_when_reasons_are_asked() -> None:
    nodes_, runs = _full_cluster(free=0)
    snap = Snapshot(nodes_, runs, _queue(50, 1))
    plan = _Cycle(snap, Policy(), NOW).run()
    assert set(plan.waiting) == {j.job_id for j in snap.queued}


# ---- sorting the queue in without per-job Python ----------------------------------------------


@MANY
@given(repetitive(), st.sampled_from([NOW, NOW + 5000, NOW + 90000]))
def test_sorting_plain_jobs_in_at_c_speed_gives_the_same_lists(scenario: tuple[Snapshot, Policy], now: float) -> None:
    snap, policy = scenario
    assert sort_in_plain(snap.queued, policy, now) == sort_in(snap.queued, policy, now, None)


class _WholeVictimPool(_Cycle):
    pool_by_class = False


def _assert_pool_by_class_changes_nothing(snap: Snapshot, policy: Policy) -> None:
    for reasons in (True, False):
        fast = _Cycle(snap, policy, NOW, reasons).run()
        slow = _WholeVictimPool(snap, policy, NOW, reasons).run()
        assert fast.starts == slow.starts
        assert fast.preemptions == slow.preemptions  # victims, in order, with the reasons
        assert list(fast.waiting.items()) == list(slow.waiting.items())


@MANY
@given(crowded())
def test_ranking_only_lower_classes_as_victims_changes_no_plan(scenario: tuple[Snapshot, Policy]) -> None:
    """`_victim_pool(below)` ranks only the classes below the asker (rebuilt for a later asker
    of a higher class): the same plans as ranking every running job, reasons included."""
    _assert_pool_by_class_changes_nothing(*scenario)


@MANY
@given(scenarios())
def test_ranking_only_lower_classes_as_victims_changes_no_plan_on_any_snapshot(
    scenario: tuple[Snapshot, Policy],
) -> None:
    _assert_pool_by_class_changes_nothing(*scenario)


@st.composite
def contested(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    """A crowded cluster under a policy with classes and preemption and no quotas (Philly's
    default policy), the queue of every class: many askers rank victims."""
    snap, _ = draw(crowded())
    classes = st.sampled_from([Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.CRITICAL])
    queued = tuple(replace(q, priority=draw(classes)) for q in snap.queued)
    running = tuple(replace(r, priority=draw(classes)) if draw(st.booleans()) else r for r in snap.running)
    policy = Policy(
        preemption=replace(
            Policy().preemption,
            min_runtime_s=draw(st.sampled_from([0.0, 0.0, 3000.0])),
            protected_classes=draw(st.sampled_from([frozenset({Priority.CRITICAL}), frozenset()])),
            reclaim_quota=draw(st.booleans()),
        ),
        fair_share=draw(st.booleans()),
    )
    return replace(snap, queued=queued, running=running), policy


@MANY
@given(contested())
def test_ranking_only_lower_classes_as_victims_changes_no_plan_when_classes_contend(
    scenario: tuple[Snapshot, Policy],
) -> None:
    _assert_pool_by_class_changes_nothing(*scenario)


# ---- jobs answered like an earlier one taken off the line in one loop ---------------------------


class _EveryJobPopped(_Cycle):
    skip_answered = False


@st.composite
def with_preemptors(draw: st.DrawFn, base: st.SearchStrategy[tuple[Snapshot, Policy]]) -> tuple[Snapshot, Policy]:
    """`base`, with some queued jobs preempted for others still queued (`Snapshot.preempted_for`:
    `_AfterPreemptor` takes those out of line), some of those backing off, and a starvation age
    that may age every job (the aged go first, in one line by age)."""
    snap, policy = draw(base)
    ids = [j.job_id for j in snap.queued]
    pairs: dict[int, int] = {}
    if len(ids) >= 2 and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            victim, preemptor = draw(st.sampled_from(ids)), draw(st.sampled_from(ids))
            if victim != preemptor and victim not in pairs.values() and preemptor not in pairs:
                pairs[victim] = preemptor
    backing_off = {p for p in pairs.values() if draw(st.booleans())}  # their victims go last
    queued = tuple(replace(j, not_before=NOW + 100.0) if j.job_id in backing_off else j for j in snap.queued)
    age = draw(st.sampled_from([policy.starvation_age_s, 0.0, 3600.0]))
    return replace(snap, queued=queued, preempted_for=pairs), replace(policy, starvation_age_s=age)


def assert_skipping_changes_nothing(snap: Snapshot, policy: Policy) -> None:
    """The cycle that takes answered jobs off the line in one loop against the one that pops
    each: the same starts, preemptions (victims in order, with reasons) and waits, in order."""
    for reasons in (True, False):
        fast = _Cycle(snap, policy, NOW, reasons).run()
        slow = _EveryJobPopped(snap, policy, NOW, reasons).run()
        assert fast.starts == slow.starts
        assert fast.preemptions == slow.preemptions
        assert list(fast.waiting.items()) == list(slow.waiting.items())


@MANY
@given(with_preemptors(crowded()))
def test_skipping_answered_jobs_changes_no_plan_on_crowded_clusters(scenario: tuple[Snapshot, Policy]) -> None:
    assert_skipping_changes_nothing(*scenario)


@MANY
@given(with_preemptors(contested()))
def test_skipping_answered_jobs_changes_no_plan_when_classes_contend(scenario: tuple[Snapshot, Policy]) -> None:
    assert_skipping_changes_nothing(*scenario)


@MANY
@given(with_preemptors(repetitive()))
def test_skipping_answered_jobs_changes_no_plan_on_repeated_requests(scenario: tuple[Snapshot, Policy]) -> None:
    assert_skipping_changes_nothing(*scenario)


def test_jobs_answered_like_an_earlier_one_are_not_popped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three GPUs free on each of three nodes; the 8-GPU job first in line reserves one, then
    2,000 jobs of 4 GPUs, of one team, and last a 2-GPU job that fits. The walk must reach it,
    but the 4-GPU jobs after the first are answered by its wait: taken off the line in one loop,
    not popped one by one (whole Philly under `default` popped 16.6 M jobs, 15.4 M of them such)."""
    nodes_, runs = _fragmented(3, free=3)
    line = tuple(job(10 + k).gpus(4).team(TEAMS[0]).at(float(k)).build() for k in range(2000))
    queue = (job(5).gpus(8).team(TEAMS[0]).at(-1.0).build(), *line, job(9999).gpus(2).team(TEAMS[0]).at(5000.0).build())
    snap = Snapshot(nodes_, runs, queue)
    for policy in (Policy(), replace(Policy(), starvation_age_s=0.0)):  # a team's line, the aged line
        full = decide(snap, policy, now=NOW)
        fast, popped = _popped(snap, policy, monkeypatch)
        assert [s.job_id for s in full.starts] == [9999]
        assert fast.starts == full.starts
        assert popped < 10
