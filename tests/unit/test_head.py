"""head.loop.Head and head.service.ClusterService driven by a fake executor and a fake clock."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from gpucluster.core.states import JobState
from gpucluster.executors.base import Exited, Handle, LaunchSpec, Lost, Running
from gpucluster.head.loop import Head
from gpucluster.head.recovery import LAUNCH_GRACE_S
from gpucluster.head.service import Conflict, NotFound, Rejected
from gpucluster.store import DatabaseUnavailable, Store, schema
from gpucluster.store.access import AccessStore
from gpucluster.waits_text import reason_text

from .builders import allocation, node, spec
from .headkit import T0, Cluster, make_cluster

GRACE = 30.0
SIGTERM, SIGKILL = int(signal.SIGTERM), int(signal.SIGKILL)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(
        tmp_path,
        grace_period_s=GRACE,
        head_url="http://head:8080",
        base_env={
            "HOME": "/home/alice",
            "PATH": "/usr/bin:/bin",
            "GPUCLUSTER_TOKEN": "s3cret",
            "GPUCLUSTER_DATABASE_URL": "postgresql://head:pw@db/gc",
            "LD_PRELOAD": "/tmp/evil.so",
            "LC_ALL": "C.UTF-8",
        },
    )
    yield c
    c.close()


# ---- submit -> run -> finish -------------------------------------------------------------------


def test_submit_then_tick_runs_the_job_with_its_allocation_and_env(cluster: Cluster) -> None:
    job = cluster.service.submit(
        spec(command=["python", "train.py"], gpus=2, gpu_type="H100", name="train", env={"SEED": "7"})
    )
    assert job.state is JobState.QUEUED
    assert job.attempt == 0
    assert job.submitted_at == T0
    assert cluster.fake.processes == {}

    cluster.tick_at(T0 + 1)

    record = cluster.store.get_job(job.id)
    assert record is not None
    assert record.state is JobState.RUNNING
    assert record.attempt == 1
    assert record.started_at == T0 + 1
    assert record.allocation == allocation("n1", 0, 1)
    assert record.launch == {"job_id": job.id, "attempt": 1}
    assert record.reason == "started on n1 GPUs 0,1"

    launched = cluster.proc(job.id).spec
    assert launched.argv == ["python", "train.py"]
    assert launched.attempt == 1
    assert launched.workdir == "~"  # no workdir given: the home of the account it runs as
    assert launched.run_dir == cluster.data_dir.run_dir(job.id, 1)  # the head's own records
    assert launched.job_dir == cluster.data_dir.job_dir(job.id)
    assert launched.log_path == cluster.data_dir.log(job.id, 1)
    env = launched.env
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUCLUSTER_JOB_ID"] == str(job.id)
    assert env["GPUCLUSTER_JOB_NAME"] == "train"
    assert env["GPUCLUSTER_ATTEMPT"] == "1"
    assert env["GPUCLUSTER_NODE"] == "n1"
    assert env["GPUCLUSTER_NUM_GPUS"] == "2"
    assert env["GPUCLUSTER_URL"] == "http://head:8080"
    assert env["SEED"] == "7"
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["LC_ALL"] == "C.UTF-8"
    # Only an allow-list of the head's environment is inherited: no secret, no loader variable.
    assert not {"GPUCLUSTER_TOKEN", "GPUCLUSTER_DATABASE_URL", "LD_PRELOAD", "HOME"} & env.keys()

    wire = cluster.service.job(job.id)
    assert wire.state is JobState.RUNNING
    assert [(s.node, s.gpu_indices) for s in wire.allocation] == [("n1", [0, 1])]
    gpus = cluster.service.nodes()[0].gpus
    assert [g.job_id for g in gpus] == [job.id, job.id, None, None, None, None, None, None]


def test_env_visible_devices_match_the_allocation_when_gpus_are_busy(cluster: Cluster) -> None:
    first = cluster.submit(gpus=3)
    cluster.tick_at(T0)
    second = cluster.submit(gpus=2)
    cluster.tick_at(T0 + 1)
    a1 = cluster.store.get_job(first)
    a2 = cluster.store.get_job(second)
    assert a1 is not None and a2 is not None and a1.allocation and a2.allocation
    assert not a1.allocation.gpu_keys() & a2.allocation.gpu_keys()
    for record in (a1, a2):
        assert record.allocation is not None
        indices = record.allocation.slices[0].gpu_indices
        assert cluster.proc(record.id).spec.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, indices))
    assert cluster.proc(second).spec.env["CUDA_VISIBLE_DEVICES"] == "3,4"


def test_workdir_from_the_spec_is_used(cluster: Cluster) -> None:
    job_id = cluster.submit(workdir="/data/run1")
    cluster.tick_at(T0)
    assert cluster.proc(job_id).spec.workdir == "/data/run1"


def test_shell_job_runs_through_sh(cluster: Cluster) -> None:
    job_id = cluster.submit(command=["echo $HOME && sleep 1"], shell=True)
    cluster.tick_at(T0)
    assert cluster.proc(job_id).spec.argv == ["/bin/sh", "-c", "echo $HOME && sleep 1"]


def test_exit_zero_succeeds(cluster: Cluster) -> None:
    job_id = cluster.submit(gpus=8)
    cluster.tick_at(T0)
    cluster.fake.finish(job_id, 0)
    cluster.tick_at(T0 + 5)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.SUCCEEDED
    assert record.exit_code == 0
    assert record.ended_at == T0 + 5
    assert record.reason == "exit code 0"
    assert cluster.store.running_allocations() == []


def test_nonzero_exit_fails_with_the_exit_code(cluster: Cluster) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.fake.finish(job_id, 3)
    cluster.tick_at(T0 + 1)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.FAILED
    assert record.exit_code == 3
    assert record.reason == "exit code 3"


def test_finished_job_frees_its_gpus_for_the_next(cluster: Cluster) -> None:
    big1 = cluster.submit(gpus=8)
    big2 = cluster.submit(gpus=8)
    cluster.tick_at(T0)
    assert cluster.state(big1) is JobState.RUNNING
    assert cluster.state(big2) is JobState.QUEUED
    waiting = cluster.store.get_job(big2)
    assert waiting is not None
    assert waiting.wait_reason == "reserved"  # first in line: n1 is held for it
    assert reason_text(waiting.reason).startswith("first in line: 8 H100 GPUs on n1")
    assert waiting.estimated_start == T0 + 3600  # big1 started at T0 with the default 1 h limit
    wire = cluster.service.job(big2)
    assert (wire.wait_reason, wire.estimated_start) == ("reserved", T0 + 3600)
    cluster.fake.finish(big1, 0)
    cluster.tick_at(T0 + 1)  # reconcile frees the GPUs before scheduling in the same cycle
    assert cluster.state(big1) is JobState.SUCCEEDED
    assert cluster.state(big2) is JobState.RUNNING
    assert cluster.proc(big2).spec.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_the_starts_and_the_ends_of_one_cycle_share_their_commits(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18 (the head's CPU per job): six jobs starting, or ending, in one cycle cost the
    head the commits of one, not six times them. And still every launch finds its job's start
    durable: a second connection reads it running, with its allocation, before it launches."""
    commits: list[int] = []
    event.listen(cluster.store._writer, "commit", lambda _conn: commits.append(1))
    other = Store(cluster.tmp / "state.db")
    durable: dict[int, bool] = {}
    launch = cluster.fake.launch

    def launch_after_its_commit(spec: LaunchSpec) -> Handle:
        seen = other.get_job(spec.job_id)
        durable[spec.job_id] = seen is not None and seen.state is JobState.RUNNING and seen.allocation is not None
        return launch(spec)

    monkeypatch.setattr(cluster.fake, "launch", launch_after_its_commit)

    def commits_of_tick(t: float) -> int:
        before = len(commits)
        cluster.tick_at(t)
        return len(commits) - before

    try:
        cluster.tick_at(T0)  # a head's first cycle writes what later ones do not
        one = cluster.submit(gpus=1)
        start_one = commits_of_tick(T0 + 1)
        six = [cluster.submit(gpus=1) for _ in range(6)]
        start_six = commits_of_tick(T0 + 2)
        assert [cluster.state(j) for j in (one, *six)] == [JobState.RUNNING] * 7
        cluster.fake.finish(one, 0)
        end_one = commits_of_tick(T0 + 3)
        for j in six:
            cluster.fake.finish(j, 0)
        end_six = commits_of_tick(T0 + 4)
        assert [cluster.state(j) for j in (one, *six)] == [JobState.SUCCEEDED] * 7
    finally:
        other.close()
    assert durable == dict.fromkeys((one, *six), True)
    assert (start_six, end_six) == (start_one, end_one)


