"""Start and stop latency in estimates: learned by the head from its history (head/latency.py),
added by the core's replay (core/estimate.py). Before, each job ahead that ran to its limit made
the estimates of those behind it early by the head's own stop and start delays."""

from __future__ import annotations

from pathlib import Path

from gpucluster.core.estimate import Estimate, Latency, estimate_starts
from gpucluster.core.policy import Policy
from gpucluster.core.reasons import WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.states import JobState
from gpucluster.core.types import Plan, Wait
from gpucluster.head.latency import PastAttempt, from_store, learn
from gpucluster.store import AttemptRecord, Store

from .builders import allocation, job, node, running, spec

STORE_BACKENDS = ("sqlite", "postgresql")  # the store test runs on both (tests/unit/conftest.py)
H1 = node("h1").gpus(1, "H100").build()
GPU = frozenset({("h1", 0)})


def test_each_job_ahead_adds_its_stop_and_the_next_start() -> None:
    queued = [job(i).limit(10).build() for i in (1, 2, 3)]
    snap = Snapshot((H1,), (running(50, "h1", 0, limit=10.0),), tuple(queued))
    plan = Plan(waiting={q.job_id: Wait(WaitReason.RESOURCES) for q in queued})
    assert [estimate_starts(snap, Policy(), 0.0, plan)[i].start for i in (1, 2, 3)] == [10.0, 20.0, 30.0]
    slow = Latency(start_s=0.5, stop_s=1.5)
    got = estimate_starts(snap, Policy(), 0.0, plan, latency=slow)
    assert [got[i] for i in (1, 2, 3)] == [Estimate(12.0), Estimate(24.0), Estimate(36.0)]


def test_a_reservations_shadow_is_replayed_with_the_latencies() -> None:
    snap = Snapshot((H1,), (running(50, "h1", 0, limit=10.0),), (job(1).limit(10).build(),))
    plan = Plan(waiting={1: Wait(WaitReason.RESERVED, estimated_start=10.0)})
    assert estimate_starts(snap, Policy(), 0.0, plan, latency=Latency(1.0, 2.0))[1] == Estimate(13.0)


def test_a_stopping_job_ends_as_this_clusters_stops_do_not_after_the_whole_grace() -> None:
    snap = Snapshot((H1,), (running(50, "h1", 0, stopping=True),), (job(1).build(),))
    plan = Plan(waiting={1: Wait(WaitReason.RESOURCES)})
    assert estimate_starts(snap, Policy(), 100.0, plan)[1] == Estimate(130.0)  # the 30 s grace
    assert estimate_starts(snap, Policy(), 100.0, plan, latency=Latency(0.5, 2.0))[1] == Estimate(102.5)


def test_learned_as_medians_of_the_heads_own_history() -> None:
    past = [
        # one after the other on one GPU, each stopped at its 10 s limit
        PastAttempt(0.0, 10.4, GPU, 0.0, 10.0, timed_out=True),
        PastAttempt(10.5, 20.8, GPU, 0.0, 10.0, timed_out=True),
        PastAttempt(21.0, 31.2, GPU, 0.0, 10.0, timed_out=True),
        # queued after the GPU had freed: it did not wait for it, so no start latency
        PastAttempt(50.0, 51.0, GPU, 45.0),
        # on another GPU, ended by itself: neither
        PastAttempt(60.0, 61.0, frozenset({("h2", 0)}), 0.0, 10.0),
    ]
    got = learn(past)
    assert round(got.stop_s, 6) == 0.3 and round(got.start_s, 6) == 0.15
    assert learn([]) == Latency(0.0, 0.0)


def test_learned_from_the_store(store_target: Path | str) -> None:
    store = Store(store_target)
    store.put_node(H1, virtual=True, now=0.0)
    for n, (start, end) in enumerate([(1.0, 11.5), (11.7, 22.0)], start=1):
        job_id = store.create_job(spec(time_limit=10), 0.0)
        store.transition(
            job_id, JobState.RUNNING, start, "started", allocation=allocation("h1", 0), attempt=1, started_at=start
        )
        store.request_stop(job_id, "time_limit", start + 10.0)
        record = AttemptRecord(job_id, 1, start, end, allocation("h1", 0), "failed", "time limit", (143,), None)
        store.transition(job_id, JobState.FAILED, end, "time limit", ended_attempt=record)
        assert n == job_id
    got = from_store(store)
    store.close()
    assert round(got.stop_s, 6) == 0.4 and round(got.start_s, 6) == 0.2
