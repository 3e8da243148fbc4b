"""The cluster state fed by events (core/cluster_state.py) and the head's check mode (issue 15).

The state must equal a fresh build after any history of events, and its told queue index must
hand `decide` the same lines as a fresh sort; the head's check mode must name a job the store
has and the event-fed queue missed (a write no event told), rather than plan without it.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from gpucluster.core.cluster_state import ClusterState, StateMismatch
from gpucluster.core.events import (
    Checkpointed,
    Drained,
    Ended,
    Held,
    NodeDown,
    NodeUp,
    Released,
    Started,
    StopRequested,
    Submitted,
    Undrained,
)
from gpucluster.core.lifecycle import StopReason
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy
from gpucluster.core.queueing import sort_in_plain
from gpucluster.core.reasons import WaitFacts
from gpucluster.core.states import JobState
from gpucluster.core.types import Drain, JobRequest, Node, Priority, RunningJob
from gpucluster.models import ProgressIn
from gpucluster.store import JobRecord, Store, schema
from gpucluster.store.store import DatabaseUnavailable

from .builders import job, node, running
from .headkit import Cluster, make_cluster


class _Nodes:
    """What the nodes are, kept beside the events as a store would: the live nodes, and each
    drained node's drain (None: no reason given), up or down."""

    def __init__(self) -> None:
        self.up: dict[str, Node] = {}
        self.drained: dict[str, Drain | None] = {}

    def fresh(self, queued: dict[int, JobRequest], state: ClusterState) -> ClusterState:
        return ClusterState.build(
            queued=queued.values(),
            running=state.running.values(),
            nodes=self.up.values(),
            drained=[n for n, d in self.drained.items() if d is None],
            drains={n: d for n, d in self.drained.items() if d is not None},
        )


def _node_event(rng: random.Random, state: ClusterState, nodes: _Nodes) -> None:
    """A failure, a repair (or a spare: the same node again, maybe with other GPUs), a drain
    with or without its why and end (again: the latest replaces it), or its end."""
    name = f"n{rng.randrange(1, 6)}"
    roll = rng.random()
    if roll < 0.3:
        n = node(name).gpus(rng.choice((4, 8))).build()
        nodes.up[name] = n
        state.apply(NodeUp(n))
    elif roll < 0.5:
        nodes.up.pop(name, None)  # its drain stays
        state.apply(NodeDown(name))
    elif roll < 0.8:
        drain = rng.choice((None, Drain("maintenance"), Drain("upgrade", until=rng.choice((100.0, 5000.0)))))
        nodes.drained[name] = drain
        state.apply(Drained(name, drain))
    else:
        nodes.drained.pop(name, None)
        state.apply(Undrained(name))


