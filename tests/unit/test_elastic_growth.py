"""Elastic growth (issue 17): a running elastic job below its maximum grows, by checkpoint-and-
restart, once GPUs have stayed free with nothing queued; never at a waiting job's expense, at
most once per interval, and only when the restart pays for itself. The pure rule
(core/elastic.py) and the head carrying it out on the fake executor and a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.core.elastic import grow, restart_pays
from gpucluster.core.policy import ElasticPolicy, Policy
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, JobRequest, NodeSlice, RunningJob
from gpucluster.head.policy_source import PolicySource
from gpucluster.launch.ranks import REQUEUE_EXIT_CODE
from gpucluster.policyfile import PolicyFileError, load_policy

from .builders import node
from .headkit import T0, Cluster, make_cluster

RULE = ElasticPolicy(grow_after_s=30, grow_every_s=60, restart_cost_s=20)
POLICY = Policy(elastic=RULE)


def _running(job_id: int, gpus: int, max_gpus: int | None, started: float = 0.0, **kw: object) -> RunningJob:
    alloc = Allocation((NodeSlice("n1", tuple(range(gpus))),))
    return RunningJob(job_id, alloc, started_at=started, max_gpus=max_gpus, **kw)  # type: ignore[arg-type]


def _snap(*running: RunningJob, queued: tuple[JobRequest, ...] = ()) -> Snapshot:
    return Snapshot(nodes=(node("n1").gpus(8, "H100").build(),), running=running, queued=queued)


def test_restart_pays_only_when_the_time_saved_beats_its_cost() -> None:
    assert restart_pays(left_s=100, now_gpus=2, new_gpus=4, restart_cost_s=20)  # saves 50 s
    assert not restart_pays(left_s=30, now_gpus=2, new_gpus=4, restart_cost_s=20)  # saves 15 s
    assert not restart_pays(left_s=1000, now_gpus=4, new_gpus=4, restart_cost_s=0)


def test_grows_to_the_largest_size_that_fits_after_gpus_stay_free() -> None:
    snap = _snap(_running(1, 2, 4), _running(2, 5, None))  # 1 GPU free: 2 -> 3
    assert grow(snap, POLICY, now=100, free_since=80) == ()  # free for 20 s only
    (r,) = grow(snap, POLICY, now=110, free_since=80)
    assert (r.job_id, r.from_gpus, r.to_gpus) == (1, 2, 3) and r.reason.startswith("resized: growing from 2 to 3")
    assert grow(_snap(_running(1, 2, 4)), POLICY, now=110, free_since=80)[0].to_gpus == 4  # capped at its max


@pytest.mark.parametrize(
    ("why", "snap", "policy"),
    [
        ("a job waits", _snap(_running(1, 2, 4), queued=(JobRequest(9, 1.0),)), POLICY),
        ("not elastic", _snap(_running(1, 2, None)), POLICY),
        ("started too recently", _snap(_running(1, 2, 4, started=80)), POLICY),
        ("stopping", _snap(_running(1, 2, 4, stopping=True)), POLICY),
        ("too little left to pay the restart", _snap(_running(1, 2, 4, time_limit_s=140)), POLICY),
        ("off", _snap(_running(1, 2, 4)), Policy(elastic=ElasticPolicy(enabled=False))),
    ],
)
def test_does_not_grow(why: str, snap: Snapshot, policy: Policy) -> None:
    assert grow(snap, policy, now=110, free_since=0) == (), why


def test_grows_the_job_that_gains_most_one_at_a_time() -> None:
    snap = _snap(_running(1, 1, 2), _running(2, 2, 6))
    (r,) = grow(snap, POLICY, now=110, free_since=0)
    assert (r.job_id, r.to_gpus) == (2, 6)  # 2 -> 6 saves more than 1 -> 2


def test_the_policy_file_sets_the_rule(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("elastic: {grow_after: 2m, grow_every: 10m, restart_cost: 90s}\n")
    assert load_policy(f).elastic == ElasticPolicy(True, 120.0, 600.0, 90.0)
    f.write_text("elastic: {grow_after: -1s}\n")
    with pytest.raises(PolicyFileError, match="grow_after"):
        load_policy(f)


def _cluster(tmp_path: Path, rule: ElasticPolicy = RULE) -> Cluster:
    source = PolicySource(None)
    source.policy = Policy(elastic=rule)
    return make_cluster(tmp_path, policy=source, grace_period_s=30.0, restart_backoff_s=1.0)


def test_the_head_grows_a_job_by_checkpoint_and_restart(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    try:
        other = c.submit(gpus=6)
        c.tick_at(T0)
        job = c.submit(gpus="2..4", per_gpu=True)
        c.tick_at(T0 + 1)
        assert c.record(job).allocation.gpu_count == 2  # type: ignore[union-attr]
        c.fake.finish(other, 0)  # 6 GPUs free from now on, nothing queued
        c.tick_at(T0 + 2)
        c.tick_at(T0 + 2 + 29)
        assert c.record(job).stop_reason is None  # free for 29 s: not yet
        c.tick_at(T0 + 62)  # free 60 s and the job ran 61 s (grow_every 60 s)
        r = c.record(job)
        assert (r.stop_reason, r.stop_message) == ("preempt", "resized: growing from 2 to 4 GPUs (free for 60s)")
        c.tick_at(T0 + 63)
        assert c.proc(job).signals == [15]  # SIGTERM: checkpoint, as for a requeue
        c.fake.finish(job, REQUEUE_EXIT_CODE)
        c.tick_at(T0 + 64)
        r = c.record(job)
        assert (r.state, r.attempt, r.allocation.gpu_count) == (JobState.RUNNING, 2, 4)  # type: ignore[union-attr]
        assert c.proc(job, 2).spec.processes[0].env["WORLD_SIZE"] == "4"
        first, _ = c.service.job(job).attempts
        assert first.outcome == "preempted" and first.reason.startswith("resized: growing from 2 to 4 GPUs")
        assert r.restarts == 0  # a resize is no failure
    finally:
        c.close()


def test_the_head_never_grows_a_job_while_another_waits(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    try:
        blocker = c.submit(gpus=5)
        c.tick_at(T0)
        job = c.submit(gpus="2..4", per_gpu=True)
        c.tick_at(T0 + 0.5)
        assert c.record(job).allocation.gpu_count == 3  # type: ignore[union-attr]
        waiting = c.submit(gpus=6)
        c.fake.finish(blocker, 0)  # 5 GPUs free, too few for the waiting job, enough to grow
        for t in range(1, 500, 10):
            c.tick_at(T0 + t)
        assert c.state(waiting) is JobState.QUEUED
        assert c.record(job).stop_reason is None  # the free GPUs are the waiting job's to come
    finally:
        c.close()


def test_an_elastic_victim_comes_back_smaller_right_after_its_preemptor_starts(tmp_path: Path) -> None:
    """Shrinking: a higher class needs 2 of the 8 GPUs an elastic 4..8 job holds. The job is
    checkpointed and stopped (the preemption), its preemptor starts on 2, and it restarts at
    once on the 6 left: within its range, no failure counted."""
    c = _cluster(tmp_path)
    try:
        job = c.submit(gpus="4..8", per_gpu=True)
        c.tick_at(T0)
        assert c.record(job).allocation.gpu_count == 8  # type: ignore[union-attr]
        urgent = c.submit(gpus=2, priority="high")
        c.tick_at(T0 + 1)
        assert c.record(job).stop_reason == "preempt"
        c.fake.finish(job, REQUEUE_EXIT_CODE)  # checkpointed on SIGTERM
        c.tick_at(T0 + 2)
        c.tick_at(T0 + 3)
        assert c.state(urgent) is JobState.RUNNING
        r = c.record(job)
        assert (r.state, r.attempt, r.allocation.gpu_count, r.restarts) == (JobState.RUNNING, 2, 6, 0)  # type: ignore[union-attr]
    finally:
        c.close()


def test_never_grows_beyond_its_users_limits() -> None:
    from dataclasses import replace

    from gpucluster.core.policy import Limit, Limits

    limited = replace(POLICY, limits=Limits(per_user=Limit(max_running_gpus=5)))
    alice = _running(1, 2, 8, user="alice")
    other = _running(2, 2, None, user="alice")
    other = replace(other, allocation=Allocation((NodeSlice("n1", (6, 7)),)))
    (r,) = grow(_snap(alice, other), limited, now=110, free_since=80)
    assert r.to_gpus == 3  # 4 GPUs free, but alice may run 5 in all and her other job holds 2
    # with the other job bob's, 6 would fit, and alice's own limit of 5 caps it
    assert grow(_snap(alice, replace(other, user="bob")), limited, now=110, free_since=80)[0].to_gpus == 5
    assert grow(_snap(alice, replace(other, user="bob")), POLICY, now=110, free_since=80)[0].to_gpus == 6
    full = replace(POLICY, limits=Limits(per_user=Limit(max_running_gpus=4)))
    assert grow(_snap(alice, other), full, now=110, free_since=80) == ()  # no size above 2 allowed