def test_the_starts_and_the_ends_of_one_cycle_read_their_jobs_once(cluster: Cluster) -> None:
    """Issue 18 (the head's CPU per job): a cycle reads its starting jobs, and its ending jobs,
    in one query each: six starts or six ends in one cycle cost the reads of one. (Before:
    one read of the job per start and one per end.) A quiet cycle between the measured ones
    reads back what the one before told, so each measured cycle starts from the same place.
    Counted: the reads of whole job records (every column of `jobs`), not the estimates'
    replays, whose CPU-bound throttle may skip one on a loaded machine; as SQLite's driver runs
    them (the store runs these reads past SQLAlchemy there: store/driver_sql.py)."""
    whole_record = str(select(schema.jobs)).split("FROM")[0].rstrip()
    reads: list[str] = []

    def read(statement: str) -> None:
        if statement.startswith(whole_record):
            reads.append(statement)

    def traced(dbapi_connection: Any, *_: object) -> None:
        dbapi_connection.set_trace_callback(read)

    event.listen(cluster.store._reader, "checkout", traced)
    t = T0

    def reads_of_tick() -> int:
        nonlocal t
        before = len(reads)
        cluster.tick_at(t := t + 1)
        counted = len(reads) - before
        cluster.tick_at(t := t + 1)  # quiet
        return counted

    reads_of_tick()  # a head's first cycle reads what later ones do not
    one = cluster.submit(gpus=1)
    start_one = reads_of_tick()
    six = [cluster.submit(gpus=1) for _ in range(6)]
    start_six = reads_of_tick()
    assert [cluster.state(j) for j in (one, *six)] == [JobState.RUNNING] * 7
    cluster.fake.finish(one, 0)
    end_one = reads_of_tick()
    for j in six:
        cluster.fake.finish(j, 0)
    end_six = reads_of_tick()
    assert [cluster.state(j) for j in (one, *six)] == [JobState.SUCCEEDED] * 7
    assert start_one > 0 and end_one > 0
    assert (start_six, end_six) == (start_one, end_one)


