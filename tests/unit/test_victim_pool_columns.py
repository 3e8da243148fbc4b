"""The victim pool's columns (core/victim_pool.py) against what they stand for: each model's
pool in the order of the cost keys, its columns the jobs' own fields, and each asker's
candidates, read by class segment and column, the jobs a test of every job of the pool keeps
(`_PerJobCandidates`, the loop the scheduler ran before): the same plans, waits included, on
random states under random policies (quotas and reclaim, classes, the serving class's rule,
LAS, fair share, node selections and pool quotas)."""

from __future__ import annotations

from dataclasses import replace
from random import Random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.policy import Policy, Team
from gpucluster.core.preempt import Guarantees
from gpucluster.core.scheduler import _Cycle
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, NodeSlice, RunningJob
from gpucluster.core.victim_pool import ModelPool, gpus_held

from .builders import job, node, running, snapshot
from .test_pool_quotas import with_pool_quotas
from .test_scheduler_attained_fast import las_scenarios
from .test_scheduler_plan_only import contested, crowded
from .test_scheduler_properties import NOW, scenarios
from .test_scheduler_selection import labelled

MANY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RULES = st.sampled_from(["checkpointed", "any", "none"])


class _PerJobCandidates(_Cycle):
    """The reference: every job of the pool tested in turn, then each where the asker may land
    and each against the guarantees, one call per job; a job preempted on any model passed over."""

    def _candidates(
        self,
        job: JobRequest,
        model: str,
        pool: ModelPool | None,
        reclaim: bool,
        within: bool,
        allowed: frozenset[str] | None,
    ) -> tuple[list[RunningJob], Guarantees | None]:
        gone = set().union(*self._preempted.values())
        out = []
        for v in pool.jobs if pool is not None else []:
            if v.job_id in gone:
                continue
            by_class = self.policy.priorities and v.priority < job.priority
            if (
                (by_class and self.policy.may_preempt_by_class(job.priority, v.last_checkpoint_at is not None))
                or (self._las and v.priority == job.priority and self._las_victim(job, v))
                or (reclaim and v.team != job.team and self.quotas.borrowing(v.team, model))
            ):
                out.append(v)
        if allowed is not None:
            out = [v for v in out if any(s.node in allowed for s in v.allocation.slices)]
        guarantees = self._guarantees(job, model, within) if out and self.quotas.has_quotas else None
        if guarantees is not None:
            out = [v for v in out if guarantees.allows(v, {})]
        return out, guarantees


def _assert_same_plans(snap: Snapshot, policy: Policy) -> None:
    for reasons in (True, False):
        fast = _Cycle(snap, policy, NOW, reasons).run()
        slow = _PerJobCandidates(snap, policy, NOW, reasons).run()
        assert fast.starts == slow.starts
        assert fast.preemptions == slow.preemptions  # victims, in order, with their reasons
        assert list(fast.waiting.items()) == list(slow.waiting.items())


@st.composite
def any_serving_rule(draw: st.DrawFn, scenario: st.SearchStrategy[tuple[Snapshot, Policy]]) -> tuple[Snapshot, Policy]:
    snap, policy = draw(scenario)
    return snap, replace(policy, preemption=replace(policy.preemption, serving_victims=draw(RULES)))


@MANY
@given(any_serving_rule(scenarios()))
def test_candidates_read_by_column_are_those_of_a_test_per_job(scenario: tuple[Snapshot, Policy]) -> None:
    """Random policies: quotas with reclaim or not, classes or not, fair share, every class
    asking (the serving one under each rule), running jobs over two nodes and shares."""
    _assert_same_plans(*scenario)


@MANY
@given(any_serving_rule(crowded()))
def test_candidates_read_by_column_on_crowded_clusters(scenario: tuple[Snapshot, Policy]) -> None:
    _assert_same_plans(*scenario)


@MANY
@given(contested())
def test_candidates_read_by_column_when_classes_contend(scenario: tuple[Snapshot, Policy]) -> None:
    _assert_same_plans(*scenario)


@MANY
@given(las_scenarios())
def test_candidates_read_by_column_under_las(scenario: tuple[Snapshot, Policy]) -> None:
    """The asker's own class is asked job by job for attained service, its checkpointed jobs
    only; quotas added so that a borrowing team's jobs of that class are taken too."""
    _assert_same_plans(*scenario)


@MANY
@given(st.one_of(labelled(), with_pool_quotas().map(lambda s: (s[0], s[1]))))
def test_candidates_read_by_column_where_the_asker_may_land(scenario: tuple[Snapshot, Policy]) -> None:
    """Node selections and pool quotas: candidates only where the asker may land."""
    _assert_same_plans(*scenario)


