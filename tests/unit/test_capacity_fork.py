"""The capacity trial: a capacity index's base lends its containers to the cycle's copy inside
a `with base.trial()` block; the copy journals what it overwrites (an undo log), and the base
takes them back (undoing the journal) when the block ends, or when the base must change or open
another trial while the block is still open (the copy first takes copies). Over seeded random
histories of starts and ends, checked against fresh `Capacity` builds: every copy equals a
fresh build (bucket and shared-GPU order included), what a copy takes and releases gives the
very placements and state a fresh build given the same writes gives, the base's content is
exactly what it was once the block has ended, a copy kept open across later base changes (and
trials) keeps its own state, and a copy's fork is independent of both.
"""

from __future__ import annotations

import random
from contextlib import ExitStack

import pytest

from gpucluster.core.placement import Capacity
from gpucluster.core.types import Allocation, JobRequest, Priority, RunningJob
from tests.unit.builders import H100_MB, job, node, shared
from tests.unit.test_scheduler_index import _nodes, _state


def _content(cap: Capacity) -> object:
    """A base's whole free state, exactly: dicts compared as dicts, lists and shared-GPU order
    as they are; buckets as sets (a fork may put a base's bucket into name order, nothing else)."""
    return (
        {m: {n: list(i) for n, i in per.items()} for m, per in cap.free.items()},
        {m: [set(b) for b in per] for m, per in cap._buckets.items()},
        {m: list(p) for m, p in cap.partial.items()},
        dict(cap.total_free),
        dict(cap.used_share),
        dict(cap.used_mem),
    )


def _request(rng: random.Random, job_id: int) -> JobRequest:
    gpus = rng.choice([0.25, 0.5, 1, 1, 1, 2, 3, 4, 6, 8, 12, 16])
    nodes = 2 if gpus == 16 and rng.random() < 0.5 else None
    return JobRequest(job_id, float(gpus), nodes=nodes, team="a", priority=Priority(1), submitted_at=0.0)


def _running(jobs: dict[int, Allocation]) -> list[RunningJob]:
    return [RunningJob(j, a, "a", Priority(1), 0.0, None) for j, a in jobs.items()]


def _place_same(rng: random.Random, fresh: Capacity, forks: list[Capacity], job_id: int) -> Allocation | None:
    """Place one random job on `fresh` and every fork: the same allocation on each, taken on each."""
    job = _request(rng, job_id)
    models = [m for m in fresh.acceptable_models(job) if fresh.could_ever_fit(job, m)]
    if not models:
        return None
    model = rng.choice(models)
    exclude = frozenset(rng.sample(sorted(fresh.node_models), 2)) if rng.random() < 0.2 else frozenset()
    got = fresh.place(job, model, exclude)
    for f in forks:
        assert f.place(job, model, exclude) == got
        assert f.fits(job, model) == fresh.fits(job, model)
        assert f.most_free_on_a_node(model) == fresh.most_free_on_a_node(model)
    if got is not None:
        fresh.take(got)
        for f in forks:
            f.take(got)
    return got


@pytest.mark.parametrize("seed", range(1, 13))
def test_journaling_forks_equal_fresh_builds_and_give_their_base_back(seed: int) -> None:
    rng = random.Random(seed)
    nodes = _nodes(rng.choice([9, 16]))
    base = Capacity(nodes, [])
    running: dict[int, Allocation] = {}
    kept: list[tuple[ExitStack, Capacity, object]] = []  # trials kept open, and what they must show
    next_id = 1
    started = 0
    lazy_zero = 0  # cycles whose fork put nodes into a bucket 0 its base holds out of order
    for cycle in range(120):
        # Between cycles the base changes as a capacity index changes it: ends, then starts.
        for job_id in [j for j in running if rng.random() < 0.3]:
            base.release(running.pop(job_id))
        builder = Capacity(nodes, _running(running))
        for _ in range(rng.randrange(0, 6)):
            got = _place_same(rng, builder, [], next_id)
            if got is not None:
                running[next_id] = got
                base.occupy(got)
            next_id += 1
        for _, fork, state in kept:
            assert _state(fork) == state, f"cycle {cycle}: a fork kept alive changed with its base"
        base._reclaim()  # a kept fork's writes show in its base until the base takes them back
        before = _content(base)
        trial = ExitStack()
        fork = trial.enter_context(base.trial())
        assert fork._journal is not None  # the fast path: a lending base
        fresh = Capacity(nodes, _running(running))
        if rng.random() < 0.3:  # not always: reading `buckets` puts in order what the fork would touch unsorted
            assert _state(fork) == _state(fresh), f"cycle {cycle}: fork != fresh build"
        assert fork._lent is None and (fork.fork()._journal is None)  # a fork forks by a full copy
        # The cycle writes to its fork: starts (and now and then a release), as on a fresh build.
        taken: dict[int, Allocation] = {}
        for _ in range(rng.randrange(0, 8)):
            got = _place_same(rng, fresh, [fork], next_id)
            if got is not None:
                taken[next_id] = got
                started += 1
            next_id += 1
        lazy_zero += any((m, 0) in (fork._lazy or ()) for m in fork._zero_added or ())
        holding = {**running, **taken}  # what the fork holds now
        if running and rng.random() < 0.3:
            victim = rng.choice(sorted(running))
            fresh.release(running[victim])
            fork.release(running[victim])
            del holding[victim]
        assert _state(fork) == _state(fresh), f"cycle {cycle}: fork's writes != fresh build's"
        if rng.random() < 0.3:  # a fork's fork: a full copy in canonical order, independent
            child = fork.fork()
            assert child._journal is None
            assert _state(child) == _state(Capacity(nodes, _running(holding))), f"cycle {cycle}: fork's fork"
            _place_same(rng, Capacity(nodes, _running(holding)), [child], next_id)
            next_id += 1
            assert _state(fork) == _state(fresh), f"cycle {cycle}: writing to a fork's fork changed the fork"
        if rng.random() < 0.25:
            kept.append((trial, fork, _state(fork)))  # open across the next base changes: detached then
            for old, _, _ in kept[:-3]:
                old.close()  # detached already: its end undoes nothing of the base's
            kept = kept[-3:]
        else:
            trial.close()  # the block's end undoes the journal at once
            assert base._lent is None
            assert _content(base) == before, f"cycle {cycle}: the fork's writes stayed in its base"
    assert started > 20, "the history started too little: it tests little"
    assert lazy_zero > 0, "no fork wrote to an unsorted bucket 0: the history tests little"