# ---- cancel ------------------------------------------------------------------------------------


def test_cancel_queued_is_immediate(cluster: Cluster) -> None:
    blocker = cluster.submit(gpus=8)
    cluster.tick_at(T0)
    job_id = cluster.submit(gpus=8)
    cluster.clock.t = T0 + 2
    out = cluster.service.cancel(job_id)
    assert out.state is JobState.CANCELLED
    assert out.ended_at == T0 + 2
    assert out.reason == "cancelled by user while queued"
    cluster.fake.finish(blocker, 0)
    cluster.tick_at(T0 + 3)
    assert cluster.state(job_id) is JobState.CANCELLED
    assert (job_id, 1) not in cluster.fake.processes


def test_cancel_running_sends_sigterm_then_sigkill_after_grace(cluster: Cluster) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.clock.t = T0 + 10
    out = cluster.service.cancel(job_id)
    assert out.state is JobState.RUNNING  # the process must be stopped first
    assert cluster.proc(job_id).signals == []

    cluster.tick_at(T0 + 10)
    assert cluster.proc(job_id).signals == [SIGTERM]
    cluster.tick_at(T0 + 10 + GRACE - 0.5)
    assert cluster.proc(job_id).signals == [SIGTERM], "SIGKILL before the grace period ended"
    assert cluster.state(job_id) is JobState.RUNNING

    cluster.fake.exit_on_signal[SIGKILL] = 128 + SIGKILL
    cluster.tick_at(T0 + 10 + GRACE)
    assert cluster.proc(job_id).signals == [SIGTERM, SIGKILL]
    cluster.tick_at(T0 + 10 + GRACE + 1)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.CANCELLED
    assert record.exit_code == 128 + SIGKILL
    assert record.reason == "cancelled by user (killed by SIGKILL)"
    cluster.tick_at(T0 + 100)
    assert cluster.proc(job_id).signals == [SIGTERM, SIGKILL]  # nothing more once ended


