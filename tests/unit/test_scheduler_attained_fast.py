"""The cheap paths of least attained service (issue 25's cost goal) against plain references:
ranks only for the jobs that ran before, a victim's standing once a cycle, and the victim pool
without the asker's class's jobs no asker may take. Each must leave every plan as it was."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core import attained, gittins
from gpucluster.core.attained import Ordering, gittins_ranks, may_be_taken, may_take, rank_of, ranks, standing
from gpucluster.core.cluster_state import ClusterState
from gpucluster.core.policy import Policy
from gpucluster.core.queueing import TeamQueues
from gpucluster.core.runtime_predict import RunDistribution
from gpucluster.core.scheduler import _Cycle, certainly_idle, decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, NodeSlice, Priority, RunningJob

from .test_scheduler_plan_only import assert_skipping_changes_nothing, crowded, with_preemptors
from .test_scheduler_properties import NOW, TEAMS

H = 3600.0
EXAMPLES = int(os.environ.get("GPUCLUSTER_PLAN_ONLY_EXAMPLES", "100"))
MANY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

orderings = st.builds(
    Ordering,
    mode=st.sampled_from(["las", "las", "sjf"]),
    queues=st.sampled_from([(H, 8 * H), (1800.0,), (0.0, H), (H, 4 * H, 16 * H)]),
    promote_after_s=st.sampled_from([None, 2 * H, 24 * H]),
    preempt=st.just(True),
    min_slice_s=st.sampled_from([0.0, 1800.0]),
    restart_cost_s=st.sampled_from([0.0, 60.0]),
)
gpu_seconds = st.sampled_from([0.0, 10.0, 1800.0, H, 2 * H, 8 * H, 30 * H])


def _all_ranks(
    queued: Iterable[JobRequest],
    o: Ordering,
    att: Mapping[int, float],
    expected: Mapping[int, float],
    now: float,
    dists: Mapping[int, RunDistribution] | None = None,
) -> dict[int, float]:
    """The reference: every queued job's rank, one `rank_of` each (with a Gittins index, the
    job's fraction on top, for every job that has one: `_gittins_rank_of`)."""
    if o.gittins and dists:
        return {j.job_id: _gittins_rank_of(j, o, att, dists, now) for j in queued}
    return {j.job_id: rank_of(j, o, att, expected, now) for j in queued}


def _gittins_rank_of(
    job: JobRequest, o: Ordering, att: Mapping[int, float], dists: Mapping[int, RunDistribution], now: float
) -> float:
    """The Gittins rule written out for one job: promoted, 0; else its queue, plus, with a
    distribution and GPUs, the fraction of its index looking ahead to its queue's threshold."""
    queue = rank_of(job, o, att, {}, now)
    if queue == 0.0 and o.promote_after_s is not None:
        # the later of the submission and the requeue: a requeue stamped before the submission
        # (another head's clock behind) counts as the submission, as `attained.entered_queue` says
        # (with a day's starvation age such a job was aged and never ranked; a week's ranks it)
        entered = max(job.submitted_at, job.queued_at if job.queued_at is not None else job.submitted_at)
        if now - entered >= o.promote_after_s:
            return 0.0
    dist, got = dists.get(job.job_id), att.get(job.job_id, 0.0)
    if dist is None or job.gpus <= 0:
        return queue
    ahead = max(0.0, o.allowance(queue) - got) / job.gpus
    return queue + gittins.rank_fraction(gittins.index(dist, got / job.gpus, ahead) / job.gpus)


KINDS = [RunDistribution.of(v) for v in ([60.0, 120.0, 600.0], [1000.0, 5000.0, 9e4], [30 * H] * 3)]