def _random_history(
    rng: random.Random, steps: int, state: ClusterState, queued: dict[int, JobRequest], nodes: _Nodes
) -> None:
    next_id = max(queued, default=0) + 1 + len(state.running)
    for _ in range(steps):
        if rng.random() < 0.25:
            _node_event(rng, state, nodes)
            continue
        roll = rng.random()
        if roll < 0.5 or not queued:
            j = (
                job(next_id)
                .gpus(rng.choice((1, 2, 4)))
                .team(rng.choice("ab"))
                .priority(rng.choice(("low", "normal", "high")))
                .build()
            )
            # as the head's store has them: queued at the submit, or again later (a requeue);
            # now and then held by its user or an array's element (what eligibility may keep back)
            j = replace(
                j,
                queued_at=j.submitted_at + rng.choice((0.0, 0.0, 5.0, 500.0)),
                held=rng.random() < 0.1,
                array_id=rng.choice((None, None, None, 7)),
            )
            next_id += 1
            queued[j.job_id] = j
            state.apply(Submitted(j))
        elif roll < 0.65:
            job_id = rng.choice(list(queued))
            state.apply(Started(running(job_id, "n1", 0, priority=rng.choice(("low", "normal")))))
            del queued[job_id]
        elif roll < 0.7 and state.running:
            state.apply(Checkpointed(rng.choice(list(state.running)), float(rng.randrange(100))))
        elif roll < 0.73 and state.running:  # a stop under way (the job keeps its place and checkpoint)
            stopped = state.running[rng.choice(list(state.running))]
            state.apply(StopRequested(replace(stopped, stopping=True), StopReason.PREEMPT))
        elif roll < 0.85:
            job_id = rng.choice(list(queued))
            state.apply(Ended(job_id))
            del queued[job_id]
        else:  # a changed request replaces the old
            job_id = rng.choice(list(queued))
            j = job(job_id).gpus(8).team("b").build()
            queued[job_id] = j
            state.apply(Submitted(j))
        if rng.random() < 0.5:  # the tuples a snapshot takes, kept between events, are the maps'
            assert state.queued_jobs() == tuple(state.queued.values())
            assert state.running_jobs() == tuple(state.running.values())
            by_class = state.running_by_class()  # ... and so is the running jobs' split by class
            assert by_class.running is state.running_jobs()
            split: dict[int, tuple[dict[int, RunningJob], dict[int, RunningJob]]] = {}
            for r in state.running.values():
                split.setdefault(int(r.priority), ({}, {}))[r.last_checkpoint_at is None][r.job_id] = r
            assert {c: parts for c, parts in by_class.classes.items() if parts != ({}, {})} == split
            # ... and its stopping jobs, in the running jobs' order
            assert by_class.stopping == tuple(r for r in state.running.values() if r.stopping)
            # ... and its checkpointed jobs by class and GPUs, oldest checkpoint first though
            # checkpoints come out of time order here (the victim pool stops at the first too old)
            assert by_class.recent is not None
            recent = {(c, n): list(g.values()) for c, groups in by_class.recent.items() for n, g in groups.items() if g}
            in_order: dict[tuple[int, float], list[RunningJob]] = {}
            for r in sorted(state.running.values(), key=lambda r: r.last_checkpoint_at or 0.0):
                if r.last_checkpoint_at is not None:
                    in_order.setdefault((int(r.priority), r.allocation.gpu_count), []).append(r)
            assert {k: [r.last_checkpoint_at for r in g] for k, g in recent.items()} == {
                k: [r.last_checkpoint_at for r in g] for k, g in in_order.items()
            }
            assert {k: {r.job_id for r in g} for k, g in recent.items()} == {
                k: {r.job_id for r in g} for k, g in in_order.items()
            }


@pytest.mark.parametrize("seed", range(20))
def test_a_state_fed_by_events_equals_a_fresh_build_and_its_index_a_fresh_sort(seed: int) -> None:
    rng = random.Random(seed)
    policy = Policy(priorities=True)
    state = ClusterState()
    queued: dict[int, JobRequest] = {}
    nodes = _Nodes()
    first_diffs = None
    for step in range(4):  # the index is used between histories, as a cycle would
        _random_history(rng, 60 + step, state, queued, nodes)
        state.check(nodes.fresh(queued, state))
        # the jobs a cycle's eligibility must look at (head/gates.py skips its pass without any)
        assert state.gated == {i for i, j in queued.items() if j.held or j.after or j.array_id is not None}
        now = 1000.0
        queue = tuple(state.queued.values())
        state.queue_index.update(queue, policy)
        if first_diffs is None:
            first_diffs = state.queue_index.diffs  # its first use builds it from the queue
        assert state.queue_index.diffs == first_diffs  # after that, what it was told was enough
        assert state.queue_index.sorted_in(policy, now) == sort_in_plain(queue, policy, now)


def test_check_names_each_kind_of_difference() -> None:
    state = ClusterState()
    held = Held("a", WaitFacts(team="a"))
    for e in (NodeUp(node("n1").gpus(8).build()), NodeUp(node("n2").gpus(8).build()), Drained("n1"), held):
        state.apply(e)
    state.apply(Submitted(job(1).build()))
    state.apply(Submitted(job(2).build()))
    state.apply(Started(running(3, "n1", 0)))
    fresh = ClusterState.build(
        queued=[job(1).build(), job(2).priority(Priority.HIGH).build(), job(4).build()],
        nodes=[node("n1").gpus(8).build()],
        drained=["n1"],
        holds={"a": WaitFacts(team="a")},
    )
    with pytest.raises(StateMismatch) as e:
        state.check(fresh)
    text = str(e.value)
    assert "queued job: 1 in a fresh build but not kept, e.g. [4]" in text
    assert "queued job 2: kept" in text
    assert "running job: 1 kept but not in a fresh build, e.g. [3]" in text
    assert "node: 1 kept but not in a fresh build, e.g. ['n2']" in text
    for e2 in (NodeDown("n2"), Ended(3), Undrained("n1"), Drained("n1"), Released("a"), Held("a", WaitFacts(team="a"))):
        state.apply(e2)
    state.apply(Submitted(job(2).priority(Priority.HIGH).build()))
    state.apply(Submitted(job(4).build()))
    state.check(fresh)