def test_cancel_running_job_that_exits_on_sigterm_is_never_killed(cluster: Cluster) -> None:
    cluster.fake.exit_on_signal[SIGTERM] = 128 + SIGTERM
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.service.cancel(job_id)
    cluster.tick_at(T0 + 1)
    cluster.tick_at(T0 + 1 + GRACE * 2)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.CANCELLED
    assert record.reason == "cancelled by user (killed by SIGTERM)"
    assert cluster.proc(job_id).signals == [SIGTERM]


def test_second_cancel_does_not_restart_the_grace_period(cluster: Cluster) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.service.cancel(job_id)
    cluster.tick_at(T0 + 1)
    cluster.clock.t = T0 + GRACE - 1
    cluster.service.cancel(job_id)
    cluster.tick_at(T0 + GRACE)
    assert cluster.proc(job_id).signals == [SIGTERM, SIGKILL]


def test_process_lost_after_sigkill_counts_as_killed(cluster: Cluster) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.service.cancel(job_id)
    cluster.tick_at(T0)
    cluster.tick_at(T0 + GRACE)
    assert cluster.proc(job_id).signals == [SIGTERM, SIGKILL]
    cluster.proc(job_id).status = Lost("no such process group")
    cluster.tick_at(T0 + GRACE + 1)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.CANCELLED
    assert record.exit_code == 128 + SIGKILL
    assert record.reason == "cancelled by user (killed by SIGKILL)"


# ---- time limit --------------------------------------------------------------------------------


def test_time_limit_sigterm_then_sigkill_then_failed(cluster: Cluster) -> None:
    job_id = cluster.submit(time_limit="1m")
    cluster.tick_at(T0)
    cluster.tick_at(T0 + 59)
    assert cluster.proc(job_id).signals == []

    cluster.tick_at(T0 + 61)
    assert cluster.proc(job_id).signals == [SIGTERM]
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.stop_reason == "time_limit"
    assert record.stop_requested_at == T0 + 61

    cluster.tick_at(T0 + 61 + GRACE - 1)
    assert cluster.proc(job_id).signals == [SIGTERM]
    cluster.tick_at(T0 + 61 + GRACE)
    assert cluster.proc(job_id).signals == [SIGTERM, SIGKILL]
    assert cluster.state(job_id) is JobState.RUNNING

    cluster.proc(job_id).status = Exited(128 + SIGKILL, SIGKILL)
    cluster.tick_at(T0 + 61 + GRACE + 1)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.FAILED
    assert record.exit_code == 128 + SIGKILL
    assert record.reason == "time limit 1m exceeded (killed by SIGKILL)"


def test_time_limit_reached_exactly_sends_sigterm(cluster: Cluster) -> None:
    job_id = cluster.submit(time_limit=90)
    cluster.tick_at(T0)
    cluster.tick_at(T0 + 90)
    assert cluster.proc(job_id).signals == [SIGTERM]


def test_time_limit_job_that_stops_on_sigterm_fails_naming_the_limit(cluster: Cluster) -> None:
    cluster.fake.exit_on_signal[SIGTERM] = 128 + SIGTERM
    job_id = cluster.submit(time_limit="1h30m")
    cluster.tick_at(T0)
    cluster.tick_at(T0 + 5400)
    cluster.tick_at(T0 + 5401)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.FAILED
    assert record.reason == "time limit 1h30m exceeded (killed by SIGTERM)"
    assert cluster.proc(job_id).signals == [SIGTERM]


def test_job_without_time_limit_is_never_stopped(cluster: Cluster) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.tick_at(T0 + 400 * 86400)
    assert cluster.proc(job_id).signals == []
    assert cluster.state(job_id) is JobState.RUNNING


def test_cancel_during_time_limit_grace_does_not_postpone_sigkill(cluster: Cluster) -> None:
    job_id = cluster.submit(time_limit=60)
    cluster.tick_at(T0)
    cluster.tick_at(T0 + 60)  # SIGTERM for the time limit; SIGKILL due at T0 + 60 + GRACE
    assert cluster.proc(job_id).signals == [SIGTERM]
    cluster.clock.t = T0 + 60 + GRACE - 5
    cluster.service.cancel(job_id)
    cluster.tick_at(T0 + 60 + GRACE)
    assert cluster.proc(job_id).signals == [SIGTERM, SIGKILL]


