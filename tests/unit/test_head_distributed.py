"""Distributed jobs in the head (issue 4) on the fake executor and a fake clock: per-GPU and
launcher launches, a rank that fails stops the others, restarts with backoff, requeue,
progress reports, attempts with the work they lost, elastic sizes, recovery of a launch cut
short by a head crash."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.core.states import JobState
from gpucluster.executors.base import Exited, Running
from gpucluster.executors.fake import FakeProcess
from gpucluster.head.attempts import work_lost
from gpucluster.head.recovery import LAUNCH_GRACE_S
from gpucluster.head.service import Conflict, NotFound
from gpucluster.launch.ranks import REQUEUE_EXIT_CODE
from gpucluster.models import ProgressIn
from gpucluster.store import Store, schema
from gpucluster.waits_text import reason_text

from .builders import allocation, spec
from .headkit import T0, Cluster, make_cluster

GRACE = 30.0
BACKOFF = 1.0
SIGTERM, SIGKILL = int(signal.SIGTERM), int(signal.SIGKILL)
KILLED = Exited(128 + SIGKILL, SIGKILL)


def make(tmp_path: Path) -> Cluster:
    return make_cluster(
        tmp_path,
        default_command=["python", "train.py"],
        grace_period_s=GRACE,
        head_url="http://head:8080",
        base_env={"HOME": "/home/alice", "PATH": "/usr/bin"},
        restart_backoff_s=BACKOFF,
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = make(tmp_path)
    yield c
    c.close()


# ---- launching ---------------------------------------------------------------------------------


def test_per_gpu_starts_one_process_per_gpu_with_torchruns_variables(cluster: Cluster) -> None:
    job = cluster.submit(gpus=4, per_gpu=True, env={"SEED": "1"})
    cluster.tick_at(T0)
    launched = cluster.proc(job).spec
    assert len(launched.processes) == 4
    ckpt = str(cluster.data_dir.checkpoints(job))
    for rank, p in enumerate(launched.processes):
        env = p.env
        assert p.argv == ["python", "train.py"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
            str(rank),
            str(rank),
            "4",
            "4",
        )
        assert env["NODE_RANK"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == launched.processes[0].env["MASTER_PORT"]
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # node-local list + LOCAL_RANK, as torchrun
        assert env["GPUCLUSTER_RDZV_PREFIX"] == f"gpucluster/job-{job}/attempt-1/"
        assert env["GPUCLUSTER_CHECKPOINT_DIR"] == ckpt
        assert env["GPUCLUSTER_ATTEMPT"] == "1" and env["GPUCLUSTER_JOB_ID"] == str(job)
        assert env["GPUCLUSTER_URL"] == "http://head:8080" and env["GPUCLUSTER_GRACE_PERIOD_S"] == "30"
        assert env["SEED"] == "1" and env["OMP_NUM_THREADS"] == "1"
        assert env["GPUCLUSTER_ATTEMPT_DIR"] == str(cluster.data_dir.run_dir(job, 1))
        assert p.run_dir == cluster.data_dir.run_dir(job, 1) / f"rank-{rank}"
        assert p.log_path == cluster.data_dir.log(job, 1, rank)
        assert env["TORCHELASTIC_ERROR_FILE"] == str(p.log_path.parent / "error.json")  # the job's own dir
        assert (env["TORCHELASTIC_RUN_ID"], env["TORCHELASTIC_RESTART_COUNT"]) == (f"gpucluster-job-{job}", "0")
    assert launched.marker == f"GPUCLUSTER_ATTEMPT_DIR={cluster.data_dir.run_dir(job, 1)}"
    assert launched.job_dir == cluster.data_dir.job_dir(job)  # the job's processes make checkpoints/ in it
    assert cluster.record(job).launch == {"job_id": job, "attempt": 1, "ranks": [{"rank": r} for r in range(4)]}


def test_launcher_mode_starts_torchrun_once_per_node(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, launcher="torchrun", command=["python", "-u", "train.py", "--epochs", "3"])
    cluster.tick_at(T0)
    (p,) = cluster.proc(job).spec.processes
    assert p.argv[:3] == ["python", "-m", "torch.distributed.run"]
    assert "--nnodes=1" in p.argv and "--node-rank=0" in p.argv and "--nproc-per-node=2" in p.argv
    assert "--max-restarts=0" in p.argv
    assert p.argv[-5:] == ["python", "-u", "train.py", "--epochs", "3"]  # interpreter flags: --no-python
    assert p.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert p.env["GPUCLUSTER_RDZV_PREFIX"] == f"gpucluster/job-{job}/attempt-1/"
    assert "RANK" not in p.env  # torchrun sets those for its workers


def test_a_single_process_job_is_launched_as_before_and_gets_a_checkpoint_dir(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2)
    cluster.tick_at(T0)
    launched = cluster.proc(job).spec
    assert launched.processes == () and launched.marker is None
    assert launched.log_path == cluster.data_dir.log(job, 1)
    assert launched.env["GPUCLUSTER_CHECKPOINT_DIR"] == str(cluster.data_dir.checkpoints(job))
    assert "RANK" not in launched.env and "GPUCLUSTER_ATTEMPT_DIR" not in launched.env
    assert cluster.record(job).launch == {"job_id": job, "attempt": 1}


def test_all_ranks_exiting_zero_succeeds(cluster: Cluster) -> None:
    job = cluster.submit(gpus=4, per_gpu=True)
    cluster.tick_at(T0)
    cluster.fake.end_rank(job, 0, Exited(0))  # rank 0 first: the others still run, nothing happens
    cluster.tick_at(T0 + 1)
    assert cluster.state(job) is JobState.RUNNING and cluster.proc(job).signals == []
    cluster.fake.finish(job, 0)
    cluster.tick_at(T0 + 2)
    r = cluster.record(job)
    assert (r.state, r.reason, r.exit_code) == (JobState.SUCCEEDED, "exit code 0 on all 4 ranks", 0)
    (a,) = cluster.service.job(job).attempts
    assert (a.outcome, a.exit_codes, a.work_lost_s, a.gpus) == ("succeeded", [0, 0, 0, 0], None, 4)


# ---- failures and restarts ---------------------------------------------------------------------


def test_a_dead_rank_gets_the_others_killed_and_the_job_restarts_after_a_backoff(cluster: Cluster) -> None:
    job = cluster.submit(gpus=4, per_gpu=True, max_restarts=2)
    cluster.tick_at(T0)
    cluster.fake.exit_on_signal[SIGKILL] = 137  # the survivors die of the head's SIGKILL
    cluster.fake.end_rank(job, 2, KILLED)
    cluster.tick_at(T0 + 5)
    r = cluster.record(job)
    assert (r.state, r.stop_reason, r.stop_message) == (JobState.RUNNING, "failure", "rank 2 killed by SIGKILL")
    assert cluster.proc(job).signals == [SIGKILL]  # at once, no SIGTERM, no grace period
    assert r.kill_sent
    cluster.tick_at(T0 + 5.2)
    r = cluster.record(job)
    assert r.state is JobState.QUEUED
    assert cluster.store.events(job)[-1].reason == "rank 2 killed by SIGKILL; restart 1 of 2 in 1s"
    assert r.wait_reason == "backoff"  # the plan of the same cycle says why it waits
    assert (r.restarts, r.not_before, r.exit_code, r.allocation, r.launch) == (1, T0 + 5.2 + BACKOFF, 137, None, None)
    (a,) = cluster.store.attempts(job)
    assert (a.outcome, a.reason, a.exit_codes) == ("failed", "rank 2 killed by SIGKILL", (137, 137, 137, 137))
    assert a.work_lost_s == 5.0  # no checkpoint: everything since the start, up to the failure

    cluster.tick_at(T0 + 5.5)  # backing off: not scheduled although all GPUs are free
    r = cluster.record(job)
    assert (r.state, r.wait_reason) == (JobState.QUEUED, "backoff")
    assert r.estimated_start == T0 + 6.2 and "held back until" in reason_text(r.reason)
    assert cluster.service.job(job).not_before == T0 + 6.2
    cluster.tick_at(T0 + 6.2)
    r = cluster.record(job)
    assert (r.state, r.attempt, r.not_before) == (JobState.RUNNING, 2, None)
    env2 = cluster.proc(job, 2).spec.processes[0].env
    assert env2["GPUCLUSTER_ATTEMPT"] == "2" and env2["GPUCLUSTER_RDZV_PREFIX"].endswith("attempt-2/")
    assert env2["GPUCLUSTER_CHECKPOINT_DIR"] == str(cluster.data_dir.checkpoints(job))

    # the second failure backs off twice as long
    cluster.fake.finish(job, 1)
    cluster.tick_at(T0 + 10)
    r = cluster.record(job)
    assert cluster.store.events(job)[-1].reason == "rank 0 exit code 1; restart 2 of 2 in 2s"
    assert r.not_before == T0 + 12
    cluster.tick_at(T0 + 12)
    cluster.fake.finish(job, 1)
    cluster.tick_at(T0 + 13)
    r = cluster.record(job)
    assert r.state is JobState.FAILED
    assert r.reason == "rank 0 exit code 1; no restarts left (2 of 2 used)"
    assert [a.outcome for a in cluster.store.attempts(job)] == ["failed", "failed", "failed"]
    wire = cluster.service.job(job)
    assert wire.restarts == 2 and [a.attempt for a in wire.attempts] == [1, 2, 3]


def test_without_restarts_a_failed_rank_fails_the_job(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True)
    cluster.tick_at(T0)
    cluster.fake.end_rank(job, 1, Exited(3))
    cluster.tick_at(T0 + 1)
    cluster.fake.end_rank(job, 0, KILLED)
    cluster.tick_at(T0 + 2)
    r = cluster.record(job)
    assert (r.state, r.reason, r.exit_code) == (JobState.FAILED, "rank 1 exit code 3", 3)


def test_a_single_process_job_restarts_on_failure_too(cluster: Cluster) -> None:
    job = cluster.submit(max_restarts=1)
    cluster.tick_at(T0)
    cluster.fake.finish(job, 2)
    cluster.tick_at(T0 + 1)
    assert cluster.store.events(job)[-1].reason == "exit code 2; restart 1 of 1 in 1s"
    cluster.tick_at(T0 + 2)
    cluster.fake.finish(job, 2)
    cluster.tick_at(T0 + 3)
    r = cluster.record(job)
    assert (r.state, r.reason) == (JobState.FAILED, "exit code 2; no restarts left (1 of 1 used)")


def test_a_cancel_is_never_restarted(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True, max_restarts=3)
    cluster.tick_at(T0)
    cluster.service.cancel(job)
    cluster.tick_at(T0 + 1)
    assert cluster.proc(job).signals == [SIGTERM]
    cluster.fake.finish(job, 1)
    cluster.tick_at(T0 + 2)
    r = cluster.record(job)
    assert (r.state, r.reason) == (JobState.CANCELLED, "cancelled by user (rank 0 exit code 1)")
    assert [a.outcome for a in cluster.store.attempts(job)] == ["cancelled"]


def test_the_work_lost_counts_from_the_last_checkpoint_to_the_failure(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True, max_restarts=1)
    cluster.tick_at(T0)
    cluster.service.progress(job, ProgressIn(step=500, checkpoint_at=T0 + 20, checkpoint_step=500))
    cluster.fake.end_rank(job, 1, KILLED)
    cluster.tick_at(T0 + 23)
    cluster.fake.finish(job, 1)
    cluster.tick_at(T0 + 24)
    (a,) = cluster.store.attempts(job)
    assert a.work_lost_s == 3.0  # noticed at T0+23, last checkpoint at T0+20


def test_work_lost_prefers_the_newest_file_in_the_checkpoint_dir(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True)
    cluster.tick_at(T0)
    record = cluster.record(job)
    assert work_lost(record, T0 + 50) == 50.0
    assert work_lost(record, T0 + 50, checkpoint_at=T0 + 45) == 5.0
    assert work_lost(record, T0 + 50, checkpoint_at=T0 - 100) == 50.0  # older than this attempt


# ---- requeue and progress ----------------------------------------------------------------------


def test_requeue_stops_every_rank_and_the_job_resumes_as_a_new_attempt(cluster: Cluster) -> None:
    job = cluster.submit(gpus=4, per_gpu=True)
    cluster.tick_at(T0)
    wire = cluster.service.requeue(job)
    assert wire.state is JobState.RUNNING
    assert cluster.service.requeue(job).state is JobState.RUNNING  # a second one changes nothing
    r = cluster.record(job)
    assert (r.stop_reason, r.stop_message, r.stop_requested_at) == ("preempt", "requeued by user", T0)
    cluster.tick_at(T0 + 1)
    assert cluster.proc(job).signals == [SIGTERM]
    # the job checkpoints (and says so) and every rank exits "requeue me"
    cluster.service.progress(job, ProgressIn(step=170, checkpoint_at=T0 + 1.5, checkpoint_step=170))
    cluster.fake.finish(job, REQUEUE_EXIT_CODE)
    cluster.tick_at(T0 + 2)
    r = cluster.record(job)
    assert (r.state, r.attempt) == (JobState.RUNNING, 2)  # GPUs were free: restarted at once
    states = [(e.state, e.reason) for e in cluster.store.events(job)][-3:]
    assert states == [
        (JobState.PREEMPTED, "requeued by user (exit code 79 on all 4 ranks)"),
        (JobState.QUEUED, "requeued after preemption"),
        (JobState.RUNNING, "started on n1 GPUs 0,1,2,3"),
    ]
    first, second = cluster.service.job(job).attempts
    assert (first.outcome, first.exit_codes, first.work_lost_s) == ("preempted", [79] * 4, 0.0)
    assert (second.outcome, second.ended_at, second.started_at) == ("running", None, T0 + 2)
    assert r.restarts == 0  # a requeue is not a failure


def test_requeue_in_launcher_mode_trusts_the_heads_intent_over_torchruns_exit_code(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, launcher="torchrun")
    cluster.tick_at(T0)
    cluster.service.requeue(job)
    cluster.tick_at(T0 + 1)
    cluster.fake.finish(job, 1)  # torchrun exits 1 after forwarding SIGTERM, however its workers ended
    cluster.tick_at(T0 + 2)
    assert [e.state for e in cluster.store.events(job)][-3:] == [
        JobState.PREEMPTED,
        JobState.QUEUED,
        JobState.RUNNING,
    ]
    (a,) = cluster.store.attempts(job)
    # it reported no checkpoint: all it did until it exited is lost
    assert a.work_lost_s == 2.0 and a.reason == "requeued by user (exit code 1)"


def test_requeue_refuses_jobs_that_are_not_running(cluster: Cluster) -> None:
    blocker = cluster.submit(gpus=8)
    waiting = cluster.submit(gpus=8)
    cluster.tick_at(T0)
    with pytest.raises(Conflict, match="is queued; only a running job can be requeued"):
        cluster.service.requeue(waiting)
    cluster.service.cancel(blocker)
    with pytest.raises(Conflict, match=r"already stopping \(cancel\)"):
        cluster.service.requeue(blocker)
    with pytest.raises(NotFound):
        cluster.service.requeue(999)


def test_a_job_that_exits_79_on_its_own_is_requeued_after_a_backoff(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True)
    cluster.tick_at(T0)
    cluster.fake.finish(job, REQUEUE_EXIT_CODE)  # SIGTERM from someone else (a node shutting down)
    cluster.tick_at(T0 + 1)
    r = cluster.record(job)
    assert (r.state, r.not_before, r.restarts) == (JobState.QUEUED, T0 + 1 + BACKOFF, 0)
    assert cluster.store.events(job)[-2].reason == "the job asked to be requeued (exit code 79 on all 2 ranks)"
    cluster.tick_at(T0 + 2)
    assert cluster.record(job).attempt == 2


def test_progress_reports_are_stored_shown_and_used_for_victim_choice(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True)
    with pytest.raises(Conflict, match="not running"):
        cluster.service.progress(job, ProgressIn(step=1))
    with pytest.raises(NotFound):
        cluster.service.progress(999, ProgressIn(step=1))
    cluster.tick_at(T0)
    cluster.clock.t = T0 + 30
    cluster.service.progress(job, ProgressIn(step=1200, checkpoint_at=T0 + 25, checkpoint_step=1000))
    cluster.service.progress(job, ProgressIn(step=1300))  # checkpoint fields stay
    p = cluster.service.job(job).progress
    assert p is not None
    assert (p.step, p.reported_at, p.checkpoint_at, p.checkpoint_step) == (1300, T0 + 30, T0 + 25, 1000)
    (running,) = cluster.store.running_jobs()
    assert running.last_checkpoint_at == T0 + 25


def test_a_checkpoint_from_before_this_attempt_is_not_this_attempts_for_victim_choice(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2)
    cluster.tick_at(T0)
    cluster.service.progress(job, ProgressIn(step=10, checkpoint_at=T0 - 50, checkpoint_step=10))
    (running,) = cluster.store.running_jobs()
    assert running.last_checkpoint_at is None  # the scheduler then counts from the start


# ---- elastic -----------------------------------------------------------------------------------


def test_an_elastic_job_runs_at_the_largest_size_that_fits_now(cluster: Cluster) -> None:
    other = cluster.submit(gpus=5)
    cluster.tick_at(T0)
    small = cluster.submit(gpus="2..8", per_gpu=True)
    cluster.tick_at(T0 + 1)
    r = cluster.record(small)
    assert r.state is JobState.RUNNING and r.allocation == allocation("n1", 5, 6, 7)
    envs = [p.env for p in cluster.proc(small).spec.processes]
    assert [e["WORLD_SIZE"] for e in envs] == ["3", "3", "3"]
    wire = cluster.service.job(small)
    assert wire.spec.gpus_label == "2..8" and wire.attempts[0].gpus == 3
    # requeued while the other job is gone, it comes back at full size
    cluster.fake.finish(other, 0)
    cluster.service.requeue(small)
    cluster.tick_at(T0 + 2)
    cluster.fake.finish(small, REQUEUE_EXIT_CODE)
    cluster.tick_at(T0 + 3)
    r = cluster.record(small)
    assert r.attempt == 2 and r.allocation is not None and r.allocation.gpu_count == 8
    assert cluster.proc(small, 2).spec.processes[0].env["WORLD_SIZE"] == "8"


def test_an_elastic_job_below_its_minimum_waits(cluster: Cluster) -> None:
    cluster.submit(gpus=7)
    cluster.tick_at(T0)
    job = cluster.submit(gpus="2..4")
    cluster.tick_at(T0 + 1)
    r = cluster.record(job)
    assert r.state is JobState.QUEUED and r.wait_reason == "reserved"
    assert "2 H100 GPUs" in reason_text(r.reason)  # it waits for its minimum size


def test_an_elastic_job_is_refused_only_if_its_minimum_can_never_fit(cluster: Cluster) -> None:
    job = cluster.service.submit(spec(gpus="4..16"))
    assert job.spec.min_gpus == 4 and job.spec.gpus == 16
    with pytest.raises(Exception, match=r"asks for 9\.\.16 GPUs"):
        cluster.service.submit(spec(gpus="9..16"))


# ---- crash safety ------------------------------------------------------------------------------


def _commit_running(c: Cluster, job: int) -> None:
    """What the head commits before launching; then it dies."""
    assert c.store.transition(
        job,
        JobState.RUNNING,
        T0,
        "started on n1 GPUs 0,1,2,3",
        expect=[JobState.QUEUED],
        allocation=allocation("n1", 0, 1, 2, 3),
        attempt=1,
        started_at=T0,
    )


def test_a_launch_cut_short_by_a_head_crash_is_killed_and_requeued_after_the_grace(cluster: Cluster) -> None:
    job = cluster.submit(gpus=4, per_gpu=True)
    _commit_running(cluster, job)
    # Two of four ranks had started when the head died.
    partial = {"ranks": [{"rank": 0}, {"rank": 1}], "expected": 4, "job_id": job, "attempt": 1}
    cluster.fake.recoverable[str(cluster.data_dir.run_dir(job, 1))] = partial
    cluster.fake.processes[(job, 1)] = FakeProcess(_fake_spec(4))
    cluster.tick_at(T0 + 1)
    assert cluster.state(job) is JobState.RUNNING and cluster.proc(job).signals == []  # may still be starting
    cluster.tick_at(T0 + LAUNCH_GRACE_S + 1)
    assert cluster.proc(job).signals == [SIGKILL]
    r = cluster.record(job)
    assert (r.state, r.attempt) == (JobState.RUNNING, 2)  # requeued, and restarted in the same cycle
    reasons = [e.reason for e in cluster.store.events(job)]
    assert reasons[-2] == "requeued: the head stopped while starting the job's processes"
    (a,) = cluster.store.attempts(job)
    assert (a.outcome, a.work_lost_s) == ("not_started", None)


def test_a_complete_launch_found_after_a_head_crash_is_adopted(cluster: Cluster) -> None:
    job = cluster.submit(gpus=4, per_gpu=True)
    _commit_running(cluster, job)
    whole = {"ranks": [{"rank": r} for r in range(4)], "expected": 4, "job_id": job, "attempt": 1}
    cluster.fake.recoverable[str(cluster.data_dir.run_dir(job, 1))] = whole
    cluster.fake.processes[(job, 1)] = FakeProcess(_fake_spec(4))
    cluster.tick_at(T0 + 1)
    assert cluster.record(job).launch == whole
    cluster.fake.end_rank(job, 3, Exited(1))
    cluster.tick_at(T0 + 2)
    assert cluster.proc(job).signals == [SIGKILL]
    assert isinstance(cluster.proc(job).ranks[0], Running)


def _fake_spec(n: int):  # type: ignore[no-untyped-def]
    from gpucluster.executors.base import LaunchSpec, ProcessSpec

    p = ProcessSpec(["x"], {}, Path("/nonexistent"), Path("/nonexistent/log"))
    return LaunchSpec(1, 1, ["x"], {}, "/", Path("/nonexistent"), Path("/nonexistent/log"), processes=(p,) * n)


# ---- logs --------------------------------------------------------------------------------------


def test_logs_of_a_distributed_job_are_per_rank(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True)
    single = cluster.submit(gpus=1)
    cluster.tick_at(T0)
    assert cluster.service.log_path(job, None)[0] == cluster.data_dir.log(job, 1, 0)
    assert cluster.service.log_path(job, 1, 1)[0] == cluster.data_dir.log(job, 1, 1)
    # Ranks get their directories one after another as they start: while rank 1's is not there
    # yet it has logged nothing, it is not a wrong rank (this raced in a Ray test).
    cluster.data_dir.rank_dir(job, 1, 0).mkdir(parents=True)
    assert cluster.service.log_path(job, 1, 1)[0] == cluster.data_dir.log(job, 1, 1)
    cluster.data_dir.rank_dir(job, 1, 1).mkdir(parents=True)
    with pytest.raises(NotFound, match=r"has no rank 5 \(it ran ranks 0..1\)"):
        cluster.service.log_path(job, 1, 5)
    assert cluster.service.log_path(single, None, 0)[0] == cluster.data_dir.log(single, 1)
    with pytest.raises(NotFound, match="runs one process"):
        cluster.service.log_path(single, None, 1)


# ---- store -------------------------------------------------------------------------------------


def test_a_schema_2_data_dir_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE attempts")
        for col in ("not_before", "restarts", "progress_step", "progress_at", "checkpoint_step"):
            conn.execute(f"ALTER TABLE jobs DROP COLUMN {col}")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
    store = Store(db)
    try:
        job = store.create_job(spec(), T0)
        assert store.record_progress(job, T0, 1, None, None) is False  # queued: not recorded
        record = store.get_job(job)
        assert record is not None and record.restarts == 0 and record.not_before is None
        assert store.attempts(job) == []
    finally:
        store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (str(schema.SCHEMA_VERSION),)


def test_a_cancel_while_a_failed_rank_is_handled_wins_over_the_restart(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True, max_restarts=3)
    cluster.tick_at(T0)
    cluster.fake.end_rank(job, 1, Exited(2))
    cluster.tick_at(T0 + 1)  # rank 0 is being killed
    assert cluster.record(job).stop_reason == "failure"
    cluster.service.cancel(job)
    cluster.fake.end_rank(job, 0, KILLED)
    cluster.tick_at(T0 + 2)
    r = cluster.record(job)
    assert (r.state, r.reason, r.exit_code) == (JobState.CANCELLED, "cancelled by user (rank 1 exit code 2)", 2)


# ---- a stop the head asked for: every rank gets the whole grace (issue 17) ---------------------


@pytest.mark.parametrize("ended", [Exited(128 + SIGTERM), Exited(-SIGTERM, SIGTERM), Exited(0), Exited(1)])
def test_a_rank_ending_during_a_requeue_does_not_cut_the_others_grace_short(cluster: Cluster, ended: Exited) -> None:
    """A rank that exits on SIGTERM (143, the normal end) while rank 0 still saves is no failure:
    rank 0 keeps the whole grace period; the attempt is a preemption, not a failed one."""
    job = cluster.submit(gpus=4, per_gpu=True, max_restarts=2)
    cluster.tick_at(T0)
    cluster.service.requeue(job)
    cluster.tick_at(T0 + 1)
    assert cluster.proc(job).signals == [SIGTERM]
    for rank in (1, 2, 3):
        cluster.fake.end_rank(job, rank, ended)
    cluster.tick_at(T0 + 2)
    cluster.tick_at(T0 + GRACE - 1)  # rank 0 still saving, inside the grace: nothing killed
    r = cluster.record(job)
    assert (r.state, r.stop_reason, r.kill_sent) == (JobState.RUNNING, "preempt", False)
    assert cluster.proc(job).signals == [SIGTERM]
    cluster.fake.end_rank(job, 0, Exited(REQUEUE_EXIT_CODE))
    cluster.tick_at(T0 + GRACE - 0.5)
    (a,) = cluster.store.attempts(job)
    assert a.outcome == "preempted" and cluster.record(job).restarts == 0


def test_a_rank_that_outlives_the_grace_of_a_requeue_is_killed(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True)
    cluster.tick_at(T0)
    cluster.service.requeue(job)
    cluster.tick_at(T0 + 1)
    cluster.fake.end_rank(job, 1, Exited(128 + SIGTERM))
    cluster.tick_at(T0 + GRACE + 0.5)
    assert cluster.proc(job).signals == [SIGTERM, SIGKILL]


def test_a_143_exit_without_a_stop_asked_is_still_a_failure(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, per_gpu=True)
    cluster.tick_at(T0)
    cluster.fake.end_rank(job, 1, Exited(128 + SIGTERM))  # someone else's SIGTERM
    cluster.tick_at(T0 + 1)
    assert cluster.proc(job).signals == [SIGKILL]
    assert cluster.record(job).stop_message == "rank 1 exit code 143"
