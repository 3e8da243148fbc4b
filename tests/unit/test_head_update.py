"""`gpucluster update` in the head: the store's one-transaction change (SQLite and PostgreSQL),
the scheduler planning on the new request, and the race with a start (head/service.py, loop.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.auth.identity import Denied, Identity
from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation
from gpucluster.head.service import Conflict, Rejected
from gpucluster.models import JobUpdate

from .builders import spec
from .headkit import T0, Cluster, make_cluster

STORE_BACKENDS = ("sqlite", "postgresql")
ALICE = Identity("alice", teams={"default": "member"})
ADMIN = Identity("root", cluster_admin=True)


@pytest.fixture
def cluster(tmp_path: Path, store_target: Path | str) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, gpus=8, store_target=store_target)
    yield c
    c.close()


def update(c: Cluster, job_id: int, who: Identity = ALICE, index: int | None = None, **fields: object) -> list[str]:
    return c.service.update(job_id, JobUpdate.model_validate(fields), who, index)[1]


def gpus_of(c: Cluster, job_id: int) -> int:
    allocation = c.record(job_id).allocation
    assert allocation is not None
    return allocation.gpu_count


def test_the_next_cycle_plans_on_the_new_request(cluster: Cluster) -> None:
    job = cluster.submit(gpus=1, begin=T0 + 3600)
    cluster.tick_at(T0 + 1)
    assert cluster.state(job) is JobState.QUEUED  # its begin time is an hour away
    said = update(cluster, job, gpus=4, begin=None, time_limit="30m")
    assert said[:2] == ["time limit none -> 30m", "gpus 1 -> 4"]
    assert said[2].startswith("begin ") and said[2].endswith(" -> none")
    (request,) = cluster.store.queued_requests()
    assert (request.gpus, request.time_limit_s, request.not_before, request.begin) == (4, 1800.0, None, None)
    cluster.tick_at(T0 + 2)
    assert cluster.state(job) is JobState.RUNNING and gpus_of(cluster, job) == 4
    events = [e.reason for e in cluster.store.events(job)]
    assert events[1].startswith("time limit none -> 30m, gpus 1 -> 4, begin ") and events[1].endswith(" by alice")


def test_an_update_after_the_snapshot_drops_the_planned_start(cluster: Cluster) -> None:
    """The cycle planned 1 GPU; the job was changed to 6 before its start: it must not start on
    the 1-GPU plan (nor launch 6 processes on 1 GPU); the next cycle starts it on 6."""
    job = cluster.submit(gpus=1)
    started = cluster.head.queue.started

    def update_then_start(job_id: int, allocation: Allocation, now: float):  # type: ignore[no-untyped-def]
        update(cluster, job_id, gpus=6)  # commits between the plan and its start
        return started(job_id, allocation, now)

    cluster.head.queue.started = update_then_start  # type: ignore[method-assign]
    cluster.tick_at(T0 + 1)
    cluster.head.queue.started = started  # type: ignore[method-assign]
    assert cluster.state(job) is JobState.QUEUED and cluster.fake.processes == {}
    cluster.tick_at(T0 + 2)
    assert cluster.state(job) is JobState.RUNNING and gpus_of(cluster, job) == 6
    assert cluster.proc(job).spec.env["CUDA_VISIBLE_DEVICES"].count(",") == 5  # launched on 6 GPUs


def test_a_job_that_started_meanwhile_is_not_changed(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    job = cluster.submit(gpus=1)
    check = cluster.service._check_fits

    def start_first(s: object) -> None:  # the loop starts the job after the update read it queued
        cluster.tick_at(T0 + 1)
        check(s)  # type: ignore[arg-type]

    monkeypatch.setattr(cluster.service, "_check_fits", start_first)
    with pytest.raises(Conflict, match=f"job {job} is no longer queued; nothing was changed"):
        update(cluster, job, gpus=2)
    assert cluster.state(job) is JobState.RUNNING and cluster.record(job).spec.gpus == 1


def test_of_two_updates_at_once_the_second_is_refused_not_silently_undoing_the_first(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each update merges its fields into the spec it read; committed blindly, the later one
    would put back what the earlier one changed (here: the time limit). It is refused instead."""
    job = cluster.submit(gpus=1, begin=T0 + 3600)
    check = cluster.service._check_fits
    other: list[list[str]] = []
    once = [True]

    def another_update_first(s: object) -> None:  # a second caller's update lands after ours read the job
        if once.pop() if once else False:
            other.append(update(cluster, job, who=ADMIN, time_limit="30m"))
        check(s)  # type: ignore[arg-type]

    monkeypatch.setattr(cluster.service, "_check_fits", another_update_first)
    with pytest.raises(Conflict, match=f"job {job} was changed by someone else meanwhile; nothing was changed"):
        update(cluster, job, gpus=2)
    assert other == [["time limit none -> 30m"]]
    record = cluster.record(job)
    assert (record.spec.gpus, record.spec.time_limit) == (1, 1800)
    assert update(cluster, job, gpus=2) == ["gpus 1 -> 2"]  # asked again, on the job as it is now


