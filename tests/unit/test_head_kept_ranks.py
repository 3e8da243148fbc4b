"""The head keeps `las-gittins` ranks across plans as the simulator does (head/kept_ranks.py,
core/rank_book.py; issues 15 and 25): after every plan over a history of submissions, runs that
end, requeues and cancels, the kept book's ranks equal `attained.gittins_ranks` worked out anew
from a fresh read of the store and a whole look-up of the learned run times, while the book
ranked incrementally (it did not start again each plan). A real store file, the real head loop,
a fake executor and an injected clock; `decide` is spied on (the real one runs) to see the
snapshot each plan was made on."""

from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucluster.core.attained import gittins_ranks, ranks
from gpucluster.core.cluster_state import StateMismatch
from gpucluster.core.policy import Policy
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.states import JobState
from gpucluster.core.types import Plan
from gpucluster.head import loop
from gpucluster.head.policy_source import PolicySource

from .headkit import T0, Cluster, make_cluster

POLICY = """\
priorities: true
fair_share: {enabled: true, half_life: 7d}
backfill: {enabled: true, default_time_limit: 1h}
preemption: {enabled: true, grace_period: 30s, min_runtime: 0s}
ordering:
  mode: las
  queues: [2m, 20m]
  promote_after: 30m
  preempt: true
  min_slice: 1m
  runtime_model: gittins
  relearn_every: 0s
"""


# Plain `las`: the head keeps its ranks in the same book (only those above queue 0 named).
PLAIN = POLICY.replace("  runtime_model: gittins\n", "")
# Learned runs taken into the queued jobs' kinds at most every 10 minutes (the shipped default).
RELEARN = POLICY.replace("relearn_every: 0s", "relearn_every: 10m")


@pytest.fixture(params=["gittins", "plain"])
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY if request.param == "gittins" else PLAIN)
    c = make_cluster(tmp_path, gpus=8, nodes=2, policy=PolicySource(path))
    c.fake.exit_on_signal[int(signal.SIGTERM)] = 143  # a stopped job exits: requeued
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[Snapshot]:
    """The snapshots the loop planned on, in order (the real `decide` plans)."""
    seen: list[Snapshot] = []

    def spy(snap: Snapshot, *args: Any, **kw: Any) -> Plan:
        seen.append(snap)
        return decide(snap, *args, **kw)

    monkeypatch.setattr(loop, "decide", spy)
    return seen


def want_ranks(c: Cluster, snap: Snapshot, policy: Policy, now: float) -> dict[int, float]:
    """`gittins_ranks` from scratch: the store's attained service read now, and every queued
    job's run times looked up whole; under plain `las`, `attained.ranks`' ranks above 0."""
    if not policy.ordering.gittins:
        got = ranks(snap.queued, policy.ordering, c.store.attained_gpu_seconds(), {}, now)
        return {k: v for k, v in got.items() if v}
    dists = c.head.runtime.fresh_distributions(snap.queued, c.head.node_feed.nodes)
    return gittins_ranks(snap.queued, policy.ordering, c.store.attained_gpu_seconds(), dists, now)


def test_the_heads_kept_ranks_equal_gittins_ranks_over_a_history(cluster: Cluster, planned: list[Snapshot]) -> None:
    c, rnd = cluster, random.Random(25)
    policy = c.head.policy
    assert policy.ordering.mode == "las"
    t = T0
    compared = ranked_with_history = ran_before = ranked_above_0 = 0
    for step in range(60):
        for _ in range(rnd.randint(0, 4)):  # submissions: two workloads, three teams, a few sizes
            c.submit(
                gpus=rnd.choice([1, 2, 4]),
                name=rnd.choice(["train", "eval"]),
                team=rnd.choice(["vision", "nlp", "speech"]),
                time_limit="1h",
            )
        running = [j for j in c.fake.running() if c.state(j) is JobState.RUNNING]
        for job in running:
            roll = rnd.random()
            if roll < 0.3:
                c.fake.finish(job, 0)  # a run ends: its kind learns a run time
            elif roll < 0.4 and c.record(job).stop_reason is None:
                c.service.requeue(job)  # stopped, then queued again with attained service
        if step % 13 == 12:
            queued = [r.id for r in c.store.list_jobs() if r.state is JobState.QUEUED]
            if queued:
                c.service.cancel(rnd.choice(queued))
        before = len(planned)
        t += rnd.choice([20.0, 45.0, 90.0, 300.0])
        c.tick_at(t)
        if len(planned) == before:
            continue  # nothing planned this tick
        snap = planned[-1]
        book = snap.rank_book
        assert book is not None  # the head hands the core its kept book, as the simulator does
        rebuilds = book.rebuilds
        got = book.ranks(snap.queued, policy.ordering, snap.attained, snap.runtime_dist, t, snap.queue_index)
        assert book.rebuilds == rebuilds  # the answer the plan had, kept, not worked out again
        assert got == want_ranks(c, snap, policy, t)
        compared += 1
        ranked_with_history += sum(1 for q in snap.queued if q.job_id in snap.runtime_dist)
        ran_before += sum(1 for q in snap.queued if q.job_id in snap.attained)
        ranked_above_0 += sum(1 for r in got.values() if r >= 1.0)
    # The history exercised what the book keeps: learned run times (Gittins ranks), requeued
    # jobs in a later queue, and many plans ranked incrementally (a handful of fresh starts: the
    # first plan, a queue handed without the index when a plan's queue was not the whole queue).
    assert compared >= 40
    assert (ranked_with_history > 0) == policy.ordering.gittins and ran_before > 0 and ranked_above_0 > 0
    assert c.head.ranks.book.rebuilds <= compared // 4


