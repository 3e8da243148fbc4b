"""The Gittins ordering inside las's queues (issue 25, core/gittins.py, `runtime_model: gittins`):
the index against its definition, the ranks it gives (queues, promotion and preemption keep
plain las's rules), the policy file, and the head's learned distributions (a real store file)."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpucluster.core import gittins
from gpucluster.core.attained import Ordering, _kind_rank, gittins_ranks, rank_of, ranks
from gpucluster.core.policy import Policy, las_gittins_policy, las_policy
from gpucluster.core.runtime_predict import FinishedRun, JobShape, RunDistribution, RuntimePredictor
from gpucluster.core.scheduler import decide
from gpucluster.core.types import JobRequest, Plan, RunningJob
from gpucluster.policyfile import PolicyFileError, load_policy

from .builders import job, node, running, snapshot

H = 3600.0
NOW = 100 * H
LAS = Ordering(mode="las", queues=(H, 8 * H), promote_after_s=24 * H, preempt=True, runtime_model="gittins")


def _definition(values: list[float], a: float, d: float, extra: list[float]) -> float:
    """G(a) written out from its definition, over the sample points within `d` and `extra`
    other look-aheads: max over x of P(S - a <= x | S > a) / E[min(S - a, x) | S > a]."""
    alive = [v - a for v in values if v > a]
    if not alive:
        return 0.0
    best = 0.0
    for x in [v for v in alive if v <= d] + [e for e in extra if 0 < e <= d]:
        done = sum(1 for v in alive if v <= x)
        spent = sum(min(v, x) for v in alive)
        best = max(best, done / spent)
    return best


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(1.0, 1e5), min_size=1, max_size=30),
    st.floats(0.0, 1e5),
    st.one_of(st.floats(1.0, 1e5), st.just(float("inf"))),
    st.lists(st.floats(1.0, 1e5), max_size=5),
    st.sampled_from([1.0, 0.5, 3600.0]),
)
def test_the_index_is_its_definition(values: list[float], a: float, d: float, extra: list[float], scale: float) -> None:
    """The prefix-sum computation equals the definition at its sample points, and no other
    look-ahead (`extra`) does better: the sup is reached at a sample point. A scaled
    distribution (ratios x a time limit) answers in seconds. (Survivors a hair past `a` are left
    out: prefix sums lose what a nanosecond of expected service would need.)"""
    assume(all(abs(v - a) > 1e-3 for v in values))
    dist = RunDistribution.of(sorted(values))
    got = gittins.index(dist, a, d)
    want = _definition(sorted(values), a, d, [])
    assert got == pytest.approx(want, rel=1e-6, abs=1e-15)
    assert got >= _definition(sorted(values), a, d, extra) * (1 - 1e-6)
    # Only where the look-ahead survives the round trip: a survivor right at `a + d` (values
    # [x], a 0, d x) is in or out by the last bit of `d * scale / scale`.
    assume((a * scale) / scale == a and (d * scale) / scale == d)
    assert gittins.index(dist.scaled(scale), a * scale, d * scale) == pytest.approx(got / scale, rel=1e-6)


def _loop(values: tuple[float, ...], prefix: tuple[float, ...], a: float, d: float) -> float:
    """`gittins._unscaled` as a Python step per candidate (its form before the C-level maps)."""
    n = len(values)
    i0 = bisect_right(values, a)
    end = bisect_right(values, a + d) if d != float("inf") else n
    best, j = 0.0, i0
    while j < end:
        v = values[j]
        k = bisect_right(values, v, j, end)
        done = k - i0
        spent = (prefix[k] - prefix[i0]) - a * done + (v - a) * (n - k)
        if not spent > 0.0:
            return float("inf")
        best = max(best, done / spent)
        j = k
    return best


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.one_of(st.integers(0, 6).map(float), st.floats(0.0, 1e5)), max_size=40),
    st.one_of(st.integers(0, 6).map(float), st.floats(0.0, 1e5)),
    st.one_of(st.integers(0, 6).map(float), st.floats(0.0, 1e5), st.just(float("inf"))),
)
def test_the_index_is_the_same_float_as_the_loop(values: list[float], a: float, d: float) -> None:
    """Bit for bit the per-candidate loop's answer (ties, survivors at `a`, no survivors, no
    look-ahead included): the ranks, and so every decision, stay the same."""
    dist = RunDistribution.of(sorted(values))
    assert repr(gittins._unscaled(dist.values, dist.prefix, a, d)) == repr(_loop(dist.values, dist.prefix, a, d))


def test_rank_fraction_stays_inside_its_queue() -> None:
    assert gittins.rank_fraction(0.0) < 1.0
    assert gittins.rank_fraction(1 / H) == pytest.approx(0.5)
    assert gittins.rank_fraction(1.0) < gittins.rank_fraction(1e-3) < gittins.rank_fraction(1e-9) < 1.0


def _queued(job_id: int, at: float, gpus: float = 1) -> JobRequest:
    return replace(job(job_id).at(at).gpus(gpus).build(), queued_at=at)


SHORT = RunDistribution.of([60.0, 90.0, 120.0])  # finished within a few minutes
LONG = RunDistribution.of([5000.0, 7000.0, 9000.0])  # past any queue-0 allowance of 1 GPU


def test_ranks_order_inside_a_queue_and_keep_the_queues() -> None:
    """Queue 0: the short-history job before the long-history one whatever their age; a job with
    no history at the queue's front (plain las); queue 1 stays behind all of queue 0; a
    promoted job is at 0, ahead of every index."""
    q = [_queued(1, NOW - 5 * H), _queued(2, NOW - H), _queued(3, NOW - 2 * H), _queued(4, NOW - 3 * H)]
    q.append(_queued(5, NOW - 30 * H))  # waited past promote_after
    attained = {4: 2 * H, 5: 50 * H}
    got = gittins_ranks(q, LAS, attained, {1: LONG, 2: SHORT, 4: SHORT, 5: SHORT}, NOW)
    r = {j: got.get(j, 0.0) for j in range(1, 6)}
    assert r[5] == 0.0 and r[3] == 0.0  # promoted; no history
    assert 0.0 < r[2] < r[1] < 1.0
    assert 1.0 <= r[4] < 2.0
    assert [int(r[j]) for j in range(1, 6)] == [LAS.queue_of(attained.get(j, 0.0)) * (j != 5) for j in range(1, 6)]
    # Without distributions, the ranks are plain las's.
    assert ranks(q, LAS, attained, {}, NOW, {}) == ranks(q, replace(LAS, runtime_model="none"), attained, {}, NOW)


def test_a_queue_stamp_before_the_submission_counts_as_the_submission() -> None:
    """A `queued_at` earlier than the job's submission (another head's clock behind this one's
    after a failover) must not promote the job in `rank_of` while `gittins_ranks`, which looks
    for promoted jobs among those submitted `promote_after` ago, does not: both read the
    submission (the hypothesis search of test_scheduler_attained_fast found the two disagreeing
    on a preemption)."""
    stamped_early = replace(job(1).at(NOW - H).gpus(1).build(), queued_at=NOW - 30 * H)
    waited = replace(job(2).at(NOW - 30 * H).gpus(1).build(), queued_at=NOW - 30 * H)
    attained = {1: 50 * H, 2: 50 * H}
    got = gittins_ranks([stamped_early, waited], LAS, attained, {1: SHORT, 2: SHORT}, NOW)
    assert int(got[1]) == rank_of(stamped_early, LAS, attained, {}, NOW) >= 1.0  # not promoted: its queue
    assert got[2] == rank_of(waited, LAS, attained, {}, NOW) == 0.0  # promoted


def _snap(queued: list[JobRequest], dists: dict[int, RunDistribution], run: list[RunningJob] | None = None) -> object:
    s = snapshot(nodes=[node("n1").gpus(1)], running=run or [], queued=queued)
    return replace(s, runtime_dist=dists)


def _started(plan: Plan) -> list[int]:
    return [s.job_id for s in plan.starts]


def test_the_scheduler_starts_the_job_expected_to_finish_first() -> None:
    """One GPU: the older job's kind runs for hours, the newer one's for minutes. Plain las
    (and the default) start the older; las + gittins the newer."""
    q = [_queued(1, NOW - 2 * H), _queued(2, NOW - H)]
    dists = {1: LONG, 2: SHORT}
    s = _snap(q, dists)
    assert _started(decide(s, las_policy(), NOW)) == [1]  # type: ignore[arg-type]
    assert _started(decide(s, las_gittins_policy(), NOW)) == [2]  # type: ignore[arg-type]


def test_preemption_compares_queues_only() -> None:
    """A queue-0 asker with a Gittins fraction stops a checkpointed queue-1 victim (3 GPU-hours),
    with plain las's reason; it never stops a queue-0 one, whatever their indexes."""
    asker = [_queued(1, NOW - 60)]
    v1 = running(9, "n1", 0, started_at=NOW - 3 * H, checkpoint=NOW - 300)
    plan = decide(_snap(asker, {1: SHORT}, [v1]), las_gittins_policy(), NOW)  # type: ignore[arg-type]
    assert [p.job_id for p in plan.preemptions] == [9]
    assert "queue 0)" in plan.preemptions[0].reason
    v0 = running(9, "n1", 0, started_at=NOW - 1900, checkpoint=NOW - 300)  # 0.53 GPU-hours: queue 0
    plan = decide(_snap(asker, {1: SHORT}, [v0]), las_gittins_policy(), NOW)  # type: ignore[arg-type]
    assert plan.preemptions == ()


