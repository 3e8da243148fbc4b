"""head.loop.Head with the issue-3 scheduler: preemption end to end on a fake executor and a fake
clock, policy files reloaded while jobs run, and fair-share usage that survives a head restart."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.core.fairshare import decay
from gpucluster.core.states import JobState
from gpucluster.executors.base import Exited
from gpucluster.head.loop import USAGE_SAVE_EVERY_S, Head
from gpucluster.head.policy_source import PolicySource
from gpucluster.waits_text import reason_text

from .headkit import T0, Cluster, make_cluster

SIGTERM, SIGKILL = int(signal.SIGTERM), int(signal.SIGKILL)
WEEK = 7 * 86400.0


def new_head(c: Cluster, policy: PolicySource | None = None) -> Head:
    """A second head on the same store, as after a restart."""
    return Head(store=c.store, executor=c.fake, data_dir=c.data_dir, clock=c.clock, policy=policy, base_env={})


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(tmp_path)
    yield c
    c.close()


# ---- preemption --------------------------------------------------------------------------------


def test_a_victim_back_within_its_quota_does_not_take_back_the_gpus_it_was_preempted_for(tmp_path: Path) -> None:
    """Issue 14. b (quota 2 of 3 GPUs) borrows the third; a's high job preempts the borrowed job.
    One of b's other jobs ends meanwhile, so the victim, back in line, is within b's quota and
    would go before the high job (guaranteed demand first) and retake its GPU: the waiting
    preemptor is considered first instead, and starts on the GPU it freed; the victim then keeps
    its place in b's line (ahead of b's newer job) for the GPU the other job left."""
    path = tmp_path / "policy.yaml"
    path.write_text("teams:\n  a: {}\n  b: {quota: {H100: 2}}\n")
    c = make_cluster(tmp_path, gpus=3, policy=PolicySource(path))
    try:
        b_jobs = [c.submit(gpus=1, team="b") for _ in range(3)]
        c.tick_at(T0)
        assert all(c.state(j) is JobState.RUNNING for j in b_jobs)
        high = c.submit(gpus=1, team="a", priority="high")
        c.tick_at(T0 + 1)
        (victim,) = [j for j in b_jobs if c.record(j).stop_reason == "preempt"]
        assert c.head.preempted_for == {victim: high}
        late = c.submit(gpus=1, team="b")  # b's demand, newer than the victim
        c.tick_at(T0 + 2)  # SIGTERM
        c.fake.finish(next(j for j in b_jobs if j != victim), 0)  # in the same cycle as the victim exits
        c.proc(victim).status = Exited(128 + SIGTERM, SIGTERM)
        freed = c.record(victim).allocation
        c.tick_at(T0 + 3)
        assert c.state(high) is JobState.RUNNING and c.record(high).allocation == freed
        assert c.state(victim) is JobState.RUNNING and c.record(victim).allocation != freed
        assert c.state(late) is JobState.QUEUED
        assert c.head.preempted_for == {}  # its preemptor started: nothing held any more
    finally:
        c.close()


def test_a_high_job_preempts_a_low_one_which_requeues_and_runs_again_after(cluster: Cluster) -> None:
    low = cluster.submit(gpus=8, priority="low", name="low")
    cluster.tick_at(T0)
    assert cluster.state(low) is JobState.RUNNING

    high = cluster.submit(gpus=8, priority="high", name="high")
    cluster.tick_at(T0 + 1)  # plans the preemption: a stop is requested, the process not yet signalled
    record = cluster.record(low)
    assert (record.state, record.stop_reason) == (JobState.RUNNING, "preempt")
    assert record.stop_message == f"preempted by job {high} (high priority)"
    assert cluster.proc(low).signals == []
    waiting = cluster.record(high)
    assert (waiting.state, waiting.wait_reason) == (JobState.QUEUED, "preempting")
    assert f"preempting job(s) {low}" in reason_text(waiting.reason)

    cluster.tick_at(T0 + 2)
    assert cluster.proc(low).signals == [SIGTERM]
    assert cluster.state(high) is JobState.QUEUED  # its GPUs are still held by the exiting job
    cluster.tick_at(T0 + 3)
    assert cluster.proc(low).signals == [SIGTERM], "no second signal, no SIGKILL inside the grace period"

    cluster.proc(low).status = Exited(128 + SIGTERM, SIGTERM)  # the job saves and exits
    cluster.tick_at(T0 + 4)
    record = cluster.record(low)
    assert record.state is JobState.QUEUED
    assert record.id == low and record.attempt == 1
    assert record.allocation is None and record.stop_reason is None and not record.term_sent
    assert cluster.state(high) is JobState.RUNNING  # same cycle: the freed GPUs go to the high job
    events = [(e.at, e.state, e.reason) for e in cluster.store.events(low)]
    assert events == [
        (T0, JobState.QUEUED, "submitted"),
        (T0, JobState.RUNNING, "started on n1 GPUs 0,1,2,3,4,5,6,7"),
        (T0 + 4, JobState.PREEMPTED, f"preempted by job {high} (high priority) (exit code {128 + SIGTERM})"),
        (T0 + 4, JobState.QUEUED, "requeued after preemption"),
    ]
    wire = cluster.service.job(low)
    assert wire.state is JobState.QUEUED and [e.state for e in wire.events][-2:] == [
        JobState.PREEMPTED,
        JobState.QUEUED,
    ]

    cluster.tick_at(T0 + 100)
    assert cluster.state(low) is JobState.QUEUED, "the low job must not take GPUs back from the high one"
    assert (low, 2) not in cluster.fake.processes

    cluster.fake.finish(high, 0)
    cluster.tick_at(T0 + 101)
    assert cluster.state(high) is JobState.SUCCEEDED
    record = cluster.record(low)
    assert (record.state, record.attempt, record.started_at) == (JobState.RUNNING, 2, T0 + 101)
    attempt2 = cluster.proc(low, 2)
    assert attempt2.spec.env["GPUCLUSTER_ATTEMPT"] == "2"
    assert attempt2.spec.log_path == cluster.data_dir.log(low, 2)
    assert cluster.proc(low, 1).signals == [SIGTERM]  # attempt 1 was never signalled again
    assert [e.state for e in cluster.store.events(low)] == [
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.PREEMPTED,
        JobState.QUEUED,
        JobState.RUNNING,
    ]
    cluster.fake.finish(low, 0)
    cluster.tick_at(T0 + 102)
    assert cluster.state(low) is JobState.SUCCEEDED
    assert cluster.service.log_path(low, 1)[0] == cluster.data_dir.log(low, 1)


def test_a_preempted_job_that_ignores_sigterm_is_killed_after_the_policy_grace_period(cluster: Cluster) -> None:
    grace = cluster.head.policy.preemption.grace_period_s
    assert grace == 30.0 and cluster.head.grace_period_s == 30.0  # the default policy
    low = cluster.submit(gpus=8, priority="low")
    cluster.tick_at(T0)
    high = cluster.submit(gpus=8, priority="high")
    cluster.tick_at(T0 + 1)
    cluster.tick_at(T0 + 2)
    assert cluster.proc(low).signals == [SIGTERM]
    cluster.tick_at(T0 + 1 + grace - 0.5)
    assert cluster.proc(low).signals == [SIGTERM]
    cluster.fake.exit_on_signal[SIGKILL] = 128 + SIGKILL
    cluster.tick_at(T0 + 1 + grace)
    assert cluster.proc(low).signals == [SIGTERM, SIGKILL]
    cluster.tick_at(T0 + 2 + grace)
    assert cluster.state(low) is JobState.QUEUED
    assert cluster.state(high) is JobState.RUNNING
    assert cluster.store.events(low)[-2].reason.endswith(f"(exit code {128 + SIGKILL})")


def test_a_job_older_than_the_starvation_age_is_preempted_once_not_every_cycle(cluster: Cluster) -> None:
    """A requeued job ages from when it re-entered the queue, not from its submission two days ago."""
    low = cluster.submit(gpus=8, priority="low")
    cluster.tick_at(T0)
    two_days = T0 + 2 * 86400
    cluster.clock.t = two_days
    high = cluster.submit(gpus=8, priority="high")
    cluster.fake.exit_on_signal[SIGTERM] = 128 + SIGTERM
    for t in range(1, 30):
        cluster.tick_at(two_days + t)
    assert cluster.state(high) is JobState.RUNNING
    assert cluster.state(low) is JobState.QUEUED
    assert [e.state for e in cluster.store.events(low)].count(JobState.PREEMPTED) == 1
    assert (low, 2) not in cluster.fake.processes
    assert cluster.record(low).wait_reason == "reserved"


def test_a_critical_job_is_never_preempted(cluster: Cluster) -> None:
    crit = cluster.submit(gpus=8, priority="critical")
    cluster.tick_at(T0)
    other = cluster.submit(gpus=8, priority="critical")
    for t in range(1, 5):
        cluster.tick_at(T0 + t)
    assert cluster.record(crit).stop_reason is None
    assert cluster.proc(crit).signals == []
    assert cluster.record(other).wait_reason == "reserved"


def test_cancelling_a_job_while_it_is_being_preempted_cancels_it(cluster: Cluster) -> None:
    low = cluster.submit(gpus=8, priority="low")
    cluster.tick_at(T0)
    cluster.submit(gpus=8, priority="high")
    cluster.tick_at(T0 + 1)  # preemption requested
    cluster.service.cancel(low)  # a user's cancel outranks the preemption: the job must not come back
    cluster.fake.exit_on_signal[SIGTERM] = 128 + SIGTERM
    cluster.tick_at(T0 + 2)  # SIGTERM: the process exits
    cluster.tick_at(T0 + 3)
    assert cluster.state(low) is JobState.CANCELLED
    assert cluster.store.events(low)[-1].state is JobState.CANCELLED
    assert cluster.proc(low).signals == [SIGTERM]  # one SIGTERM, and the grace timer was not restarted
    cluster.tick_at(T0 + 50)
    assert (low, 2) not in cluster.fake.processes


def test_a_victim_that_finishes_before_its_sigterm_is_sent_succeeded_and_is_not_run_again(cluster: Cluster) -> None:
    """Found by tests/e2e/test_crash_consistency.py: it was requeued and ran a second time."""
    low = cluster.submit(gpus=8, priority="low")
    cluster.tick_at(T0)
    high = cluster.submit(gpus=8, priority="high")
    cluster.tick_at(T0 + 1)  # the preemption is requested; no signal yet
    assert cluster.record(low).stop_reason == "preempt" and cluster.proc(low).signals == []
    cluster.fake.finish(low, 0)  # it ends on its own first
    cluster.tick_at(T0 + 2)
    done = cluster.record(low)
    assert (done.state, done.attempt, done.exit_code) == (JobState.SUCCEEDED, 1, 0)
    assert cluster.proc(low).signals == []
    assert [a.outcome for a in cluster.store.attempts(low)] == ["succeeded"]
    assert cluster.state(high) is JobState.RUNNING
    cluster.tick_at(T0 + 3)
    assert (low, 2) not in cluster.fake.processes


@pytest.mark.parametrize("stopped", [True, None], ids=["the-shim-says-stopped", "an-old-record-says-nothing"])
def test_a_victim_that_exits_0_after_its_sigterm_is_requeued_as_the_head_intended(
    cluster: Cluster, stopped: bool | None
) -> None:
    low = cluster.submit(gpus=8, priority="low")
    cluster.tick_at(T0)
    cluster.submit(gpus=8, priority="high")
    cluster.tick_at(T0 + 1)
    cluster.tick_at(T0 + 2)
    assert cluster.proc(low).signals == [SIGTERM]
    cluster.fake.finish(low, 0, stopped=stopped)
    cluster.tick_at(T0 + 3)
    assert [e.state for e in cluster.store.events(low)][-2:] == [JobState.PREEMPTED, JobState.QUEUED]
    assert [a.outcome for a in cluster.store.attempts(low)] == ["preempted"]


def test_a_victim_whose_command_ended_by_itself_just_before_its_sigterm_succeeded(cluster: Cluster) -> None:
    """Found by tests/e2e/test_crash_consistency.py (2 runs in 11): the command exited 0 while the
    head still saw it running; the head's SIGTERM went into an empty process group and it was
    requeued as preempted. The shim's record says no stop reached it before it ended."""
    low = cluster.submit(gpus=8, priority="low")
    cluster.tick_at(T0)
    high = cluster.submit(gpus=8, priority="high")
    cluster.tick_at(T0 + 1)
    cluster.tick_at(T0 + 2)
    assert cluster.record(low).term_sent and cluster.proc(low).signals == [SIGTERM]
    cluster.fake.finish(low, 0, stopped=False)  # it had ended before the SIGTERM landed
    cluster.tick_at(T0 + 3)
    done = cluster.record(low)
    assert (done.state, done.attempt, done.exit_code) == (JobState.SUCCEEDED, 1, 0)
    assert [a.outcome for a in cluster.store.attempts(low)] == ["succeeded"]
    assert JobState.PREEMPTED not in [e.state for e in cluster.store.events(low)]
    cluster.tick_at(T0 + 4)
    assert (low, 2) not in cluster.fake.processes
    assert cluster.state(high) is JobState.RUNNING