@pytest.mark.parametrize(
    ("values", "names"),
    [
        # the running job back in the queue: its id is below what the head has read, so no
        # incremental read sees it
        ({"state": "queued"}, r"queued job: 1 in a fresh build but not kept, e.g. \[{first}\]"),
        # a stop of the running job: no store method told it
        ({"stop_reason": "cancel"}, r"running job {first}: kept RunningJob\(.*stopping=False"),
    ],
)
def test_the_heads_check_mode_names_a_job_no_event_told(tmp_path: Path, values: dict[str, str], names: str) -> None:
    """A write behind the loop's back (raw SQL: nothing tells the head) is named by check mode,
    rather than planned on as if it had not happened."""
    c = make_cluster(tmp_path, gpus=2)
    try:
        c.head.check_state = True
        first = c.submit(gpus=2, command=["a"])
        second = c.submit(gpus=2, command=["b"])
        c.tick_at(c.clock.t + 1)
        assert c.state(first) is JobState.RUNNING and c.state(second) is JobState.QUEUED
        c.tick_at(c.clock.t + 0.1)  # consistent: no error
        with c.store._writer.begin() as conn:
            conn.execute(update(schema.jobs).where(schema.jobs.c.id == first).values(**values))
        with pytest.raises(StateMismatch, match=names.format(first=first)):
            c.tick_at(c.clock.t + 0.1)
    finally:
        c.close()


def test_a_start_the_database_lost_is_planned_again_with_no_mismatch(tmp_path: Path) -> None:
    """The loop tells the queue a job started before it commits the start; when the commit fails
    (the database went away: the PostgreSQL restart test), the job is still queued in the store,
    and the next cycle must read it back, not wait for the next full reload (check mode raised)."""
    c = make_cluster(tmp_path, gpus=2)
    try:
        c.head.check_state = True
        c.tick_at(c.clock.t + 1)  # the first, full read behind it: later reads are incremental
        first = c.submit(gpus=2, command=["a"])
        real = c.store.transition

        def lost(*args: object, **kwargs: object) -> bool:
            raise DatabaseUnavailable("database unavailable: test")

        c.store.transition = lost  # type: ignore[method-assign]
        with pytest.raises(DatabaseUnavailable):
            c.tick_at(c.clock.t + 1)
        c.store.transition = real  # type: ignore[method-assign]
        assert c.state(first) is JobState.QUEUED
        c.tick_at(c.clock.t + 0.1)  # before the 5 s full reload: no StateMismatch, and it starts
        assert c.state(first) is JobState.RUNNING
    finally:
        c.close()


def test_submissions_committed_while_the_check_reads_are_no_mismatch(tmp_path: Path) -> None:
    """Check mode reads the store's queue while the API keeps committing submissions. One committed
    after the check's own incremental read, before its second fresh read, was called missed
    (StateMismatch "queued job 3 in a fresh build but not kept") although the next incremental
    read takes it by design: the PostgreSQL restart test, whose wave of submissions races the
    loop's slower reads there. Here the two submissions commit at those very moments."""
    c = make_cluster(tmp_path, gpus=1)
    try:
        c.head.check_state = True
        c.submit(gpus=1, command=["a"])
        c.tick_at(c.clock.t + 1)  # it runs and holds the GPU; later reads are incremental
        real = c.store.queued_requests
        reads = 0
        late: list[int] = []

        def racing(after_id: int | None = None, known: Any = None) -> list[JobRequest]:
            nonlocal reads
            rows = real(after_id, known)
            reads += 1
            if reads in (1, 3):  # after the cycle's read, and after the check's own re-read
                late.append(c.submit(gpus=1, command=["b"]))
            return rows

        c.store.queued_requests = racing  # type: ignore[method-assign]
        c.tick_at(c.clock.t + 0.1)  # no StateMismatch
        c.store.queued_requests = real  # type: ignore[method-assign]
        assert late
        c.tick_at(c.clock.t + 0.1)  # the next incremental read takes them, still consistent
        assert [r.job_id for r in c.head.queue.requests()] == late
        # A job the check has read past and not been told of is still a mismatch.
        with c.store._writer.begin() as conn:
            conn.execute(update(schema.jobs).where(schema.jobs.c.id == late[0]).values(state=JobState.CANCELLED.value))
        with pytest.raises(StateMismatch, match=rf"queued job: 1 kept but not in a fresh build, e.g. \[{late[0]}\]"):
            c.tick_at(c.clock.t + 0.1)
    finally:
        c.close()