def test_classes_keep_their_order() -> None:
    """A high job whose kind runs long still goes before a normal one whose kind is short."""
    q = [replace(_queued(1, NOW - H), priority=job(1).priority("high").build().priority), _queued(2, NOW - 2 * H)]
    assert _started(decide(_snap(q, {1: LONG, 2: SHORT}), las_gittins_policy(), NOW)) == [1]  # type: ignore[arg-type]


def test_policy_file(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("ordering: {mode: las, runtime_model: gittins}\n")
    assert load_policy(f).ordering.gittins
    f.write_text("ordering: {runtime_model: gittins}\n")  # mode las is the default
    assert load_policy(f).ordering.gittins
    f.write_text("ordering: {mode: age, runtime_model: gittins}\n")
    with pytest.raises(PolicyFileError, match="mode: las"):
        load_policy(f)
    assert not Policy().ordering.gittins and not las_policy().ordering.gittins


def test_predictor_distribution_is_the_key_predict_answers_from() -> None:
    """`distribution` answers from the same similarity key as `predict` (None where it falls
    back to the time limit), and is one object until that key learns another run."""
    p = RuntimePredictor()
    shape = JobShape("ann", "vision", "name:train", 8, "H100", None)
    assert p.distribution(shape) is None
    for s in (100.0, 300.0, 200.0):
        p.add(FinishedRun(shape, s))
    d = p.distribution(shape)
    assert d is not None and d.values == (100.0, 200.0, 300.0) and d.prefix == (0.0, 100.0, 300.0, 600.0)
    assert p.distribution(shape) is d
    p.add(FinishedRun(shape, 400.0))
    assert p.distribution(shape) is not d
    # A coarser key counted as ratios of the limit: scaled by this job's limit.
    other = JobShape("bob", "vision", "", 8, "H100", 1000.0)
    for s in (100.0, 200.0, 300.0):
        p.add(FinishedRun(replace(other, user="cy"), s))
    got = p.distribution(other)
    assert got is not None and got.scale == 1000.0 and got.values == (0.1, 0.2, 0.3)


def test_the_head_orders_by_what_it_learned(tmp_path: Path) -> None:
    """A real store: three `quick` jobs finished in a minute, three `slow` ones in an hour, all on
    8 GPUs. Behind a running job, a `slow` job then a `quick` one wait; when the GPUs free, the
    head under las + gittins starts `quick` first (plain las: `slow`, the older), and its
    snapshot carries the learned distributions."""
    from gpucluster.core.states import JobState
    from gpucluster.head.policy_source import PolicySource

    from .headkit import T0, make_cluster

    firsts = {}
    for model in ("none", "gittins"):
        root = tmp_path / model
        root.mkdir()
        (root / "policy.yaml").write_text(f"ordering: {{mode: las, runtime_model: {model}}}\n")
        c = make_cluster(root, policy=PolicySource(root / "policy.yaml"))
        try:
            t = T0
            for name, took in (("quick", 60.0), ("slow", H)) * 3:
                j = c.submit(gpus=8, name=name)
                c.tick_at(t)
                assert c.state(j) is JobState.RUNNING
                t += took
                c.fake.finish(j, 0)
                c.tick_at(t)
                assert c.state(j) is JobState.SUCCEEDED
            blocker = c.submit(gpus=8, name="other")
            c.tick_at(t)
            slow = c.submit(gpus=8, name="slow")
            c.tick_at(t + 1)
            quick = c.submit(gpus=8, name="quick")
            c.tick_at(t + 2)
            assert (c.state(slow), c.state(quick)) == (JobState.QUEUED, JobState.QUEUED)
            dists = c.head.snapshot().runtime_dist
            if model == "gittins":
                assert dists[quick].values == (60.0, 60.0, 60.0) and dists[slow].values == (H, H, H)
            else:
                assert dists == {}
            c.fake.finish(blocker, 0)
            c.tick_at(t + 10)
            c.tick_at(t + 11)
            firsts[model] = [j for j in (slow, quick) if c.state(j) is JobState.RUNNING]
        finally:
            c.close()
    assert firsts == {"none": [slow], "gittins": [quick]}


_ASK = st.tuples(st.integers(0, 400), st.sampled_from([0.5, 1.0, 2.0, 8.0]), st.sampled_from([60.0, H, 8 * H, 1e6]))


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.lists(st.integers(0, 600), max_size=6), st.lists(_ASK, max_size=6)), min_size=1, max_size=25
    ),
    window=st.sampled_from([3, 8, 256]),
    fraction=st.booleans(),
)
def test_a_new_distribution_takes_over_only_indexes_and_ranks_that_cannot_have_changed(
    steps: list[tuple[list[int], list[tuple[int, float, float]]]], window: int, fraction: bool
) -> None:
    """A key's next distribution keeps the last one's indexes and ranks where every run that
    came or went since lies at or below the job's attained time (runtime_predict._Samples): each
    answer, kept or not, is the float worked out afresh from the distribution's own values."""
    predictor = RuntimePredictor(min_samples=1, window=window)
    shape = JobShape("ann", "vision", "train", 1.0, "H100", None)
    for runs, asks in steps:
        for r in runs:  # whole seconds (carried), or with a fraction (nothing carried)
            predictor.add(FinishedRun(shape, r + (0.25 if fraction else 0.0)))
        dist = predictor.distribution(shape)
        if dist is None:
            continue
        fresh = RunDistribution.of(list(dist.values))
        for attained, gpus, quantum in asks:
            got = gittins.index(dist, float(attained), quantum)
            assert got == gittins.index(replace(fresh, memo={}), float(attained), quantum)
            ordering = replace(LAS, queues=(quantum, 2 * quantum))
            want = _kind_rank(ordering, replace(fresh, ranks={}, memo={}), gpus, attained * gpus)
            assert _kind_rank(ordering, dist, gpus, attained * gpus) == want