def test_a_victim_that_failed_by_itself_just_before_its_sigterm_is_still_requeued(cluster: Cluster) -> None:
    """Only a success wins over the preemption: a failure while being preempted requeues, as a
    preemption does, without using a restart."""
    low = cluster.submit(gpus=8, priority="low")
    cluster.tick_at(T0)
    cluster.submit(gpus=8, priority="high")
    cluster.tick_at(T0 + 1)
    cluster.tick_at(T0 + 2)
    cluster.fake.finish(low, 3, stopped=False)
    cluster.tick_at(T0 + 3)
    assert [e.state for e in cluster.store.events(low)][-2:] == [JobState.PREEMPTED, JobState.QUEUED]
    assert cluster.record(low).restarts == 0


@pytest.mark.parametrize("batched", [False, True], ids=["each-write-alone", "batched"])
def test_a_job_left_preempted_by_a_head_that_died_before_requeueing_it_is_requeued_by_the_next(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    """Found by tests/e2e/test_crash_consistency.py: `preempted` and `queued` are two writes. A
    head that commits each write alone (heads before issue 18's batching) leaves the job
    `preempted`; the loop now commits a cycle's ends in one transaction, so a head that dies
    between them leaves neither, the job still `running`. Either way the next head requeues it."""
    low = cluster.submit(gpus=8, priority="low")
    cluster.tick_at(T0)
    high = cluster.submit(gpus=8, priority="high")
    cluster.tick_at(T0 + 1)  # preemption requested
    cluster.fake.exit_on_signal[SIGTERM] = 128 + SIGTERM
    cluster.tick_at(T0 + 2)  # SIGTERM: the process exits

    class HeadDied(Exception):
        pass

    def die(*_: object) -> None:
        raise HeadDied

    if not batched:
        monkeypatch.setattr(cluster.store, "batch", contextlib.nullcontext)  # each write commits alone
    monkeypatch.setattr(cluster.head, "_requeue_after_preemption", die)
    with pytest.raises(HeadDied):
        cluster.tick_at(T0 + 3)  # `preempted` is written; the head dies before `queued`
    assert cluster.state(low) is (JobState.RUNNING if batched else JobState.PREEMPTED)
    monkeypatch.undo()

    head = new_head(cluster)
    cluster.clock.t = T0 + 4
    head.tick()
    assert cluster.state(low) is JobState.QUEUED
    assert cluster.record(low).allocation is None
    assert [e.state for e in cluster.store.events(low)] == [
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.PREEMPTED,
        JobState.QUEUED,
    ]
    assert cluster.state(high) is JobState.RUNNING
    cluster.fake.finish(high)
    cluster.clock.t = T0 + 5
    head.tick()
    cluster.clock.t = T0 + 6
    head.tick()
    again = cluster.record(low)
    assert (again.state, again.attempt) == (JobState.RUNNING, 2)


# ---- policy reload -----------------------------------------------------------------------------

POLICY_V1 = "teams:\n  a: {weight: 1}\n  b: {weight: 1}\npreemption: {grace_period: 30s}\n"
POLICY_V2 = "teams:\n  a: {weight: 3}\n  b: {weight: 1}\npreemption:\n  grace_period: 10s\n"


def rewrite(path: Path, text: str, bump: float) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + int(bump * 1e9)))


