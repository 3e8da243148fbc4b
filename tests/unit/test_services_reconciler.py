"""The services' reconciler on a head with the fake executor and a hand-moved clock: replicas are
jobs, replaced when they end, rolled one by one, scaled on load with draining, and found again
after a crash; on SQLite and PostgreSQL (the store's services tables)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.core.states import JobState
from gpucluster.core.types import Priority
from gpucluster.services.reconciler import Reconciler, ephemeral_ports
from gpucluster.services.runtime import Runtimes
from gpucluster.services.spec import ServiceSpec
from gpucluster.store.accounting import UsageStore
from gpucluster.store.services import ServiceStore

from .headkit import Cluster, make_cluster

STORE_BACKENDS = ("sqlite", "postgresql")


class Replicas:
    """The test's replicas: which URLs answer their probe (all, unless told otherwise)."""

    def __init__(self) -> None:
        self.down: set[str] = set()

    def probe(self, url: str) -> bool:
        return not any(url.startswith(d) for d in self.down)


@pytest.fixture
def cluster(tmp_path: Path, store_target: Path | str) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, store_target=store_target)
    c.fake.exit_on_signal[signal.SIGTERM] = 143
    try:
        yield c
    finally:
        c.close()


def step(c: Cluster, rec: Reconciler, dt: float = 0.5) -> None:
    """Time passes; the head starts and stops jobs; the reconciler makes one pass."""
    c.tick_at(c.clock.t + dt)
    rec.tick()
    c.tick_at(c.clock.t)


def ready(rec: Reconciler, services: ServiceStore, name: str) -> list[int]:
    return [r.id for r in services.replicas(name) if rec.phase(r.id) == "ready"]


def make(c: Cluster, replicas: Replicas, **spec: object) -> tuple[Reconciler, ServiceStore]:
    services = ServiceStore(c.store)
    fields: dict[str, object] = {"name": "clf", "command": ["serve"], "gpus": 0.5, **spec}
    services.create(ServiceSpec.model_validate(fields), "alice", c.clock.t)
    rec = Reconciler(c.service, Runtimes(clock=c.clock), clock=c.clock, port_free=lambda _: True, probe=replicas.probe)
    return rec, services


def test_replicas_are_named_jobs_with_their_own_ports_and_a_dead_one_is_replaced(cluster: Cluster) -> None:
    rec, services = make(cluster, Replicas(), min_replicas=2, max_replicas=2)
    for _ in range(3):
        step(cluster, rec)
    rows = services.replicas("clf")
    assert len(ready(rec, services, "clf")) == 2
    jobs = [cluster.record(r.job_id or 0) for r in rows]
    assert [j.name for j in jobs] == [f"clf.r{r.id}" for r in rows]
    assert sorted(j.spec.env["PORT"] for j in jobs) == ["20000", "20001"]
    assert all(j.owner == "alice" and j.gpus == 0.5 for j in jobs)

    cluster.fake.finish(rows[0].job_id or 0, exit_code=1)
    for _ in range(4):
        step(cluster, rec)
    now = services.replicas("clf")
    assert rows[0].id not in {r.id for r in now} and len(ready(rec, services, "clf")) == 2
    assert cluster.state(rows[0].job_id or 0) is JobState.FAILED


def test_a_rolling_update_never_has_fewer_ready_replicas_than_wanted(cluster: Cluster) -> None:
    rec, services = make(cluster, Replicas(), min_replicas=2, max_replicas=2)
    for _ in range(3):
        step(cluster, rec)
    old = {r.id for r in services.replicas("clf")}
    record = services.get("clf")
    assert record is not None
    services.set_spec("clf", record.spec.model_copy(update={"command": ["serve", "--v2"]}), new_revision=True)
    for _ in range(20):
        step(cluster, rec)
        assert len(ready(rec, services, "clf")) >= 2  # an old one leaves only once a new one is ready
    rows = services.replicas("clf")
    assert not old & {r.id for r in rows} and all(r.revision == 2 for r in rows) and len(rows) == 2
    assert all(cluster.record(r.job_id or 0).spec.command == ["serve", "--v2"] for r in rows)


def test_load_scales_up_and_a_scale_down_drains_before_it_stops(cluster: Cluster) -> None:
    rec, services = make(
        cluster, Replicas(), min_replicas=1, max_replicas=3, target_concurrency=2, scale_down_delay_s=5
    )
    runtimes = rec.runtimes
    for _ in range(3):
        step(cluster, rec)
    held = [runtimes.acquire("clf") for _ in range(6)]  # 6 requests in flight on the one replica
    for _ in range(8):
        step(cluster, rec)
    assert len(ready(rec, services, "clf")) == 3
    for e in held:
        runtimes.release("clf", e)  # type: ignore[arg-type]
    busy = [runtimes.acquire("clf") for _ in range(3)]  # one request on each replica: 2 wanted
    assert len({e.replica_id for e in busy if e is not None}) == 3
    for _ in range(14):  # 7 s: past the scale-down delay
        step(cluster, rec)
    rows = services.replicas("clf")
    draining = [r for r in rows if rec.phase(r.id) == "draining"]
    assert len(draining) == 1 and len(ready(rec, services, "clf")) == 2
    leaving = draining[0]
    assert cluster.state(leaving.job_id or 0) is JobState.RUNNING  # its request is still being answered
    extra = [runtimes.acquire("clf") for _ in range(10)]
    assert leaving.id not in {e.replica_id for e in extra if e is not None}  # it gets no new ones
    for e in extra:
        runtimes.release("clf", e)  # type: ignore[arg-type]
    runtimes.release("clf", next(e for e in busy if e is not None and e.replica_id == leaving.id))
    for _ in range(3):
        step(cluster, rec)
    assert cluster.state(leaving.job_id or 0) is JobState.CANCELLED
    assert leaving.id not in {r.id for r in services.replicas("clf")} and len(ready(rec, services, "clf")) == 2