def test_a_run_below_a_jobs_attained_time_keeps_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the carry: a job that ran 5,000 s keeps its worked-out index and rank when
    its key learns a shorter run (the values it reads, those above 5,000 s, are unchanged), and
    has them worked out again when the key learns a longer one."""
    worked: list[float] = []
    unscaled = gittins._unscaled

    def counting(values: tuple[float, ...], prefix: tuple[float, ...], a: float, d: float) -> float:
        worked.append(a)
        return unscaled(values, prefix, a, d)

    monkeypatch.setattr(gittins, "_unscaled", counting)
    predictor = RuntimePredictor(min_samples=1)
    shape = JobShape("ann", "vision", "train", 2.0, "H100", None)
    for r in (600, 4000, 9000, 20000):
        predictor.add(FinishedRun(shape, float(r)))
    first = predictor.distribution(shape)
    assert first is not None and first.exact
    rank = _kind_rank(LAS, first, 2.0, 10000.0)  # 5,000 s per GPU
    index = gittins.index(first, 5000.0, 1000.0)
    assert len(worked) == 2
    predictor.add(FinishedRun(shape, 1200.0))
    second = predictor.distribution(shape)
    assert second is not None and second is not first
    assert _kind_rank(LAS, second, 2.0, 10000.0) == rank
    assert gittins.index(second, 5000.0, 1000.0) == index
    assert len(worked) == 2  # nothing worked out again
    predictor.add(FinishedRun(shape, 7000.0))
    third = predictor.distribution(shape)
    assert third is not None
    _kind_rank(LAS, third, 2.0, 10000.0)
    assert len(worked) == 3  # a run above 5,000 s: worked out again