@pytest.fixture
def policy_cluster(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_V1)
    c = make_cluster(tmp_path, policy=PolicySource(path))
    yield c, path
    c.close()


def test_a_changed_policy_file_is_reloaded_without_dropping_jobs(policy_cluster: tuple[Cluster, Path]) -> None:
    cluster, path = policy_cluster
    assert cluster.head.policy.teams["a"].weight == 1.0 and cluster.head.grace_period_s == 30.0
    running = cluster.submit(gpus=4, team="a")
    queued = cluster.submit(gpus=8, team="b")
    cluster.tick_at(T0)
    assert (cluster.state(running), cluster.state(queued)) == (JobState.RUNNING, JobState.QUEUED)

    rewrite(path, POLICY_V2, bump=5)
    cluster.tick_at(T0 + 5)
    p = cluster.head.policy
    assert p.teams["a"].weight == 3.0
    assert cluster.head.grace_period_s == 10.0
    assert cluster.head.policy_source.error is None
    assert cluster.head.policy_source.loaded_at == T0 + 5
    assert (cluster.state(running), cluster.state(queued)) == (JobState.RUNNING, JobState.QUEUED)
    assert cluster.proc(running).signals == []
    out = cluster.service.policy()
    assert out.error is None and out.grace_period_s == 10.0
    assert {t.name: t.weight for t in out.teams if t.name in ("a", "b")} == {"a": 3.0, "b": 1.0}

    cluster.fake.finish(running, 0)
    cluster.tick_at(T0 + 6)
    assert cluster.state(queued) is JobState.RUNNING  # the queue kept working across the reload