def _cancel_from_another_thread(c: Cluster, job_id: int) -> None:
    """An API cancel, committed and told on its own thread (as the API's threads do)."""
    writer = threading.Thread(target=c.store.request_stop, args=(job_id, "cancel", c.clock.t))
    writer.start()
    writer.join(60)
    assert not writer.is_alive()


@pytest.mark.parametrize("read", ["running_jobs", "list_jobs"])
def test_stops_committed_while_the_check_reads_twice_in_a_row_are_no_mismatch(tmp_path: Path, read: str) -> None:
    """A cancel committed between the check's refresh and its fresh read shows a difference that
    is not one; the check read again once and called a second such difference a mismatch. Here a
    cancel commits before each of the check's first two fresh reads: of the cluster state
    (`running_jobs`) or of the running jobs' records (`list_jobs`). It is read again for as long
    as stops overlap its reads, and a write behind every watcher's back is still named."""
    c = make_cluster(tmp_path, gpus=3)
    try:
        c.head.check_state = True
        jobs = [c.submit(gpus=1, command=[name]) for name in "abc"]
        c.tick_at(c.clock.t + 1)
        assert all(c.state(j) is JobState.RUNNING for j in jobs)
        real = getattr(c.store, read)
        cancels = iter(jobs[:2])

        def racing(*args: Any, **kwargs: Any) -> Any:
            job_id = next(cancels, None)
            if job_id is not None:
                _cancel_from_another_thread(c, job_id)
            return real(*args, **kwargs)

        setattr(c.store, read, racing)
        c.tick_at(c.clock.t + 0.1)  # no StateMismatch
        assert next(cancels, None) is None  # both cancels raced the check's reads
        setattr(c.store, read, real)
        _kept_running_equals_the_store(c)
        with c.store._writer.begin() as conn:  # behind every watcher's back: still a mismatch
            conn.execute(update(schema.jobs).where(schema.jobs.c.id == jobs[2]).values(stop_reason="cancel"))
        with pytest.raises(StateMismatch):
            c.tick_at(c.clock.t + 0.1)
    finally:
        c.close()


def test_a_stop_told_only_after_the_checks_read_saw_it_is_no_mismatch(tmp_path: Path) -> None:
    """A write commits, the check's fresh read sees it, and only then are the watchers told (the
    writer's thread was descheduled between its commit and its telling). The check waits for
    that telling before it reads again, rather than calling the difference a mismatch."""
    c = make_cluster(tmp_path, gpus=2)
    try:
        c.head.check_state = True
        jobs = [c.submit(gpus=1, command=[name]) for name in "ab"]
        c.tick_at(c.clock.t + 1)
        committed, tell = threading.Event(), threading.Event()

        def slow_to_tell(job_id: int) -> None:
            committed.set()
            assert tell.wait(60)

        c.store._running_watchers.insert(0, slow_to_tell)
        real_read, real_wait = c.store.running_jobs, c.store.wait_running_changes_told
        reads = 0
        writer = threading.Thread(target=c.store.request_stop, args=(jobs[0], "cancel", c.clock.t))

        def read_after_the_commit() -> list[RunningJob]:
            nonlocal reads
            reads += 1
            if reads == 1:
                writer.start()
                assert committed.wait(60)
            rows = real_read()
            if reads == 2:  # the old check's second read: told only after it
                tell.set()
            return rows

        def waiting(timeout_s: float) -> bool:
            tell.set()  # the writer's thread runs again while the check waits for it
            return real_wait(timeout_s)

        c.store.running_jobs = read_after_the_commit  # type: ignore[method-assign]
        c.store.wait_running_changes_told = waiting  # type: ignore[method-assign]
        try:
            c.tick_at(c.clock.t + 0.1)  # no StateMismatch
        finally:
            tell.set()
            writer.join(60)
            c.store._running_watchers.remove(slow_to_tell)
            c.store.running_jobs = real_read  # type: ignore[method-assign]
            c.store.wait_running_changes_told = real_wait  # type: ignore[method-assign]
        assert reads >= 2
        _kept_running_equals_the_store(c)
    finally:
        c.close()