def test_a_replica_row_without_its_job_id_finds_its_job_by_name(cluster: Cluster) -> None:
    rec, services = make(cluster, Replicas(), min_replicas=1, max_replicas=1)
    step(cluster, rec)
    (row,) = services.replicas("clf")
    # As if the head died between submitting the job and recording its id.
    from sqlalchemy import update

    from gpucluster.store import schema

    with cluster.store._write() as conn:
        conn.execute(update(schema.service_replicas).values(job_id=None))
    rec2 = Reconciler(cluster.service, Runtimes(clock=cluster.clock), clock=cluster.clock, port_free=lambda _: True,
                      probe=Replicas().probe)  # fmt: skip
    step(cluster, rec2)
    (again,) = services.replicas("clf")
    assert again.job_id == row.job_id  # the same job, not a second one
    assert len([j for j in cluster.store.list_jobs() if j.name.startswith("clf.")]) == 1


def test_a_never_ready_service_fails_and_its_replicas_are_stopped(cluster: Cluster) -> None:
    replicas = Replicas()
    replicas.down.add("http://")
    rec, services = make(cluster, replicas, startup_timeout_s=3)
    for _ in range(10):
        step(cluster, rec)
    record = services.get("clf")
    assert record is not None and record.state == "failed"
    assert "within its startup timeout (3 s)" in record.reason
    assert all(j.state.terminal for j in cluster.store.list_jobs() if j.name.startswith("clf."))
    assert services.replicas("clf") == []


def test_replicas_run_in_the_serving_class_and_preempt_checkpointed_training(cluster: Cluster) -> None:
    """Issue 23: a scale-up goes through the scheduler as serving work, above batch jobs; it takes
    the GPUs of training that has checkpointed (the default `serving_victims`), never of
    training that has not."""
    fresh = cluster.submit(gpus=4, priority="high", name="no-checkpoint-yet")
    saved = cluster.submit(gpus=4, priority="normal", name="checkpointed")
    cluster.tick_at(cluster.clock.t)
    assert cluster.store.get_job(saved).state is JobState.RUNNING  # type: ignore[union-attr]
    assert cluster.store.record_progress(saved, cluster.clock.t, None, cluster.clock.t, 1)
    rec, services = make(cluster, Replicas(), gpus=1)
    step(cluster, rec)
    step(cluster, rec, dt=60)
    replica = services.replicas("clf")[0]
    job = cluster.store.get_job(replica.job_id)  # type: ignore[arg-type]
    assert job is not None and job.priority is Priority.SERVING
    assert cluster.store.get_job(fresh).state is JobState.RUNNING  # type: ignore[union-attr]
    assert cluster.store.get_job(saved).state in (JobState.QUEUED, JobState.RUNNING)  # type: ignore[union-attr]
    assert any("preempted" in (e.reason or "") for e in cluster.store.events(saved))


def test_a_services_gpu_hours_and_cost_count_every_replica_it_ever_had(cluster: Cluster) -> None:
    """Issue 23: a service's usage is its replica jobs' (the accountant's rows), replaced replicas
    included, and a service made again under the same name starts from nothing."""
    rec, services = make(cluster, Replicas())
    for _ in range(3):
        step(cluster, rec)
    first = services.replicas("clf")[0].job_id or 0
    step(cluster, rec, dt=1800)  # half an hour on half a GPU
    cluster.fake.finish(first, exit_code=1)
    for _ in range(4):
        step(cluster, rec)
    second = services.replicas("clf")[0].job_id or 0
    assert second != first
    step(cluster, rec, dt=3600)
    used = services.usage()["clf"]
    rows = UsageStore(cluster.store).rows_of_jobs([first, second])
    assert {r.job_id for r in rows} == {first, second}
    assert used.gpu_hours == pytest.approx(sum(r.gpu_seconds for r in rows) / 3600)
    assert used.gpu_hours == pytest.approx(0.5 * (1800 + 3600) / 3600, rel=0.01)
    assert used.cost == pytest.approx(sum(r.cost for r in rows))
    services.delete("clf")
    assert "clf" not in services.usage()


def test_replica_ports_skip_the_kernels_ephemeral_range_unless_the_spec_names_one_in_it(cluster: Cluster) -> None:
    # Any outgoing connection on the node may be handed an ephemeral port between the probe and
    # the replica's bind; below the range the next port up is taken, past it the range is jumped.
    rec, _ = make(cluster, Replicas())
    rec.ephemeral = (20002, 29999)
    spec = ServiceSpec.model_validate({"name": "clf", "command": ["serve"], "gpus": 0.5})
    assert rec._free_port(spec, {20000}) == 20001
    assert rec._free_port(spec, {20000, 20001}) == 30000
    named = ServiceSpec.model_validate({"name": "clf", "command": ["serve"], "gpus": 0.5, "port": 25000})
    assert rec._free_port(named, set()) == 25000  # the owner chose it: kept


def test_ephemeral_ports_are_the_kernels_range_or_linuxs_default(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_ports(str(f)) == (40000, 50000)
    assert ephemeral_ports(str(tmp_path / "absent")) == (32768, 60999)