def test_a_trial_is_undone_when_its_block_ends_and_an_open_one_is_detached() -> None:
    """The end of a trial's block undoes its journal then, not at the base's next change (nor
    when a garbage collector gets to it), even when the block ends by an error; a copy used
    after its block fails loudly instead of reading its base. A trial still open when its base
    opens another keeps what it took; the new one does not see it."""
    nodes = _nodes(4)
    base = Capacity(nodes, [])
    job = JobRequest(1, 8.0, team="a", priority=Priority(1), submitted_at=0.0)
    before = _content(base)
    with base.trial() as fork:
        fork.take(fork.place(job, "H100"))
        assert base._lent is not None and _content(base) != before
    assert base._lent is None
    assert _content(base) == before
    with pytest.raises(AttributeError):
        fork.place(job, "H100")
    with pytest.raises(RuntimeError), base.trial() as failing:
        failing.take(failing.place(job, "H100"))
        raise RuntimeError("the cycle failed")
    assert base._lent is None and _content(base) == before
    with base.trial() as first:
        alloc = first.place(job, "H100")
        assert alloc is not None
        first.take(alloc)
        mine = _state(first)
        with base.trial() as second:  # `first` still open: it detaches, the base undoes its writes
            assert first._journal is None
            assert _state(first) == mine
            assert _state(second) == _state(Capacity(nodes, []))
            second.take(alloc)
            assert _state(first) == mine
        assert _content(base) == before
    assert _state(first) == mine  # detached: its own copies, still readable
    assert _content(base) == before


def test_decide_leaves_the_garbage_collector_to_its_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector is process-wide (a head's API threads share it): decide() never switches it
    off; the simulator pauses it around its own calls (`gc_paused`), and only if it was on."""
    import gc

    from gpucluster.core.capacity_index import CapacityIndex
    from gpucluster.core.scheduler import decide, gc_paused
    from gpucluster.core.snapshot import Snapshot

    def forbidden() -> None:
        raise AssertionError("decide() switched the garbage collector off")

    nodes = tuple(_nodes(4))
    job = JobRequest(1, 2.0, team="a", priority=Priority(1), submitted_at=0.0)
    index = CapacityIndex()
    with monkeypatch.context() as m:
        m.setattr(gc, "disable", forbidden)
        plan = decide(Snapshot(nodes, (), (job,), capacity=index), now=1.0)
    assert [s.job_id for s in plan.starts] == [1]
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_share_of_a_gpu_already_in_use_changes_the_version() -> None:
    """`Capacity.version` tells caches of what fits (`scheduler._Cycle._fits_unreserved`'s
    `_fit_at`) that the capacity changed. A share taken on a GPU another job already shares
    changes no free GPU count, yet what fits: it must change the version too. (It did not: a
    later job's wait said it was behind a reservation on a GPU that no longer had room, found
    by test_scheduler_properties.py's shared-answers property.)"""
    cap = Capacity((node("n").gpus(1).build(),), (shared(1, "n", 0, 0.5),))
    half = job(2).gpus(0.5).memory(H100_MB // 2).build()
    assert cap.fits(half, "H100")
    placed = cap.place(half, "H100", frozenset())
    assert placed is not None
    before = cap.version
    cap.take(placed)
    assert cap.version != before and not cap.fits(half, "H100")
    before = cap.version
    cap.release(placed)
    assert cap.version != before and cap.fits(half, "H100")