def test_a_restart_whose_commit_was_lost_in_answer_is_read_back_with_no_mismatch(tmp_path: Path) -> None:
    """A requeue for a restart is committed, but the database goes away before it answers: the
    row is written, the call raises. Its id is below what the queue has read, so only a full read
    finds it: the loop reads the queue whole once a requeue was tried, whatever its outcome, not
    only once one is known to have committed (check mode raised; the job waited out the 5 s reload).
    The loop commits a cycle's ends in one `Store.batch`, so the answer is lost at its commit."""
    c = make_cluster(tmp_path, gpus=1)
    try:
        c.head.check_state = True
        first = c.submit(gpus=1, command=["a"], max_restarts=1)
        c.tick_at(c.clock.t + 1)
        assert c.state(first) is JobState.RUNNING
        real = c.store.batch

        @contextmanager
        def answer_lost() -> Iterator[None]:
            with real():
                yield
            raise DatabaseUnavailable("database unavailable: the server closed the connection")

        c.store.batch = answer_lost  # type: ignore[method-assign]
        c.fake.finish(first, 2)
        with pytest.raises(DatabaseUnavailable):
            c.tick_at(c.clock.t + 0.1)
        c.store.batch = real  # type: ignore[method-assign]
        assert c.state(first) is JobState.QUEUED
        c.tick_at(c.clock.t + 0.1)  # before the 5 s full reload: no StateMismatch
        assert [r.job_id for r in c.head.queue.requests()] == [first]
    finally:
        c.close()


def test_a_drain_says_why_and_until_when_and_outlasts_its_node_going_down() -> None:
    """The simulator's drain windows hold failed nodes too (sim/engine.py): a node that fails
    while drained comes back drained, with its drain's reason and end for the DRAINED wait."""
    state = ClusterState()
    n1 = node("n1").gpus(8).build()
    window = Drain("maintenance", until=3600.0)
    for e in (NodeUp(n1), Drained("n1", window), NodeDown("n1")):
        state.apply(e)
    state.check(ClusterState.build(drains={"n1": window}))
    state.apply(NodeUp(n1))  # repaired, or a spare in its place
    assert state.drained == {"n1"} and state.drains == {"n1": window}
    state.check(ClusterState.build(nodes=[n1], drains={"n1": window}))
    with pytest.raises(StateMismatch, match=r"drain of node n1: kept Drain\(reason='maintenance', until=3600.0\)"):
        state.check(ClusterState.build(nodes=[n1], drains={"n1": Drain("maintenance", until=7200.0)}))
    with pytest.raises(StateMismatch, match=r"drain of node: 1 kept but not in a fresh build"):
        state.check(ClusterState.build(nodes=[n1], drained=["n1"]))  # drained, but no why or end said
    state.apply(Drained("n1"))  # told again without a record: the old one is gone
    state.check(ClusterState.build(nodes=[n1], drained=["n1"]))
    state.apply(Undrained("n1"))
    assert not state.drained and not state.drains
    state.check(ClusterState.build(nodes=[n1]))


def _kept_running_equals_the_store(c: Cluster) -> None:
    c.head.running.refresh(c.clock.t)  # the writes of the cycle's last steps, as the next cycle reads them
    stored = [j for j, _ in Store.running_rows(c.store)]  # the class's: not the head's counted reads
    assert c.head.cluster.running == {j.job_id: j for j in stored}
    assert c.head.running.jobs() == tuple(sorted(stored, key=lambda j: j.job_id))
    assert c.head.running.records() == Store.list_jobs(c.store, states=[JobState.RUNNING])