# ---- launch failures and crash recovery --------------------------------------------------------


def test_launch_error_fails_the_job_and_frees_its_gpus(cluster: Cluster) -> None:
    bad = cluster.submit(gpus=8)
    cluster.fake.fail_launch[bad] = "no such program: trian.py"
    cluster.tick_at(T0)
    record = cluster.store.get_job(bad)
    assert record is not None
    assert record.state is JobState.FAILED
    assert record.reason == "could not start: no such program: trian.py"
    assert record.exit_code is None
    assert record.ended_at == T0
    assert cluster.store.running_allocations() == []
    good = cluster.submit(gpus=8)
    cluster.tick_at(T0 + 1)
    assert cluster.state(good) is JobState.RUNNING


def test_running_job_never_launched_is_requeued_after_grace_and_runs_again(cluster: Cluster) -> None:
    job_id = cluster.submit(gpus=2)
    # The head committed the allocation, then died before launching (no handle recorded).
    assert cluster.store.transition(
        job_id,
        JobState.RUNNING,
        T0,
        "started on n1 GPUs 0,1",
        expect=[JobState.QUEUED],
        allocation=allocation("n1", 0, 1),
        attempt=1,
        started_at=T0,
    )
    other = cluster.submit(gpus=6)
    cluster.tick_at(T0 + 1)
    assert cluster.state(other) is JobState.RUNNING  # the unlaunched job still holds GPUs 0,1
    assert cluster.proc(other).spec.env["CUDA_VISIBLE_DEVICES"] == "2,3,4,5,6,7"

    cluster.tick_at(T0 + LAUNCH_GRACE_S)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.RUNNING
    assert record.attempt == 1
    assert (job_id, 1) not in cluster.fake.processes

    cluster.tick_at(T0 + LAUNCH_GRACE_S + 1)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.RUNNING
    assert record.attempt == 2
    assert record.started_at == T0 + LAUNCH_GRACE_S + 1
    assert record.launch == {"job_id": job_id, "attempt": 2}
    assert cluster.proc(job_id, 2).spec.env["GPUCLUSTER_ATTEMPT"] == "2"
    assert (job_id, 1) not in cluster.fake.processes
    states = [(e.state, e.reason) for e in cluster.store.events(job_id)]
    assert states == [
        (JobState.QUEUED, "submitted"),
        (JobState.RUNNING, "started on n1 GPUs 0,1"),
        (JobState.QUEUED, "requeued: the head stopped before the process was launched"),
        (JobState.RUNNING, "started on n1 GPUs 0,1"),
    ]