@st.composite
def queue_and_history(draw: st.DrawFn) -> tuple[list[JobRequest], dict[int, float], dict[int, float]]:
    jobs = []
    for k in range(draw(st.integers(0, 30))):
        entered = NOW - draw(st.sampled_from([0.0, 60.0, 3 * H, 30 * H]))
        requeued = draw(st.booleans())
        jobs.append(
            JobRequest(
                job_id=k,
                gpus=1.0,
                team=draw(st.sampled_from(TEAMS)),
                submitted_at=entered - (H if requeued else 0.0),
                queued_at=entered if requeued else None,
            )
        )
    ids = st.integers(0, 40)  # some of these ran and ended, never queued again
    att = draw(st.dictionaries(ids, gpu_seconds, max_size=20))
    expected = draw(st.dictionaries(ids, st.sampled_from([0.0, 60.0, H]), max_size=20))
    return jobs, att, expected


@MANY
@given(queue_and_history(), orderings, st.data())
def test_gittins_ranks_are_the_rule_per_job(
    history: tuple[list[JobRequest], dict[int, float], dict[int, float]], o: Ordering, data: st.DataObject
) -> None:
    """`gittins_ranks` (C-speed reads of the jobs that never ran, a Python step for the others)
    against the rule per job, with every kind of job: ran before or not, promoted or not, with a
    distribution or none, whole GPUs, shares, or none."""
    jobs, att, _ = history
    o = replace(o, mode="las", runtime_model="gittins")
    jobs = [replace(j, gpus=data.draw(st.sampled_from([1.0, 8.0, 0.5, 0.0]))) for j in jobs]
    dists = {j.job_id: data.draw(st.sampled_from(KINDS)) for j in jobs if data.draw(st.booleans())}
    got = gittins_ranks(jobs, o, att, dists, NOW)
    assert got == {j.job_id: _gittins_rank_of(j, o, att, dists, NOW) for j in jobs}


@MANY
@given(queue_and_history(), orderings)
def test_ranks_name_every_job_not_of_rank_0(
    history: tuple[list[JobRequest], dict[int, float], dict[int, float]], o: Ordering
) -> None:
    """`ranks` leaves out only jobs of rank 0: read with `.get(id, 0.0)` it is every job's `rank_of`."""
    jobs, att, expected = history
    got = ranks(jobs, o, att, expected, NOW)
    assert set(got) <= {j.job_id for j in jobs}
    assert {j.job_id: got.get(j.job_id, 0.0) for j in jobs} == _all_ranks(jobs, o, att, expected, NOW)


@MANY
@given(queue_and_history(), orderings, st.booleans())
def test_team_queues_read_sparse_ranks_as_the_full_ones(
    history: tuple[list[JobRequest], dict[int, float], dict[int, float]], o: Ordering, fair: bool
) -> None:
    jobs, att, expected = history
    pol = Policy(fair_share=fair)
    usage = {"a": 5.0, "b": 1.0}
    sparse = TeamQueues(jobs, pol, usage, NOW, ranks=ranks(jobs, o, att, expected, NOW) or None)
    full = TeamQueues(jobs, pol, usage, NOW, ranks=_all_ranks(jobs, o, att, expected, NOW))

    def order(q: TeamQueues) -> list[int]:
        out = []
        while (j := q.pop()) is not None:
            out.append(j.job_id)
            q.done(j, False)
        return out

    assert order(sparse) == order(full)


@st.composite
def victims(draw: st.DrawFn) -> RunningJob:
    started = NOW - draw(st.sampled_from([0.0, 600.0, 1900.0, 3 * H, 30 * H]))
    ckpt = draw(st.sampled_from([None, 60.0, 900.0, 3 * H]))
    shape = draw(st.sampled_from([((0,),), ((0, 1, 2, 3, 4, 5, 6, 7),), ((0, 1), (0, 1)), ((0,), (0,), (0,))]))
    share = draw(st.sampled_from([1.0, 0.5])) if len(shape) == 1 and len(shape[0]) == 1 else 1.0
    alloc = Allocation(tuple(NodeSlice(f"n{i}", idx, share) for i, idx in enumerate(shape)))
    return RunningJob(9, alloc, started_at=started, last_checkpoint_at=None if ckpt is None else NOW - ckpt)