def test_a_running_jobs_limit_only_shrinks_unless_a_cluster_admin_and_is_enforced(cluster: Cluster) -> None:
    job = cluster.submit(time_limit="1h")
    cluster.tick_at(T0 + 1)
    with pytest.raises(Denied, match="may only be shortened"):
        update(cluster, job, time_limit="2h")
    with pytest.raises(Conflict, match="only its time limit can change"):
        update(cluster, job, priority="low")
    assert update(cluster, job, ADMIN, time_limit="3h") == ["time limit 1h -> 3h"]
    assert update(cluster, job, time_limit="10s") == ["time limit 3h -> 10s"]
    (running,) = cluster.store.running_jobs()
    assert running.time_limit_s == 10.0  # the scheduler's view (estimates, backfill) too
    cluster.tick_at(T0 + 12)
    assert cluster.record(job).stop_reason == "time_limit"


def test_an_array_elements_change_leaves_its_siblings_spec_alone(cluster: Cluster) -> None:
    """Elements share the first element's stored spec: changing the first alone must not change
    the others (they get their own copy of the old one first)."""
    first = cluster.service.submit(spec(array="0-2", hold=True, name="sweep")).id
    assert update(cluster, first, index=0, name="zero") == ["name sweep -> zero"]
    assert [cluster.record(first + i).name for i in range(3)] == ["zero", "sweep", "sweep"]
    update(cluster, first, priority="low")  # the whole array: each queued element
    assert [cluster.record(first + i).spec.priority for i in range(3)] == ["low"] * 3
    assert [cluster.record(first + i).name for i in range(3)] == ["zero", "sweep", "sweep"]


def test_dependencies_resolved_at_submit_are_kept(cluster: Cluster) -> None:
    before = cluster.submit(hold=True)
    job = cluster.submit(afterok=[before])
    update(cluster, job, time_limit="1h")
    request = next(r for r in cluster.store.queued_requests() if r.job_id == job)
    assert [(d.kind.value, d.job_id) for d in request.after] == [("afterok", before)]


def test_refused_like_a_submit(cluster: Cluster) -> None:
    job = cluster.submit(hold=True)
    with pytest.raises(Rejected, match="gpus: gpus above 1 must be a whole number"):
        update(cluster, job, gpus=2.5)
    with pytest.raises(Rejected, match="can never host that"):
        update(cluster, job, gpus=64)
    with pytest.raises(Denied, match="may not submit high jobs"):
        update(cluster, job, priority="high")
    with pytest.raises(Rejected, match="nothing to change"):
        update(cluster, job)
    assert cluster.record(job).spec == spec(hold=True)


def test_an_array_with_no_queued_element_is_refused(cluster: Cluster) -> None:
    first = cluster.service.submit(spec(array="0-1")).id
    cluster.tick_at(T0 + 1)  # 8 GPUs: both elements start
    with pytest.raises(Conflict, match=f"array {first} has no queued element; only queued elements can change"):
        update(cluster, first, priority="low")


def test_a_what_if_is_checked_as_the_update_it_imagines(cluster: Cluster) -> None:
    """`why --what-if priority=...` refuses what `update --priority` would: the serving class
    (service replicas only) and a class above normal without its grant."""
    job = cluster.submit(gpus=1, begin=T0 + 3600)
    with pytest.raises(Rejected, match="serving is the class of service replicas"):
        cluster.service.what_if(job, JobUpdate.model_validate({"priority": "serving"}), ALICE)
    with pytest.raises(Denied, match="may not submit high jobs"):
        cluster.service.what_if(job, JobUpdate.model_validate({"priority": "high"}), ALICE)
    assert cluster.record(job).spec.priority == "normal"