def test_an_invalid_edit_keeps_the_old_policy_and_records_the_error(policy_cluster: tuple[Cluster, Path]) -> None:
    cluster, path = policy_cluster
    job_id = cluster.submit(gpus=2, team="a")
    cluster.tick_at(T0)
    before = cluster.head.policy

    rewrite(path, "teams:\n  a: {weight: 1}\n  b:\n    weight: -3\n", bump=5)
    cluster.tick_at(T0 + 5)
    assert cluster.head.policy is before
    error = cluster.head.policy_source.error
    assert error is not None and f"{path}:4: teams.b.weight" in error
    assert cluster.service.policy().error == error
    assert cluster.state(job_id) is JobState.RUNNING
    later = cluster.submit(gpus=2, team="b")
    cluster.tick_at(T0 + 7)
    assert cluster.state(later) is JobState.RUNNING  # still scheduling, under the old policy

    rewrite(path, POLICY_V2, bump=10)
    cluster.tick_at(T0 + 10)
    assert cluster.head.policy.teams["a"].weight == 3.0
    assert cluster.head.policy_source.error is None


def test_an_unchanged_file_is_not_reloaded(policy_cluster: tuple[Cluster, Path]) -> None:
    cluster, _ = policy_cluster
    before = cluster.head.policy
    for t in range(0, 10, 2):
        cluster.tick_at(T0 + t)
    assert cluster.head.policy is before
    assert cluster.head.policy_source.loaded_at is None


