"""Services in the store: one `services` row per service, one `service_replicas` row per replica.

Why a module of its own: only the services' reconciler (services/reconciler.py) and the service
API write here; the job rows of replicas stay the jobs table's. A replica row is written before
its job is submitted, so a head that dies between the two finds the job by its name next time.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select, update

from gpucluster.errors import GpuclusterError
from gpucluster.services.spec import ServiceSpec, ServiceUsage
from gpucluster.store import schema
from gpucluster.store.store import Store


class ServiceExists(ValueError, GpuclusterError):
    pass


class ServiceGone(LookupError, GpuclusterError):
    """The service was deleted or failed meanwhile: no replica is added for it."""


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    team: str
    owner: str | None
    spec: ServiceSpec
    state: str  # running, failed, deleting
    reason: str
    revision: int
    created_at: float
    ready_once: bool


@dataclass(frozen=True)
class ReplicaRecord:
    id: int
    service: str
    job_id: int | None
    port: int
    revision: int
    draining_since: float | None


class ServiceStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, spec: ServiceSpec, owner: str | None, now: float) -> ServiceRecord:
        t = schema.services
        with self.store._write() as c:
            if c.execute(select(t.c.name).where(t.c.name == spec.name)).first() is not None:
                raise ServiceExists(
                    f"a service named {spec.name!r} exists (or is being deleted); delete it first or pick another name"
                )
            c.execute(
                insert(t).values(
                    name=spec.name,
                    team=spec.team,
                    owner=owner,
                    spec=spec.model_dump_json(exclude_none=True),
                    state="running",
                    reason="",
                    revision=1,
                    created_at=now,
                    ready_once=False,
                )
            )
        return ServiceRecord(spec.name, spec.team, owner, spec, "running", "", 1, now, False)

    def get(self, name: str) -> ServiceRecord | None:
        t = schema.services
        with self.store._read() as c:
            row = c.execute(select(t).where(t.c.name == name)).first()
        return _service(row) if row is not None else None

    def all(self) -> list[ServiceRecord]:
        t = schema.services
        with self.store._read() as c:
            rows = c.execute(select(t).order_by(t.c.created_at)).all()
        return [_service(r) for r in rows]

    def set_spec(self, name: str, spec: ServiceSpec, new_revision: bool) -> None:
        t = schema.services
        values: dict[str, object] = {"spec": spec.model_dump_json(exclude_none=True)}
        if new_revision:
            values["revision"] = t.c.revision + 1
        with self.store._write() as c:
            c.execute(update(t).where(t.c.name == name).values(**values))

    def set_state(self, name: str, state: str, reason: str) -> None:
        t = schema.services
        with self.store._write() as c:
            c.execute(update(t).where(t.c.name == name).values(state=state, reason=reason))

    def mark_ready_once(self, name: str) -> None:
        t = schema.services
        with self.store._write() as c:
            c.execute(update(t).where(t.c.name == name).values(ready_once=True))

    def delete(self, name: str) -> list[ReplicaRecord]:
        """Remove the service and its replica rows; returns the replicas, whose jobs the caller stops."""
        r, t, sj = schema.service_replicas, schema.services, schema.service_jobs
        with self.store._write() as c:
            rows = c.execute(select(r).where(r.c.service == name)).all()
            c.execute(delete(r).where(r.c.service == name))
            c.execute(delete(sj).where(sj.c.service == name))
            c.execute(delete(t).where(t.c.name == name))
        return [_replica(x) for x in rows]

    def replicas(self, name: str | None = None) -> list[ReplicaRecord]:
        r = schema.service_replicas
        q = select(r).order_by(r.c.id)
        if name is not None:
            q = q.where(r.c.service == name)
        with self.store._read() as c:
            rows = c.execute(q).all()
        return [_replica(x) for x in rows]

    def add_replica(self, service: str, port: int, revision: int) -> ReplicaRecord:
        r, t = schema.service_replicas, schema.services
        with self.store._write() as c:
            # Checked in the same transaction: a service deleted mid-pass gets no orphan replica.
            if c.execute(select(t.c.name).where(t.c.name == service, t.c.state == "running")).first() is None:
                raise ServiceGone(service)
            rid = c.execute(insert(r).values(service=service, port=port, revision=revision)).inserted_primary_key
        assert rid is not None
        return ReplicaRecord(int(rid[0]), service, None, port, revision, None)

    def set_replica_job(self, replica_id: int, job_id: int) -> None:
        """Link the replica to its job, and the job to its service for good (`usage`)."""
        r, sj = schema.service_replicas, schema.service_jobs
        with self.store._write() as c:
            c.execute(update(r).where(r.c.id == replica_id).values(job_id=job_id))
            service = c.execute(select(r.c.service).where(r.c.id == replica_id)).scalar()
            known = select(sj.c.job_id).where(sj.c.service == service, sj.c.job_id == job_id)
            if service is not None and c.execute(known).first() is None:
                c.execute(insert(sj).values(service=service, job_id=job_id))

    def usage(self, name: str | None = None) -> dict[str, ServiceUsage]:
        """Each service's (or only `name`'s) GPU-hours, cost and energy so far: the sum over every
        job that was one of its replicas, as the accountant last saved them (`gpucluster usage`
        reads the same rows)."""
        sj, u = schema.service_jobs, schema.job_usage
        q = (
            select(sj.c.service, func.sum(u.c.gpu_seconds), func.sum(u.c.cost), func.sum(u.c.energy_j))
            .select_from(sj.join(u, u.c.job_id == sj.c.job_id))
            .group_by(sj.c.service)
        )
        if name is not None:
            q = q.where(sj.c.service == name)
        with self.store._read() as c:
            rows = c.execute(q).all()
        return {
            name: ServiceUsage(gpu_hours=(gs or 0.0) / 3600, cost=cost or 0.0, energy_kwh=(joules or 0.0) / 3.6e6)
            for name, gs, cost, joules in rows
        }

    def set_draining(self, replica_id: int, since: float) -> None:
        r = schema.service_replicas
        with self.store._write() as c:
            c.execute(update(r).where(r.c.id == replica_id).values(draining_since=since))

    def remove_replica(self, replica_id: int) -> None:
        r = schema.service_replicas
        with self.store._write() as c:
            c.execute(delete(r).where(r.c.id == replica_id))


def _service(row: object) -> ServiceRecord:
    m = row._mapping  # type: ignore[attr-defined]
    return ServiceRecord(
        name=m["name"],
        team=m["team"],
        owner=m["owner"],
        spec=ServiceSpec.model_validate_json(m["spec"]),
        state=m["state"],
        reason=m["reason"] or "",
        revision=int(m["revision"]),
        created_at=float(m["created_at"]),
        ready_once=bool(m["ready_once"]),
    )


def _replica(row: object) -> ReplicaRecord:
    m = row._mapping  # type: ignore[attr-defined]
    return ReplicaRecord(
        id=int(m["id"]),
        service=m["service"],
        job_id=m["job_id"],
        port=int(m["port"]),
        revision=int(m["revision"]),
        draining_since=m["draining_since"],
    )