@st.composite
def shuffled(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    """A state of any kind with its running jobs in any order (the head lists them by id, the
    simulator by start): the pool's order must not depend on it."""
    snap, policy = draw(st.one_of(scenarios(), crowded(), contested()))
    return replace(snap, running=tuple(draw(st.permutations(snap.running)))), policy


@MANY
@given(shuffled(), st.sampled_from([None, 1, 2, 3]))
def test_each_pool_is_in_cost_order_with_its_jobs_fields(scenario: tuple[Snapshot, Policy], below: int | None) -> None:
    """Every model's pool, for an asker of every class or one reclaiming (every class): its
    jobs sorted by `_victim_cost` (the columns' stable sorts give the tuples' order), and each
    column the field it stands for (the GPUs held: `gpus_held`, shares and several nodes too)."""
    snap, policy = scenario
    cycle = _Cycle(snap, policy, NOW)
    for model, pool in cycle._victim_pool(below).items():
        assert pool.jobs == sorted(pool.jobs, key=cycle._victim_cost)
        assert pool.classes == [int(v.priority) for v in pool.jobs]
        assert pool.teams == [v.team for v in pool.jobs]
        # The GPUs held only under quotas: only the guarantees' filter reads them.
        held = [gpus_held(v.allocation, model, cycle.cap.gpus) for v in pool.jobs]
        assert pool.holds == (held if cycle.quotas.has_quotas else [])
        assert [pool.ids[i] for i in pool.order] == [v.job_id for v in pool.jobs]
        assert list(pool.checkpointed_in(0, len(pool.jobs))) == [v.last_checkpoint_at is not None for v in pool.jobs]
        assert {v.team for v in pool.jobs} <= pool.team_set


@MANY
@given(
    any_serving_rule(st.one_of(scenarios(), crowded(), las_scenarios(), labelled())),
    st.randoms(use_true_random=False),
)
def test_every_askers_candidates_are_those_of_a_test_per_job(scenario: tuple[Snapshot, Policy], rng: Random) -> None:
    """Not only the plans: after a cycle (its ranks, quotas and standings as a late asker sees
    them), every queued job's candidates on every model of the pool, reclaiming or not, where
    it may land anywhere or on some nodes, with some of the pool preempted already: the same
    jobs, in the same order, and the same guarantees, as the per-job test's."""
    snap, policy = scenario
    cycle = _Cycle(snap, policy, NOW)
    cycle.run()
    pools = cycle._victim_pool(None, 0.0 if cycle._las else None)
    names = sorted(n.name for n in snap.nodes)
    for model, pool in pools.items():
        cycle._preempted = {model: {v.job_id for v in pool.jobs if rng.random() < 0.2}}
        for asker in snap.queued:
            within = cycle.quotas.has_quotas and cycle.quotas.within_quota(asker.team, model, asker.gpus)
            allowed = None if rng.random() < 0.5 else frozenset(n for n in names if rng.random() < 0.5)
            for reclaim in {False, within}:
                fast = cycle._candidates(asker, model, pool, reclaim, within, allowed)
                slow = _PerJobCandidates._candidates(cycle, asker, model, pool, reclaim, within, allowed)
                assert [v.job_id for v in fast[0]] == [v.job_id for v in slow[0]]
                assert (fast[1] is None) == (slow[1] is None)


# ---- the rules' corners, one example each ---------------------------------------------------


def _candidates_of(snap: Snapshot, policy: Policy, asker: JobRequest) -> list[int]:
    """The asker's candidates on H100 (it reclaims when its team stays within its quota),
    checked against the per-job test."""
    cycle = _Cycle(snap, policy, NOW)
    pool = cycle._victim_pool(None)["H100"]
    within = cycle.quotas.within_quota(asker.team, "H100", asker.gpus)
    fast = cycle._candidates(asker, "H100", pool, within, within, None)[0]
    assert fast == _PerJobCandidates._candidates(cycle, asker, "H100", pool, within, within, None)[0]
    return [v.job_id for v in fast]


def _teams(**quotas: float) -> dict[str, Team]:
    return {name: Team(name, quota={"H100": q}) for name, q in quotas.items()}


def test_a_serving_asker_takes_a_borrowers_lower_class_jobs_and_anothers_checkpointed_ones() -> None:
    """Under `serving_victims="checkpointed"` a reclaiming service replica takes from a lower
    class what checkpointed or what a borrowing team holds: either, not only both."""
    jobs = [
        running(1, "a", 0, team="y", priority="low"),  # borrowing, never checkpointed
        running(2, "a", 1, team="y", priority="low", checkpoint=NOW - 60),  # borrowing, checkpointed
        running(3, "a", 2, team="w", priority="low", checkpoint=NOW - 60),  # within its quota, checkpointed
        running(4, "a", 3, team="w", priority="low"),  # within its quota, never checkpointed
    ]
    asker = job(9).gpus(2).team("x").priority("serving").build()
    snap = snapshot([node("a").gpus(8)], jobs, [asker])
    assert sorted(_candidates_of(snap, Policy(teams=_teams(x=4, y=0, w=8)), asker)) == [1, 2, 3]


def test_a_borrowers_job_of_the_askers_class_is_held_to_what_its_team_borrows() -> None:
    """Within its guarantee the asker takes any lower-class job; of its own class only what
    keeps the borrowing team at its quota: team y borrows 2 H100s with a 4-GPU job, so the
    job is no candidate, while its 1-GPU low job is."""
    jobs = [running(1, "a", 0, 1, 2, 3, team="y"), running(2, "a", 4, team="y", priority="low")]
    asker = job(9).gpus(2).team("x").build()
    snap = snapshot([node("a").gpus(8)], jobs, [asker])
    assert _candidates_of(snap, Policy(teams=_teams(x=4, y=3)), asker) == [2]


def test_a_job_holding_what_its_team_borrows_up_to_rounding_is_a_candidate() -> None:
    """Team y's quota is 0.2 GPU and it holds 0.2 and 0.5 of one: it borrows 0.2 + 0.5 - 0.2,
    0.49999999999999994 in floats, and its 0.5 job is within that by `allows`' 1e-9."""
    shares = [(1, 0.2), (2, 0.5)]
    jobs = [RunningJob(i, Allocation((NodeSlice("a", (0,), share, 1024),)), team="y") for i, share in shares]
    asker = job(9).gpus(1).team("x").build()
    snap = snapshot([node("a").gpus(8)], jobs, [asker])
    assert _candidates_of(snap, Policy(teams=_teams(x=4, y=0.2)), asker) == [1, 2]