def test_the_heads_running_jobs_follow_starts_stops_checkpoints_and_ends_with_no_full_read(tmp_path: Path) -> None:
    """The head keeps its running jobs from events (issue 15): each start, stop (an API cancel on
    another thread), checkpoint report, restart after a failure, requeue and end reaches the
    state, and the records the loop reconciles, without reading every running job again; the
    snapshot plans on them."""
    c = make_cluster(tmp_path, gpus=4)
    try:
        c.head.check_state = False  # check mode reads everything: here, count the loop's own reads
        ids = [c.submit(gpus=1, command=[f"j{i}"], max_restarts=1 if i == 2 else 0) for i in range(4)]
        c.tick_at(c.clock.t + 1)  # the first, full read behind it; all four start
        assert all(c.state(i) is JobState.RUNNING for i in ids)
        _kept_running_equals_the_store(c)
        full_reads = 0
        reads = c.store.running_records

        def counted(
            ids: Iterable[int] | None = None, known: Any = None
        ) -> tuple[list[tuple[RunningJob, str | None]], list[JobRecord]]:
            nonlocal full_reads
            full_reads += ids is None
            return reads(ids, known)

        c.store.running_records = counted  # type: ignore[method-assign]
        cancel = threading.Thread(target=c.service.cancel, args=(ids[0],))  # as the API's threads do
        cancel.start()
        cancel.join()
        c.service.progress(ids[1], ProgressIn(checkpoint_at=c.clock.t))
        c.tick_at(c.clock.t + 0.1)
        kept = c.head.cluster.running
        assert kept[ids[0]].stopping and kept[ids[1]].last_checkpoint_at == c.clock.t - 0.1
        _kept_running_equals_the_store(c)
        c.fake.finish(ids[0], 143, stopped=True)  # the cancel ends it
        c.fake.finish(ids[1], 0)
        c.fake.finish(ids[2], 1)  # fails: restarted after a backoff
        c.service.requeue(ids[3])
        c.tick_at(c.clock.t + 0.1)
        assert c.state(ids[0]) is JobState.CANCELLED and c.state(ids[1]) is JobState.SUCCEEDED
        assert c.head.cluster.running[ids[3]].stopping
        _kept_running_equals_the_store(c)
        c.fake.finish(ids[3], 143, stopped=True)
        c.tick_at(c.clock.t + 0.1)  # requeued and started again on the GPUs the others left
        c.tick_at(c.clock.t + 3)  # the failed one's backoff is over: it starts again
        assert c.record(ids[2]).attempt == 2 and c.record(ids[3]).attempt == 2
        _kept_running_equals_the_store(c)
        assert c.head.snapshot().running == c.head.running.jobs()
        assert full_reads == 0
    finally:
        c.close()


def test_the_heads_plans_use_the_states_told_capacity_index_without_comparing_every_running_job(
    tmp_path: Path,
) -> None:
    """One mode (issue 15): the head plans on the capacity index its cluster state keeps from the
    same events as the simulator's (starts, stops, ends), not on one of its own that compares
    every running job with the last plan's; its free GPUs are those of a fresh build."""
    c = make_cluster(tmp_path, gpus=4)
    try:
        ids = [c.submit(gpus=1, command=[f"j{i}"]) for i in range(6)]
        c.tick_at(c.clock.t + 1)  # four start, two wait
        index = c.head.cluster.capacity
        assert index.rebuilds == 1
        c.service.cancel(ids[0])  # a stop under way
        c.tick_at(c.clock.t + 0.1)
        c.fake.finish(ids[0], 143, stopped=True)
        c.fake.finish(ids[1], 0)
        c.tick_at(c.clock.t + 0.1)  # two end; the two waiting start on their GPUs
        c.tick_at(c.clock.t + 1.1)
        assert [c.state(i) for i in ids] == [JobState.CANCELLED, JobState.SUCCEEDED] + [JobState.RUNNING] * 4
        assert (index.rebuilds, index.diffs) == (1, 0)
        snap = c.head.snapshot()
        assert snap.capacity is index
        no_index = replace(snap, capacity=None, queue_index=None)
        free = index.capacity(snap.nodes, snap.running).free_count("H100")
        assert free == Capacity(no_index.nodes, no_index.running).free_count("H100") == 0
    finally:
        c.close()