def test_a_database_lost_right_after_the_start_commit_still_launches_that_attempt(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on CI with a PostgreSQL restart: the start was committed, the read after it failed,
    nothing was launched, and LAUNCH_GRACE_S later the job ran again as attempt 2. The launch
    needs no read after the commit, so the attempt that was committed is the one that runs."""
    job_id = cluster.submit(gpus=2)
    committed = cluster.store.transition

    def transition(*args: object, **kw: object) -> bool:
        ok = bool(committed(*args, **kw))
        if ok and args[1] is JobState.RUNNING:
            monkeypatch.setattr(cluster.store, "get_job", _unreachable)
        return ok

    monkeypatch.setattr(cluster.store, "transition", transition)
    cluster.tick_at(T0)
    monkeypatch.undo()
    assert cluster.proc(job_id, 1).spec.env["GPUCLUSTER_ATTEMPT"] == "1"
    record = cluster.record(job_id)
    assert (record.state, record.attempt, record.launch) == (JobState.RUNNING, 1, {"job_id": job_id, "attempt": 1})


def test_a_database_lost_right_after_the_start_commit_still_launches_as_the_jobs_user(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, under `gpucluster up` as root: the Unix account a job runs as is read from the
    store (its owner's mapping). Read after the commit, a PostgreSQL restart there left the
    committed attempt unlaunched (test_crash_consistency's PostgreSQL test, 2 runs in 8)."""

    access = AccessStore(cluster.store)

    class Identity:
        def job_env(self, job: object) -> dict[str, str]:
            return {}

        def run_as(self, owner: str | None) -> str | None:
            access.user(owner or "alice")  # the store read auth.control's makes
            return "alice"

    cluster.head.identity = Identity()  # type: ignore[assignment]
    job_id = cluster.submit(gpus=2)
    committed = cluster.store.transition

    def transition(*args: object, **kw: object) -> bool:
        ok = bool(committed(*args, **kw))
        if ok and args[1] is JobState.RUNNING:
            monkeypatch.setattr(cluster.store, "get_job", _unreachable)
            monkeypatch.setattr(cluster.store, "array", _unreachable)
            monkeypatch.setattr(access, "user", _unreachable)
        return ok

    monkeypatch.setattr(cluster.store, "transition", transition)
    cluster.tick_at(T0)
    monkeypatch.undo()
    assert cluster.proc(job_id, 1).spec.user == "alice"
    record = cluster.record(job_id)
    assert (record.state, record.attempt, record.launch) == (JobState.RUNNING, 1, {"job_id": job_id, "attempt": 1})


def _unreachable(*_: object) -> None:
    raise DatabaseUnavailable("database unavailable: connection refused")


def test_lost_process_fails_the_job(cluster: Cluster) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.proc(job_id).status = Lost("node rebooted")
    cluster.tick_at(T0 + 1)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.FAILED
    assert record.reason == "process lost: node rebooted"
    assert record.exit_code is None


def test_process_unknown_to_the_executor_is_lost(cluster: Cluster) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    del cluster.fake.processes[(job_id, 1)]
    cluster.tick_at(T0 + 1)
    record = cluster.store.get_job(job_id)
    assert record is not None
    assert record.state is JobState.FAILED
    assert record.reason.startswith("process lost: ")


def test_a_new_head_on_the_same_store_keeps_supervising(cluster: Cluster, tmp_path: Path) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.store.close()
    store = Store(tmp_path / "state.db")
    try:
        head = Head(store=store, executor=cluster.fake, data_dir=cluster.data_dir, clock=cluster.clock, base_env={})
        cluster.fake.finish(job_id, 0)
        cluster.clock.t = T0 + 1
        head.tick()
        record = store.get_job(job_id)
        assert record is not None
        assert record.state is JobState.SUCCEEDED
        assert record.attempt == 1  # adopted via its recorded handle, never relaunched
        assert list(cluster.fake.processes) == [(job_id, 1)]
    finally:
        store.close()
        cluster.store = Store(tmp_path / "state.db")  # so the fixture's teardown has a store to close


# ---- service checks ----------------------------------------------------------------------------


def test_service_rejects_unknown_gpu_type(cluster: Cluster) -> None:
    with pytest.raises(Rejected) as e:
        cluster.service.submit(spec(gpu_type="B200"))
    assert e.value.field == "gpu_type"
    assert "B200" in e.value.message and "H100" in e.value.message
    assert cluster.store.list_jobs() == []


def test_service_rejects_more_gpus_than_the_cluster_can_ever_host(cluster: Cluster) -> None:
    cluster.store.put_node(node("n2").gpus(4, "H100").build(), virtual=True, now=T0)
    with pytest.raises(Rejected) as e:
        cluster.service.submit(spec(gpus=13))
    assert e.value.field == "gpus"
    assert "can never host" in e.value.message
    assert "H100: 8 per node, 12 in all" in e.value.message
    with pytest.raises(Rejected, match="can never host"):
        cluster.service.submit(spec(gpus=16, nodes=2))  # 8 per node, but only n1 has 8
    assert cluster.store.list_jobs() == []
    # Multi-node jobs exist now: 9 GPUs span n1 and n2 (it used to be refused as > the largest node).
    assert cluster.service.submit(spec(gpus=9)).state is JobState.QUEUED
    assert cluster.service.submit(spec(gpus=8, nodes=2)).state is JobState.QUEUED
    assert cluster.service.submit(spec(gpus=12)).state is JobState.QUEUED


def test_service_counts_one_gpu_model_per_node(cluster: Cluster) -> None:
    cluster.store.put_node(node("mixed").gpus(4, "A100").gpus(6, "L4").build(), virtual=True, now=T0)
    with pytest.raises(Rejected) as e:
        cluster.service.submit(spec(gpus=5, gpu_type="A100"))
    assert e.value.field == "gpus"
    assert "can never host" in e.value.message and "A100: 4 per node, 4 in all" in e.value.message
    with pytest.raises(Rejected):
        cluster.service.submit(spec(gpus=9))  # 10 GPUs on "mixed", but never 9 of one model
    assert cluster.service.submit(spec(gpus=6, gpu_type="L4")).state is JobState.QUEUED


def test_cancel_of_a_finished_job_is_a_conflict(cluster: Cluster) -> None:
    job_id = cluster.submit()
    cluster.tick_at(T0)
    cluster.fake.finish(job_id, 0)
    cluster.tick_at(T0 + 1)
    with pytest.raises(Conflict, match="already ended"):
        cluster.service.cancel(job_id)
    assert cluster.state(job_id) is JobState.SUCCEEDED


def test_unknown_job_id_is_not_found(cluster: Cluster) -> None:
    with pytest.raises(NotFound):
        cluster.service.job(999)
    with pytest.raises(NotFound):
        cluster.service.cancel(999)
    with pytest.raises(NotFound):
        cluster.service.log_path(999, None)


def test_log_path_per_attempt(cluster: Cluster) -> None:
    job_id = cluster.submit()
    path, _ = cluster.service.log_path(job_id, None)
    assert path is None  # not started yet
    cluster.tick_at(T0)
    path, record = cluster.service.log_path(job_id, None)
    assert path == cluster.data_dir.log(job_id, 1)
    assert record.attempt == 1
    with pytest.raises(NotFound):
        cluster.service.log_path(job_id, 2)


# ---- history -----------------------------------------------------------------------------------


def test_events_record_every_transition_in_order(cluster: Cluster) -> None:
    ok = cluster.submit()
    cancelled = cluster.submit()
    cluster.tick_at(T0 + 1)
    cluster.clock.t = T0 + 2
    cluster.service.cancel(cancelled)
    cluster.fake.exit_on_signal[SIGTERM] = 128 + SIGTERM
    cluster.tick_at(T0 + 3)  # SIGTERM: the process exits; the next tick sees it
    cluster.fake.finish(ok, 0)
    cluster.tick_at(T0 + 4)

    assert [(e.at, e.state, e.reason) for e in cluster.store.events(ok)] == [
        (T0, JobState.QUEUED, "submitted"),
        (T0 + 1, JobState.RUNNING, "started on n1 GPUs 0"),
        (T0 + 4, JobState.SUCCEEDED, "exit code 0"),
    ]
    assert [(e.at, e.state, e.reason) for e in cluster.store.events(cancelled)] == [
        (T0, JobState.QUEUED, "submitted"),
        (T0 + 1, JobState.RUNNING, "started on n1 GPUs 1"),
        (T0 + 4, JobState.CANCELLED, "cancelled by user (killed by SIGTERM)"),
    ]
    wire = cluster.service.job(cancelled)
    assert [(e.at, e.state, e.reason) for e in wire.events] == [
        (e.at, e.state, e.reason) for e in cluster.store.events(cancelled)
    ]


def test_state_changes_match_events_across_a_busy_run(cluster: Cluster) -> None:
    """Many jobs through every ending: each job's events end in its final state, in time order."""
    ids = [cluster.submit(gpus=1 + i % 3, time_limit=50 if i % 4 == 0 else None) for i in range(12)]
    cluster.fake.exit_on_signal[SIGKILL] = 128 + SIGKILL
    t = T0
    for step in range(40):
        t += 7
        running = cluster.fake.running()
        if running and step % 3 == 0:
            cluster.fake.finish(running[0], step % 2)
        if running and step % 5 == 1:
            cluster.service.cancel(running[-1])
        cluster.tick_at(t)
    for job_id in ids:
        events = cluster.store.events(job_id)
        record = cluster.store.get_job(job_id)
        assert record is not None
        assert events[0].state is JobState.QUEUED
        assert events[-1].state is record.state
        assert events[-1].reason == record.reason
        assert [e.at for e in events] == sorted(e.at for e in events)
        assert all(e.state is not JobState.QUEUED for e in events[1:]) or record.attempt > 1
        assert record.state.terminal, f"job {job_id} still {record.state} after the run"
    # Every job ended, so no process may be left running.
    assert not any(isinstance(p.status, Running) for p in cluster.fake.processes.values())
