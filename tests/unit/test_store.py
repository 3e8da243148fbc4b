"""store.Store on a real SQLite file and a real PostgreSQL database (each test runs on both):
compare-and-set transitions, scheduler views, durability, schema versions."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from gpucluster.core.policy import Limit, Limits
from gpucluster.core.reasons import WaitFacts, WaitReason
from gpucluster.core.states import ALLOWED_TRANSITIONS, TERMINAL_STATES, JobState
from gpucluster.core.types import Allocation, JobRequest, NodeSlice, Priority, RunningJob, Wait
from gpucluster.store import AttemptRecord, DataDirUnwritable, QueueLimitReached, Store, StoreError
from gpucluster.store import store as store_module
from gpucluster.waits_text import stored

from .builders import allocation, node, spec
from .storekit import run_sql

STORE_BACKENDS = ("sqlite", "postgresql")  # tests/unit/conftest.py

T0 = 500.0


@pytest.fixture
def db(store_target: Path | str) -> Path | str:
    return store_target


@pytest.fixture
def store(db: Path | str) -> Iterator[Store]:
    s = Store(db)
    yield s
    s.close()


def start(store: Store, job_id: int, *indices: int, at: float = T0 + 1) -> bool:
    return store.transition(
        job_id,
        JobState.RUNNING,
        at,
        "started",
        expect=[JobState.QUEUED],
        allocation=allocation("n1", *indices),
        attempt=1,
        started_at=at,
    )


def test_create_job(store: Store) -> None:
    a = store.create_job(spec(gpus=2, gpu_type="H100", priority="high", team="vision"), T0)
    b = store.create_job(spec(name="named"), T0 + 1)
    assert (a, b) == (1, 2)
    ra, rb = store.get_job(a), store.get_job(b)
    assert ra is not None and rb is not None
    assert ra.name == "job-1" and rb.name == "named"
    assert ra.state is JobState.QUEUED and ra.reason == "submitted"
    assert (ra.gpus, ra.gpu_type, ra.priority, ra.team) == (2, "H100", Priority.HIGH, "vision")
    assert ra.attempt == 0 and ra.allocation is None and ra.launch is None
    assert ra.spec.gpu_type == "H100"
    assert ra.request() == JobRequest(a, 2, ("H100",), Priority.HIGH, T0, "vision")
    assert {r.job_id: r.queued_at for r in store.queued_requests()} == {a: T0, b: T0 + 1}
    assert [(e.at, e.state, e.reason) for e in store.events(a)] == [(T0, JobState.QUEUED, "submitted")]
    assert store.get_job(999) is None
    assert store.events(999) == []


# ---- transitions -------------------------------------------------------------------------------


def test_transition_is_compare_and_set(store: Store) -> None:
    job_id = store.create_job(spec(), T0)
    assert start(store, job_id, 0)
    # A second actor still believes the job is queued: it loses and changes nothing.
    assert not start(store, job_id, 1, at=T0 + 2)
    assert not store.transition(job_id, JobState.CANCELLED, T0 + 3, "cancel", expect=[JobState.QUEUED])
    record = store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.RUNNING
    assert record.allocation == allocation("n1", 0)
    assert record.started_at == T0 + 1
    assert [e.state for e in store.events(job_id)] == [JobState.QUEUED, JobState.RUNNING]


def test_compare_and_set_holds_across_two_store_instances(db: Path | str, store: Store) -> None:
    job_id = store.create_job(spec(), T0)
    other = Store(db)
    try:
        stale = other.get_job(job_id)
        assert stale is not None and stale.state is JobState.QUEUED
        assert store.transition(job_id, JobState.CANCELLED, T0 + 1, "cancelled", expect=[JobState.QUEUED])
        assert not start(other, job_id, 0)
    finally:
        other.close()
    record = store.get_job(job_id)
    assert record is not None and record.state is JobState.CANCELLED
    assert len(store.events(job_id)) == 2


def test_transition_without_expect_allows_any_legal_source(store: Store) -> None:
    job_id = store.create_job(spec(), T0)
    assert store.transition(job_id, JobState.CANCELLED, T0 + 1, "cancelled by user while queued")
    record = store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.CANCELLED
    assert record.ended_at == T0 + 1
    assert record.reason == "cancelled by user while queued"


def test_terminal_transition_sets_ended_at_and_fields(store: Store) -> None:
    job_id = store.create_job(spec(), T0)
    start(store, job_id, 0, 1)
    assert store.transition(job_id, JobState.FAILED, T0 + 9, "exit code 3", exit_code=3)
    record = store.get_job(job_id)
    assert record is not None
    assert (record.state, record.ended_at, record.exit_code, record.reason) == (
        JobState.FAILED,
        T0 + 9,
        3,
        "exit code 3",
    )
    assert store.running_allocations() == []


@pytest.mark.parametrize("terminal", sorted(TERMINAL_STATES))
@pytest.mark.parametrize("target", list(JobState))
def test_terminal_states_never_move(store: Store, terminal: JobState, target: JobState) -> None:
    job_id = store.create_job(spec(), T0)
    start(store, job_id, 0)
    assert store.transition(job_id, terminal, T0 + 2, f"to {terminal.value}")
    before = store.get_job(job_id)
    events_before = store.events(job_id)
    assert not store.transition(job_id, target, T0 + 3, "late")
    assert not store.transition(job_id, target, T0 + 3, "late", expect=[terminal])
    assert store.get_job(job_id) == before
    assert store.events(job_id) == events_before


@pytest.mark.parametrize(
    ("source", "target"),
    [(s, t) for s in (JobState.QUEUED, JobState.RUNNING) for t in JobState if t not in ALLOWED_TRANSITIONS[s]],
)
def test_illegal_transitions_from_live_states_are_refused(store: Store, source: JobState, target: JobState) -> None:
    job_id = store.create_job(spec(), T0)
    if source is JobState.RUNNING:
        start(store, job_id, 0)
    n = len(store.events(job_id))
    assert not store.transition(job_id, target, T0 + 5, "illegal", expect=[source])
    assert not store.transition(job_id, target, T0 + 5, "illegal")
    record = store.get_job(job_id)
    assert record is not None and record.state is source
    assert len(store.events(job_id)) == n


def test_requeue_clears_the_allocation(store: Store) -> None:
    job_id = store.create_job(spec(), T0)
    start(store, job_id, 3)
    assert store.transition(
        job_id, JobState.QUEUED, T0 + 20, "requeued", expect=[JobState.RUNNING], allocation=None, started_at=None
    )
    record = store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.QUEUED
    assert record.allocation is None and record.started_at is None and record.ended_at is None
    assert record.attempt == 1
    assert [r.job_id for r in store.queued_requests()] == [job_id]


def test_update_job_only_in_the_expected_state(store: Store) -> None:
    job_id = store.create_job(spec(), T0)
    assert not store.update_job(job_id, JobState.RUNNING, term_sent=True)
    start(store, job_id, 0)
    n = len(store.events(job_id))
    assert store.update_job(job_id, JobState.RUNNING, launch={"pid": 42}, stop_reason="cancel", term_sent=True)
    record = store.get_job(job_id)
    assert record is not None
    assert record.launch == {"pid": 42} and record.stop_reason == "cancel" and record.term_sent
    assert record.state is JobState.RUNNING
    assert len(store.events(job_id)) == n  # bookkeeping, not a transition


def test_a_batch_commits_its_writes_together_at_its_end(db: Path | str, store: Store) -> None:
    """`Store.batch` (issue 18: one commit for a cycle's starts or ends): inside the block each
    write is done (a compare-and-set still answers) but nothing is visible to another
    connection; at its end every write is, at once."""
    ids = [store.create_job(spec(), T0) for _ in range(3)]
    other = Store(db)
    try:
        with store.batch():
            assert start(store, ids[0], 0) and start(store, ids[1], 1)
            assert not start(store, ids[0], 2)  # already running: this transaction sees its own writes
            with store.batch():  # a nested block joins the outer one
                assert store.update_job(ids[1], JobState.RUNNING, launch={"pid": 7})
            assert [other.get_job(i).state for i in ids] == [JobState.QUEUED] * 3  # type: ignore[union-attr]
        states = [other.get_job(i) for i in ids]
    finally:
        other.close()
    assert [r.state for r in states if r is not None] == [JobState.RUNNING, JobState.RUNNING, JobState.QUEUED]
    assert states[1] is not None and states[1].launch == {"pid": 7}
    store.create_job(spec(), T0)  # the store writes alone again after the block


def test_a_batch_that_raises_writes_nothing(store: Store) -> None:
    ids = [store.create_job(spec(), T0) for _ in range(2)]
    with pytest.raises(RuntimeError), store.batch():
        assert start(store, ids[0], 0)
        raise RuntimeError("the second start failed")
    records = [store.get_job(i) for i in ids]
    assert [r.state for r in records if r is not None] == [JobState.QUEUED, JobState.QUEUED]
    assert len(store.events(ids[0])) == 1  # the submission only: the start's event went with it
    assert start(store, ids[0], 0)  # and the store writes again


# ---- scheduler views ---------------------------------------------------------------------------


def test_queued_requests_and_running_allocations(store: Store) -> None:
    q1 = store.create_job(spec(gpus=2, gpu_type="A100", priority="low", team="nlp"), T0)
    r1 = store.create_job(spec(gpus=2), T0 + 1)
    q2 = store.create_job(spec(), T0 + 2)
    done = store.create_job(spec(), T0 + 3)
    start(store, r1, 4, 5)
    start(store, done, 0)
    store.transition(done, JobState.SUCCEEDED, T0 + 4, "exit code 0", exit_code=0)

    assert sorted(store.queued_requests(), key=lambda r: r.job_id) == [
        JobRequest(q1, 2, ("A100",), Priority.LOW, T0, "nlp", queued_at=T0),
        JobRequest(q2, 1, (), Priority.NORMAL, T0 + 2, "default", queued_at=T0 + 2),
    ]
    assert store.running_allocations() == [(r1, allocation("n1", 4, 5))]
    assert store.count_jobs() == {"queued": 2, "running": 1, "succeeded": 1}


def test_list_jobs_filters(store: Store) -> None:
    ids = [store.create_job(spec(team="a" if i % 2 else "b"), T0 + i) for i in range(6)]
    start(store, ids[0], 0)
    assert [j.id for j in store.list_jobs()] == ids
    assert [j.id for j in store.list_jobs(states=[JobState.RUNNING])] == [ids[0]]
    assert [j.id for j in store.list_jobs(team="a")] == [ids[1], ids[3], ids[5]]
    assert [j.id for j in store.list_jobs(limit=2)] == ids[-2:]  # the newest, in id order
    assert [j.id for j in store.list_jobs(states=[JobState.QUEUED], team="b", limit=1)] == [ids[4]]
    assert store.queued_teams() == {i: ("a" if n % 2 else "b") for n, i in enumerate(ids) if n}


def test_list_jobs_pages_and_text(store: Store) -> None:
    """The dashboard's jobs page: a page of the newest first, a text filter on name, owner or id,
    and the total that matches, all under the same filters."""
    names = ["train-a", "TRAIN-b", "eval", "train_c", "trainac", "x"]
    ids = [store.create_job(spec(name=n), T0 + i, owner="bob" if n == "x" else "alice") for i, n in enumerate(names)]
    assert [j.id for j in store.list_jobs(limit=2, offset=1)] == ids[3:5]  # the 2nd and 3rd newest
    assert [j.id for j in store.list_jobs(limit=2, offset=5)] == ids[:1]
    assert store.list_jobs(limit=2, offset=6) == []
    assert [j.id for j in store.list_jobs(text="train")] == [ids[0], ids[1], ids[3], ids[4]]  # any case
    assert [j.id for j in store.list_jobs(text="n_")] == [ids[3]]  # `_` and `%` are no wildcards
    assert store.list_jobs(text="%") == []
    assert [j.id for j in store.list_jobs(text="BOB")] == [ids[5]]  # the owner
    assert [j.id for j in store.list_jobs(text=f"#{ids[2]}")] == [ids[2]]
    assert [j.id for j in store.list_jobs(text="train", limit=1, offset=1)] == [ids[3]]
    assert store.count_matching_jobs(text="train") == 4
    assert store.count_matching_jobs(states=[JobState.RUNNING]) == 0
    assert store.count_matching_jobs(teams=["default"], text="x") == 1


def test_run_seconds_sums_the_ended_attempts(store: Store) -> None:
    """A requeued job ran for its attempts' time, not from its latest start to its end."""
    job_id = store.create_job(spec(), T0)
    other = store.create_job(spec(), T0)
    for n, (begin, end) in enumerate([(T0 + 10, T0 + 70), (T0 + 300, T0 + 330)], start=1):
        assert store.transition(
            job_id, JobState.RUNNING, begin, "started", allocation=allocation("n1", 0), attempt=n, started_at=begin
        )
        ended = AttemptRecord(job_id, n, begin, end, allocation("n1", 0), "preempted", "requeued", (0,), None)
        assert store.transition(job_id, JobState.PREEMPTED, end, "requeued", ended_attempt=ended)
        assert store.transition(job_id, JobState.QUEUED, end, "requeued", allocation=None)
    assert store.run_seconds([job_id, other, 10**6]) == {job_id: pytest.approx(90.0)}


def test_list_jobs_by_ids_in_chunks(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Named jobs come in chunks of IN lists (PostgreSQL takes at most 65,535 parameters)."""
    ids = [store.create_job(spec(), T0 + i) for i in range(7)]
    monkeypatch.setattr(store_module, "IDS_PER_QUERY", 2)
    wanted = [ids[5], ids[0], ids[3], ids[6], 10**6]  # any order; one that does not exist
    assert [j.id for j in store.list_jobs(ids=wanted)] == [ids[0], ids[3], ids[5], ids[6]]
    assert [j.id for j in store.list_jobs(ids=wanted, states=[JobState.QUEUED], team="default")] == sorted(wanted[:4])
    assert store.list_jobs(ids=[]) == []
    with pytest.raises(ValueError, match="give one"):
        store.list_jobs(ids=ids, limit=1)


def test_set_wait_reasons_leaves_non_queued_jobs_alone(store: Store) -> None:
    queued = store.create_job(spec(), T0)
    running = store.create_job(spec(), T0)
    cancelled = store.create_job(spec(), T0)
    start(store, running, 0)
    store.transition(cancelled, JobState.CANCELLED, T0 + 1, "cancelled by user while queued")
    store.set_wait_reasons(
        {
            queued: Wait(WaitReason.RESERVED, WaitFacts(model="H100", gpus=8, reserved_at=900.0), 900.0),
            running: Wait(WaitReason.RESOURCES),
            cancelled: Wait(WaitReason.RESOURCES),
            999: Wait(WaitReason.RESOURCES),
        }
    )
    store.set_wait_reasons({})
    reasons = {j.id: (stored(j.reason) or j.reason, j.wait_reason, j.estimated_start) for j in store.list_jobs()}
    assert reasons == {
        # kept structured: the code and its numbers, no sentence
        queued: ({"code": "reserved", "model": "H100", "gpus": 8, "reserved_at": 900.0}, "reserved", 900.0),
        running: ("started", None, None),
        cancelled: ("cancelled by user while queued", None, None),
    }
    assert len(store.events(queued)) == 1  # a wait reason is not a transition


def test_queued_requests_carry_the_scheduler_fields_of_the_spec(store: Store) -> None:
    a = store.create_job(
        spec(gpus=8, gpu_type=["H100", "A100"], min_gpu_memory="40GiB", time_limit="2h", nodes=2, team="t"), T0
    )
    b = store.create_job(spec(gpus=0.25, priority="critical"), T0 + 1)
    c = store.create_job(spec(gpu_memory="10GiB"), T0 + 2)
    got = {r.job_id: r for r in store.queued_requests()}
    assert got[a] == JobRequest(
        a,
        8,
        ("H100", "A100"),
        Priority.NORMAL,
        T0,
        "t",
        min_gpu_memory_mb=40960,
        time_limit_s=7200.0,
        nodes=2,
        queued_at=T0,
    )
    assert got[b] == JobRequest(b, 0.25, (), Priority.CRITICAL, T0 + 1, queued_at=T0 + 1)
    assert got[b].fractional
    assert got[c] == JobRequest(c, 1, (), Priority.NORMAL, T0 + 2, gpu_memory_mb=10240, queued_at=T0 + 2)
    assert got[c].fractional
    assert [r.job_id for r in store.queued_requests(after_id=a)] == [b, c]
    record = store.get_job(a)
    assert record is not None and record.request() == replace(got[a], queued_at=None)


def test_running_jobs_view(store: Store) -> None:
    a = store.create_job(spec(gpus=2, team="vision", priority="low", time_limit=600), T0)
    b = store.create_job(spec(gpus=0.5), T0)
    queued = store.create_job(spec(), T0)
    start(store, a, 0, 1, at=T0 + 5)
    shared = Allocation((NodeSlice("n1", (2,), 0.5, 40960),))
    assert store.transition(b, JobState.RUNNING, T0 + 6, "started", allocation=shared, attempt=1, started_at=T0 + 6)
    assert store.request_stop(a, "preempt", T0 + 7, message="preempted by job 9")
    assert not store.request_stop(a, "time_limit", T0 + 8), "a second stop must not replace the first"
    assert not store.request_stop(queued, "cancel", T0 + 8), "only running jobs are stopped"
    jobs = {j.job_id: j for j in store.running_jobs()}
    assert set(jobs) == {a, b}
    assert jobs[a] == RunningJob(
        a, allocation("n1", 0, 1), "vision", Priority.LOW, T0 + 5, time_limit_s=600.0, stopping=True
    )
    assert jobs[b] == RunningJob(b, shared, "default", Priority.NORMAL, T0 + 6)
    record = store.get_job(a)
    assert record is not None
    assert (record.stop_reason, record.stop_requested_at, record.stop_message) == (
        "preempt",
        T0 + 7,
        "preempted by job 9",
    )
    again = store.get_job(b)
    assert again is not None and again.allocation == shared  # share and memory survive the JSON


def test_a_cancel_outranks_a_preemption_under_way_but_keeps_its_grace_timer(store: Store) -> None:
    a = store.create_job(spec(), T0)
    start(store, a, 0)
    assert store.request_stop(a, "preempt", T0 + 7, message="preempted by job 9")
    assert store.request_stop(a, "cancel", T0 + 20)
    record = store.get_job(a)
    assert record is not None and (record.stop_reason, record.stop_requested_at) == ("cancel", T0 + 7)
    assert not store.request_stop(a, "preempt", T0 + 30), "a preemption never replaces a cancel"
    assert not store.request_stop(a, "cancel", T0 + 30)
    record = store.get_job(a)
    assert record is not None and (record.stop_reason, record.stop_requested_at) == ("cancel", T0 + 7)


def test_the_failed_rank_is_data_and_survives_a_cancel(store: Store) -> None:
    """Which process failed first is its own column, not parsed back from the message; a cancel
    that outranks the failure keeps both (the job ends cancelled, naming the rank that failed)."""
    a = store.create_job(spec(), T0)
    start(store, a, 0)
    assert store.request_stop(a, "failure", T0 + 7, message="rank 3 exit code 1", failed_rank=3)
    assert store.request_stop(a, "cancel", T0 + 9, message="by user")
    record = store.get_job(a)
    assert record is not None
    assert (record.stop_reason, record.stop_message, record.failed_rank) == ("cancel", "rank 3 exit code 1", 3)
    with pytest.raises(ValueError):
        store.request_stop(a, "not-a-reason", T0 + 10)


def test_usage_is_saved_and_loaded(db: Path | str) -> None:
    first = Store(db)
    assert first.load_usage() == ({}, None)
    first.save_usage({"vision": 7200.0, "nlp": 0.5}, T0)
    first.save_usage({"vision": 3600.0}, T0 + 10)  # a save replaces the table
    first.close()
    second = Store(db)
    try:
        assert second.load_usage() == ({"vision": 3600.0}, T0 + 10)
    finally:
        second.close()


def test_preempted_goes_back_to_the_queue_keeping_the_attempt(store: Store) -> None:
    job_id = store.create_job(spec(), T0)
    start(store, job_id, 0)
    assert not store.transition(job_id, JobState.RUNNING, T0 + 2, "x", expect=[JobState.PREEMPTED])
    assert store.transition(job_id, JobState.PREEMPTED, T0 + 2, "preempted", expect=[JobState.RUNNING])
    assert not store.transition(job_id, JobState.RUNNING, T0 + 3, "illegal")
    assert not store.transition(job_id, JobState.SUCCEEDED, T0 + 3, "illegal")
    assert store.transition(job_id, JobState.QUEUED, T0 + 3, "requeued", expect=[JobState.PREEMPTED], allocation=None)
    record = store.get_job(job_id)
    assert record is not None and record.state is JobState.QUEUED and record.attempt == 1
    assert [e.state for e in store.events(job_id)] == [
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.PREEMPTED,
        JobState.QUEUED,
    ]


# ---- nodes -------------------------------------------------------------------------------------


def test_put_node_inserts_then_replaces(store: Store) -> None:
    store.put_node(node("b").gpus(2, "A100").build(), virtual=False, now=T0)
    store.put_node(node("a").gpus(4, "H100").build(), virtual=True, now=T0)
    store.put_node(node("b").gpus(1, "L4").build(), virtual=True, now=T0 + 1)
    records = store.nodes()
    assert [r.node.name for r in records] == ["a", "b"]
    assert records[0].node == node("a").gpus(4, "H100").build() and records[0].virtual
    assert records[1].node == node("b").gpus(1, "L4").build() and records[1].virtual


def test_node_labels_and_job_selections_survive_the_store(store: Store) -> None:
    """Node labels (nodes.labels, version 12) and a job's selection (in jobs.request) come back
    as stored; a node put again without labels has none."""
    store.put_node(node("n1").gpus(2).labels("ib", "rack=r1").build(), virtual=True, now=T0)
    assert store.nodes()[0].node.labels == frozenset({"ib", "rack=r1"})
    picky = store.create_job(spec(nodelist="n1", exclude=["n2"], constraint="ib&rack=r1|nvswitch"), T0)
    alone = store.create_job(spec(exclusive=True), T0)
    plain = store.create_job(spec(), T0)
    by_id = {r.job_id: r for r in store.queued_requests()}
    sel = by_id[picky].selection
    assert sel is not None
    assert (sel.nodelist, sel.exclude, sel.constraint, sel.exclusive) == (
        frozenset({"n1"}),
        frozenset({"n2"}),
        (("ib", "rack=r1"), ("nvswitch",)),
        False,
    )
    assert by_id[alone].selection is not None and by_id[alone].selection.exclusive
    assert by_id[plain].selection is None
    start(store, alone, 0)
    start(store, plain, 1)
    assert {j.job_id: j.exclusive for j in store.running_jobs()} == {alone: True, plain: False}
    store.put_node(node("n1").gpus(2).build(), virtual=True, now=T0 + 1)
    assert store.nodes()[0].node.labels == frozenset()


# ---- durability --------------------------------------------------------------------------------


def test_reopening_the_db_keeps_every_job(db: Path | str) -> None:
    first = Store(db)
    ids = [first.create_job(spec(gpus=1 + i % 4, name=f"j{i}", time_limit=60 * (i + 1)), T0 + i) for i in range(20)]
    start(first, ids[0], 0)
    first.update_job(ids[0], JobState.RUNNING, launch={"pid": 7})
    first.transition(ids[1], JobState.CANCELLED, T0 + 30, "cancelled")
    first.set_wait_reasons({ids[2]: Wait(WaitReason.RESOURCES)})
    first.put_node(node("n1").gpus(8, "H100").build(), virtual=True, now=T0)
    jobs_before = first.list_jobs()
    events_before = {i: first.events(i) for i in ids}
    first.close()

    second = Store(db)
    try:
        assert second.list_jobs() == jobs_before
        assert {i: second.events(i) for i in ids} == events_before
        assert second.nodes()[0].node == node("n1").gpus(8, "H100").build()
        assert second.running_allocations() == [(ids[0], allocation("n1", 0))]
        assert second.create_job(spec(), T0 + 100) == ids[-1] + 1
        assert second.integrity_ok()
    finally:
        second.close()


def test_ids_are_never_reused(db: Path | str) -> None:
    s = Store(db)
    a = s.create_job(spec(), T0)
    s.close()
    run_sql(db, f"DELETE FROM job_events WHERE job_id = {a}", f"DELETE FROM jobs WHERE id = {a}")
    s = Store(db)
    try:
        assert s.create_job(spec(), T0) == a + 1
    finally:
        s.close()


def test_integrity_ok(store: Store) -> None:
    store.create_job(spec(), T0)
    assert store.integrity_ok() is True


def test_a_newer_schema_is_refused(db: Path | str) -> None:
    Store(db).close()
    run_sql(db, "UPDATE meta SET value = '99' WHERE key = 'schema'")
    with pytest.raises(StoreError, match="newer gpucluster"):
        Store(db)


@pytest.mark.backends("sqlite")
def test_an_unreadable_path_is_a_store_error(tmp_path: Path, store_target: Path | str) -> None:
    with pytest.raises(StoreError, match="cannot open the state database"):
        Store(tmp_path / "missing-dir" / "state.db")


@pytest.mark.backends("postgresql")
def test_a_read_only_postgresql_database_refuses_writes_clearly_and_keeps_its_state(db: Path | str) -> None:
    s = Store(db)
    kept = s.create_job(spec(name="kept"), T0)
    s.close()
    server, name = str(db).rsplit("/", 1)
    run_sql(f"{server}/postgres", f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    s = Store(db)
    try:
        with pytest.raises(DataDirUnwritable, match=r"the database .* is read-only: .*make it writable and retry") as e:
            s.create_job(spec(), T0 + 1)
        assert e.value.full is False
        assert [j.name for j in s.list_jobs()] == ["kept"] and s.get_job(kept) is not None
    finally:
        s.close()
    run_sql(f"{server}/postgres", f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
    s = Store(db)
    try:
        assert s.create_job(spec(), T0 + 2) == kept + 1
        assert s.integrity_ok()
    finally:
        s.close()


def test_integrity_problems_are_named(store: Store) -> None:
    a = store.create_job(spec(), T0)
    b = store.create_job(spec(), T0)
    assert start(store, a, 0, 1)
    assert store.integrity_problems() == []
    # Behind the store's back: a second job on GPU 1, and a running job without an allocation.
    store.transition(b, JobState.RUNNING, T0 + 2, "forced", allocation=allocation("n1", 1, 2), attempt=1)
    assert store.integrity_problems() == ["GPU 1 of n1 is handed out beyond all of it (jobs 1, 2)"]
    store.update_job(a, JobState.RUNNING, allocation=None)
    assert store.integrity_problems() == ["job 1 is running without an allocation"]
    assert not store.integrity_ok()


# ---- queued-job limits at submit (issue 16) -------------------------------------------------------


def test_a_submission_beyond_max_queued_jobs_is_refused_and_an_array_counts_its_elements(store: Store) -> None:
    limits = Limits(per_user=Limit(max_queued_jobs=3), per_class={Priority.HIGH: Limit(max_queued_jobs=1)})
    store.create_job(spec(), T0, "alice", limits)
    store.create_job(spec(), T0, "alice", limits)
    with pytest.raises(QueueLimitReached, match=r"alice has 2 jobs queued, the per-user limit .* submission adds 2"):
        store.create_array(spec(), (0, 1), T0, "alice", limits=limits)
    store.create_job(spec(), T0, "bob", limits)  # bob's count is his own
    store.create_job(spec(), T0, None, limits)  # a job without an owner is not limited
    store.create_job(spec(priority="high"), T0, "alice", limits)
    with pytest.raises(QueueLimitReached, match=r"limits\.per_user\.max_queued_jobs"):
        store.create_job(spec(), T0, "alice", limits)
    # a job that starts leaves the queue, and makes room
    first = min(r.job_id for r in store.queued_requests() if r.user == "alice" and r.priority is Priority.NORMAL)
    assert start(store, first, 0)
    with pytest.raises(QueueLimitReached, match="1 job of class high queued"):
        store.create_job(spec(priority="high"), T0, "alice", limits)
    store.create_job(spec(), T0, "alice", limits)
    assert sum(r.user == "alice" for r in store.queued_requests()) == 3


def test_simultaneous_submissions_never_queue_beyond_the_limit(db: Path | str, store: Store) -> None:
    """Two stores (two heads' worth of writers) and several threads each submit at once: the count
    is taken in the write transaction, so exactly the limit's worth get in."""
    limits = Limits(per_user=Limit(max_queued_jobs=3))
    other = Store(db)
    outcomes: list[int | Exception] = []
    go = threading.Barrier(8)

    def submit(s: Store) -> None:
        go.wait()
        try:
            outcomes.append(s.create_job(spec(), T0, "alice", limits))
        except QueueLimitReached as e:
            outcomes.append(e)

    try:
        threads = [threading.Thread(target=submit, args=(s,)) for s in (store, other) * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        other.close()
    assert len(outcomes) == 8
    assert sum(isinstance(o, int) for o in outcomes) == 3
    assert len(store.queued_requests()) == 3


def test_batched_submissions_are_refused_one_by_one(store: Store) -> None:
    limits = Limits(per_user=Limit(max_queued_jobs=2))
    got = store.create_jobs_each([(spec(), T0)] * 3 + [(spec(), T0)], ["alice", "alice", "alice", "bob"], limits)
    assert [type(o) for o in got] == [int, int, QueueLimitReached, int]


def levels_of_writes(store: Store) -> list[tuple[str, str]]:
    """(UPDATE or INSERT, the durability level its transaction commits at) for each job row or
    event written from now on. SQLite: each statement as its driver runs it (the store runs a
    job's writes past SQLAlchemy there: store/driver_sql.py), its level read at the commit;
    PostgreSQL: as SQLAlchemy runs it."""
    seen: list[tuple[str, str]] = []
    pending: list[str] = []

    def level(dbapi_connection: Any) -> str:
        raw = dbapi_connection.cursor()
        raw.execute("SHOW synchronous_commit" if store.dialect == "postgresql" else "PRAGMA synchronous")
        got = str(raw.fetchone()[0])
        raw.close()
        return got

    def note(statement: str, at: Callable[[], str]) -> None:
        words = statement.split()
        if words[:2] in (["UPDATE", "jobs"], ["INSERT", "INTO"]):
            seen.append((words[0], at()))

    if store.dialect == "postgresql":

        @event.listens_for(store._writer, "before_cursor_execute")
        def executed(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            note(statement, lambda: level(conn.connection.dbapi_connection))

        return seen

    @event.listens_for(store._writer, "checkout")
    def traced(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.set_trace_callback(pending.append)

    @event.listens_for(store._writer, "commit")
    def committed(conn: Any) -> None:
        statements = list(pending)
        at = level(conn.connection.dbapi_connection)
        for statement in statements:
            note(statement, lambda: at)
        pending.clear()

    return seen


def test_wait_reasons_commit_without_fsync_and_submissions_with_it(store: Store, db: Path | str) -> None:
    """Issue 18: the loop rewrote wait reasons after each submission, with an fsync that held the
    write lock the next submission waited for. Wait reasons (derived again every cycle) commit
    without one; a job's row, and every other write, still with one, and neither level leaks."""
    seen = levels_of_writes(store)
    queued = store.create_job(spec(), T0)
    store.set_wait_reasons({queued: Wait(WaitReason.RESOURCES)})
    store.create_job(spec(), T0)
    durable, lazy = ("on", "off") if store.dialect == "postgresql" else ("2", "1")  # FULL, NORMAL
    assert ("UPDATE", lazy) in seen and ("UPDATE", durable) not in seen, seen
    assert {level for verb, level in seen if verb == "INSERT"} == {durable}, seen
    other = Store(db)  # committed: another connection reads it
    try:
        assert other.get_job(queued) is not None and other.get_job(queued).wait_reason == "resources"  # type: ignore[union-attr]
    finally:
        other.close()