@MANY
@given(victims(), orderings, gpu_seconds)
def test_standing_decides_as_the_rule_reads(v: RunningJob, o: Ordering, before: float) -> None:
    """`may_take` and `may_be_taken`, worked out from `standing`, against the rule as `Ordering`
    states it, written out here in full (GPUs from `Allocation.gpu_count`)."""
    o = replace(o, mode="las")
    att = {9: before}
    gpus = v.allocation.gpu_count
    for r in range(len(o.queues) + 1):
        rule = (
            v.last_checkpoint_at is not None
            and NOW - v.started_at >= o.min_slice_s
            and o.queue_of(before + gpus * max(0.0, NOW - v.started_at)) > r
            and gpus * (NOW - v.last_checkpoint_at + o.restart_cost_s) <= o.allowance(float(r))
        )
        assert may_take(float(r), v, o, att, NOW) == rule
    any_asker = any(may_take(float(r), v, o, att, NOW) for r in range(len(o.queues) + 1))
    assert may_be_taken(v, o, att, NOW) == any_asker
    assert (standing(v, o, att, NOW) is None) == (v.last_checkpoint_at is None or NOW - v.started_at < o.min_slice_s)


class _PlainLas(_Cycle):
    """The reference cycle: every job of the asker's class in the victim pool, `may_take` asked
    per asker and victim, and every job considered (no answer shared between jobs)."""

    las_pool_filter = False
    share_waits = False