def test_an_invalid_starvation_age_edit_keeps_the_old_policy(policy_cluster: tuple[Cluster, Path]) -> None:
    cluster, path = policy_cluster
    before = cluster.head.policy
    rewrite(path, POLICY_V1 + "starvation_age: soon\n", bump=5)
    cluster.tick_at(T0 + 5)
    assert cluster.head.policy is before
    error = cluster.head.policy_source.error
    assert error is not None and f"{path}:5: starvation_age" in error


# ---- fair-share usage --------------------------------------------------------------------------


def test_usage_accrues_per_team_and_survives_a_new_head(cluster: Cluster) -> None:
    a = cluster.submit(gpus=2, team="a")
    b = cluster.submit(gpus=0.5, team="b")
    cluster.tick_at(T0)
    assert (cluster.state(a), cluster.state(b)) == (JobState.RUNNING, JobState.RUNNING)
    assert cluster.head.usage == {}

    cluster.tick_at(T0 + 4)
    assert cluster.head.usage == pytest.approx({"a": 8.0, "b": 2.0})
    assert cluster.store.load_usage() == ({}, None)  # saved every USAGE_SAVE_EVERY_S, not every tick

    cluster.tick_at(T0 + USAGE_SAVE_EVERY_S)
    expected = {"a": decay(8.0, 6, WEEK) + 12.0, "b": decay(2.0, 6, WEEK) + 3.0}
    assert cluster.head.usage == pytest.approx(expected)
    saved, at = cluster.store.load_usage()
    assert saved == pytest.approx(expected) and at == T0 + USAGE_SAVE_EVERY_S
    hours = {t.name: t.usage_gpu_hours for t in cluster.service.policy().teams}
    assert hours["a"] == pytest.approx(20.0 / 3600, rel=1e-4)

    cluster.fake.finish(a, 0)
    cluster.tick_at(T0 + USAGE_SAVE_EVERY_S + 1)  # a's last second still counts: it ended during it

    restarted = new_head(cluster)  # e.g. after a head restart: usage comes back from the store
    assert restarted.usage == pytest.approx(expected)
    cluster.head = restarted
    cluster.tick_at(T0 + 2 * USAGE_SAVE_EVERY_S)
    # from the last save: a's second of running before it ended is lost with the old head, b ran on
    assert restarted.usage["b"] == pytest.approx(decay(expected["b"], USAGE_SAVE_EVERY_S, WEEK) + 5.0)
    assert restarted.usage["a"] == pytest.approx(decay(expected["a"], USAGE_SAVE_EVERY_S, WEEK))


def test_usage_decides_which_team_goes_first(cluster: Cluster) -> None:
    cluster.store.save_usage({"heavy": 1e6, "light": 10.0}, T0)
    cluster.head = new_head(cluster)
    blocker = cluster.submit(gpus=8, priority="critical")
    cluster.tick_at(T0)
    heavy = cluster.submit(gpus=8, team="heavy")
    cluster.clock.t = T0 + 1
    light = cluster.submit(gpus=8, team="light")
    cluster.tick_at(T0 + 2)
    assert cluster.record(light).wait_reason == "reserved"  # first in line despite submitting later
    assert cluster.head.queue_order.index(light) < cluster.head.queue_order.index(heavy)
    cluster.fake.finish(blocker, 0)
    cluster.tick_at(T0 + 3)
    assert (cluster.state(light), cluster.state(heavy)) == (JobState.RUNNING, JobState.QUEUED)