def test_check_mode_catches_a_kept_rank_that_went_wrong(cluster: Cluster, planned: list[Snapshot]) -> None:
    """Check mode (on in the tests) compares the book with `gittins_ranks` after each plan: a
    kept rank changed behind its back is a StateMismatch, not a silent misorder."""
    c = cluster
    c.submit(gpus=8, name="train", team="vision", time_limit="1h")
    c.submit(gpus=8, name="train", team="vision", time_limit="1h")
    c.tick_at(T0)
    c.submit(gpus=8, name="train", team="vision", time_limit="1h")
    c.tick_at(T0 + 1)
    book = planned[-1].rank_book
    assert book is not None and planned[-1].queued
    job_id = planned[-1].queued[0].job_id
    book._out[job_id] = book._out.get(job_id, 0.0) + 1.0  # what a missed change would leave
    c.submit(gpus=8, name="eval", team="nlp", time_limit="1h")
    with pytest.raises(StateMismatch, match="kept Gittins ranks" if c.head.policy.ordering.gittins else "kept LAS"):
        c.head._schedule(T0 + 2)


def test_dry_run_plans_on_copies_not_the_loops_kept_maps(cluster: Cluster) -> None:
    """`submit --dry-run` plans on API threads from `last_snapshot`: it carries no book and not
    the maps the loop keeps writing."""
    c = cluster
    c.submit(gpus=8, name="train", team="vision", time_limit="1h")
    c.submit(gpus=8, name="train", team="vision", time_limit="1h")
    c.submit(gpus=8, name="train", team="vision", time_limit="1h")
    c.tick_at(T0)
    snap = c.head.last_snapshot
    assert snap is not None and snap.queued
    assert snap.rank_book is None
    assert type(snap.attained) is dict and type(snap.runtime_dist) is dict


def test_runs_reach_the_queued_jobs_at_the_next_relearn_and_check_mode_holds_meanwhile(
    tmp_path: Path, planned: list[Snapshot]
) -> None:
    """`relearn_every: 10m`: a run that ends leaves its kind's queued jobs on the distribution
    they had (check mode, on in the tests, passes them over as lagging) until a plan 10 minutes
    after the last relearn, which gives them the whole look-up."""
    path = tmp_path / "policy.yaml"
    path.write_text(RELEARN)
    c = make_cluster(tmp_path, gpus=8, nodes=1, policy=PolicySource(path))
    try:
        nodes = c.head.node_feed.nodes
        jobs = [c.submit(gpus=8, name="train", team="vision", time_limit="1h") for _ in range(6)]
        t = T0
        c.tick_at(t)
        for job in jobs[:3]:  # three runs of 700 s, each learned at a relearn (over 10 minutes apart)
            assert c.state(job) is JobState.RUNNING
            t += 700
            c.fake.finish(job, 0)
            c.tick_at(t)
        relearned_at = t
        snap = planned[-1]
        waiting = [q.job_id for q in snap.queued]
        assert waiting == jobs[3:]  # the plan on it starts jobs[3]
        before = {j: snap.runtime_dist[j] for j in waiting}
        assert all(d.values == (700.0, 700.0, 700.0) for d in before.values())
        t += 60
        c.fake.finish(jobs[3], 0)  # a run of 60 s, a minute after the last relearn
        c.tick_at(t)
        snap = planned[-1]
        waiting = [q.job_id for q in snap.queued]
        assert waiting == jobs[4:]  # the plan on it starts jobs[4]
        assert all(snap.runtime_dist[j] is before[j] for j in waiting)  # not taken in yet
        assert set(waiting) <= c.head.runtime.lagging(snap.queued)
        fresh = c.head.runtime.fresh_distributions(snap.queued, nodes)
        assert all(fresh[j].values == (60.0, 700.0, 700.0, 700.0) for j in waiting)  # what it lags
        waiting = jobs[5:]  # (jobs[4] started on that plan: it left the kept map)
        c.tick_at(relearned_at + 599)
        assert all(planned[-1].runtime_dist[j] is before[j] for j in waiting)
        c.tick_at(relearned_at + 600)
        snap = planned[-1]
        assert [q.job_id for q in snap.queued] == waiting
        assert all(snap.runtime_dist[j].values == (60.0, 700.0, 700.0, 700.0) for j in waiting)
        assert not c.head.runtime.lagging(snap.queued)
    finally:
        c.close()