@st.composite
def las_scenarios(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    """A crowded cluster (test_scheduler_plan_only.py) under LAS preemption: running jobs that
    checkpoint or not, started long ago or just now, with attained service before; queued jobs
    of which some ran before, some waiting long enough to be promoted; fair share or not."""
    snap, _ = draw(crowded())
    running = []
    for r in snap.running:
        started = NOW - draw(st.sampled_from([100.0, 1900.0, 3 * H, 30 * H]))
        ckpt = draw(st.sampled_from([None, 60.0, 600.0, 900.0, 2 * H]))
        running.append(
            replace(
                r,
                started_at=started,
                last_checkpoint_at=None if ckpt is None else max(started, NOW - ckpt),
                priority=draw(st.sampled_from([Priority.NORMAL, Priority.NORMAL, Priority.LOW])),
            )
        )
    queued = [
        replace(q, queued_at=NOW - draw(st.sampled_from([0.0, 60.0, 30 * H])) if draw(st.booleans()) else None)
        for q in snap.queued
    ]
    ids = [j.job_id for j in running] + [j.job_id for j in queued]
    att = {i: draw(gpu_seconds) for i in ids if draw(st.booleans())}
    o = draw(orderings.map(lambda o: replace(o, mode="las")))
    dists: dict[int, RunDistribution] = {}
    if draw(st.booleans()):  # inside a queue by learned run times (core/gittins.py)
        o = replace(o, runtime_model="gittins")
        dists = {q.job_id: draw(st.sampled_from(KINDS)) for q in queued if draw(st.booleans())}
    pol = Policy(
        ordering=o,
        fair_share=draw(st.sampled_from([True, True, False])),
        preemption=replace(Policy().preemption, min_runtime_s=draw(st.sampled_from([0.0, 3000.0]))),
    )
    usage = {t: draw(st.sampled_from([0.0, 100.0, 1e5])) for t in TEAMS}
    snap = replace(snap, running=tuple(running), queued=tuple(queued), attained=att, usage=usage)
    return replace(snap, runtime_dist=dists), pol


@MANY
@given(las_scenarios())
def test_the_cheap_las_paths_change_no_plan(scenario: tuple[Snapshot, Policy]) -> None:
    """The cycle with sparse ranks, standings once a cycle, the filtered pool and answers shared
    per (request, queue) (a Gittins fraction reorders a queue only) against the reference (every
    rank, `may_take` per pair, the whole pool, every job considered): the same starts and
    preemptions (victims in order, with their reasons); with reasons, the same waits; without,
    the waits it names are the reference's (a job answered from an earlier one's request is not
    named, as on the default path)."""
    snap, pol = scenario
    # ... and with the running jobs by class, as a cluster state keeps them (the simulator's).
    by_class = ClusterState.build(running=snap.running).running_by_class()
    kept = replace(snap, running=by_class.running, running_by_class=by_class)
    for reasons in (True, False):
        fast = _Cycle(snap, pol, NOW, reasons).run()
        assert _Cycle(kept, pol, NOW, reasons).run() == fast
        with mock.patch.object(attained, "ranks", _all_ranks):
            slow = _PlainLas(snap, pol, NOW, reasons).run()
        assert fast.starts == slow.starts
        assert fast.preemptions == slow.preemptions
        if reasons:
            assert list(fast.waiting.items()) == list(slow.waiting.items())
        else:
            assert {k: (w.reason, w.estimated_start) for k, w in fast.waiting.items()} == {
                k: (slow.waiting[k].reason, slow.waiting[k].estimated_start) for k in fast.waiting
            }


@MANY
@given(las_scenarios())
def test_the_kept_running_jobs_by_class_give_the_pool_of_a_pass_over_every_running_job(
    scenario: tuple[Snapshot, Policy],
) -> None:
    """The LAS victim pool read from the running jobs by class as a cluster state keeps them
    (of the asker's class, by GPUs, newest checkpoint first, up to the first over the
    allowance; none when the asker is in the last queue) against a pass over every running
    job: the same pool and shared models, for an asker of each class and queue. The state is
    built in the snapshot's order, so its checkpoints come out of time order."""
    snap, pol = scenario
    by_class = ClusterState.build(running=snap.running).running_by_class()
    kept = replace(snap, running=by_class.running, running_by_class=by_class)
    for below in (int(Priority.LOW) + 1, int(Priority.NORMAL) + 1):
        for rank in range(len(pol.ordering.queues) + 1):
            fast, full = _Cycle(kept, pol, NOW, False), _Cycle(snap, pol, NOW, False)
            assert fast._victim_pool(below, float(rank)) == full._victim_pool(below, float(rank))
            assert fast._shared_pool == full._shared_pool


@MANY
@given(with_preemptors(las_scenarios()))
def test_skipping_jobs_answered_per_request_and_queue_changes_no_plan(scenario: tuple[Snapshot, Policy]) -> None:
    """Under LAS the jobs next in line whose (request, queue) has an answer are taken off the
    line in one loop (`_AfterPreemptor.skip_same`), each waiting as that answer says: the same
    plans as popping each, waits included, in order."""
    assert_skipping_changes_nothing(*scenario)


@MANY
@given(las_scenarios())
def test_the_plan_only_cycle_under_las_starts_and_preempts_as_the_full_one(scenario: tuple[Snapshot, Policy]) -> None:
    """Under LAS the plan-only cycle stops once no job left in line fits the GPUs left off the
    reserved nodes, on one node where it asks no more than a node has (`_Cycle._settled`):
    the same starts and preemptions as the full cycle, which considers every job."""
    snap, pol = scenario
    full = decide(snap, pol, NOW)
    fast = decide(snap, pol, NOW, reasons=False)
    assert fast.starts == full.starts
    assert fast.preemptions == full.preemptions


@MANY
@given(las_scenarios())
def test_certainly_idle_under_las_only_when_the_full_plan_is_empty(scenario: tuple[Snapshot, Policy]) -> None:
    """Under LAS a queued job may preempt one of its own class that has had more: the head's
    idle test (`certainly_idle`) must see those victims too."""
    snap, pol = scenario
    if certainly_idle(snap, pol, NOW):
        plan = decide(snap, pol, NOW)
        assert plan.starts == () and plan.preemptions == ()
