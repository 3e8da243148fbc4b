"""The services' operations, for the API: create, read, update, delete; and the parts' lifetimes.

Thin over the store and the reconciler: the API checks who may do what, this module does it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from pydantic import ValidationError

from gpucluster.head.service import ClusterService, Conflict, NotFound, Rejected
from gpucluster.services.reconciler import Reconciler
from gpucluster.services.runtime import Access, Runtimes
from gpucluster.services.spec import ServiceOut, ServiceSpec, ServiceUpdate, ServiceUsage
from gpucluster.store.services import ServiceExists, ServiceRecord, ServiceStore

log = logging.getLogger("gpucluster.services")


class ServiceManager:
    def __init__(self, cluster: ClusterService, clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.clock = clock
        self.store = ServiceStore(cluster.store)
        self.runtimes = Runtimes()
        self.reconciler = Reconciler(cluster, self.runtimes, clock)

    def start(self) -> None:
        """One pass before the head takes requests (a restarted head knows its services' ready
        replicas from its first request on), then the reconciler's thread."""
        try:
            self.reconciler.tick()
        except Exception:  # the thread retries; the head starts regardless
            log.exception("services: first reconcile pass failed")
        self.reconciler.start()

    def stop(self) -> None:
        self.reconciler.stop()

    def create(self, spec: ServiceSpec, owner: str | None) -> ServiceOut:
        try:
            record = self.store.create(spec, owner, self.clock())
        except ServiceExists as e:
            raise Conflict(str(e)) from None
        # Known to the gateway at once: a request right after the create is held, not a 404.
        self.runtimes.set_service(spec.name, Access(spec.team, spec.public), [])
        self.reconciler.wake.set()
        return self.describe(record)

    def record(self, name: str) -> ServiceRecord:
        record = self.store.get(name)
        if record is None:
            raise NotFound(f"no service named {name!r}")
        return record

    def describe(self, record: ServiceRecord, usage: dict[str, ServiceUsage] | None = None) -> ServiceOut:
        """`usage`: every service's, when describing several (one query for all of them)."""
        if usage is None:
            usage = self.store.usage(record.name)
        return ServiceOut(
            name=record.name,
            team=record.team,
            owner=record.owner,
            state=record.state,
            reason=record.reason,
            revision=record.revision,
            created_at=record.created_at,
            spec=record.spec,
            desired_replicas=self.reconciler.desired(record.name),
            replicas=self.reconciler.describe(record),
            stats=self.runtimes.stats(record.name),
            usage=usage.get(record.name, ServiceUsage()),
            url_path=f"/serve/{record.name}/",
        )

    def list(self) -> list[ServiceRecord]:
        return self.store.all()

    def update(self, name: str, change: ServiceUpdate) -> ServiceOut:
        """A new command or image is a new revision (replicas replaced one by one); replica
        bounds and `public` apply at once."""
        record = self.record(name)
        if record.state != "running":
            raise Conflict(f"service {name} is {record.state} ({record.reason}); delete it and create it again")
        fields = change.model_dump(exclude_unset=True)
        try:
            spec = ServiceSpec.model_validate({**record.spec.model_dump(), **fields})
        except ValidationError as e:
            first = e.errors()[0]
            raise Rejected(".".join(str(p) for p in first["loc"]) or "update", first["msg"]) from None
        rolls = any(k in fields for k in ("command", "image", "env"))
        self.store.set_spec(name, spec, new_revision=rolls)
        self.reconciler.wake.set()
        return self.describe(self.record(name))

    def delete(self, name: str) -> ServiceOut:
        """Stop every replica and forget the service. Marked `deleting` first (durable), so a head
        that dies midway finishes it at its next start; the name is free once every replica ended."""
        record = self.record(name)
        out = self.describe(record)
        self.store.set_state(name, "deleting", "deleted by its owner")
        self.runtimes.drop_service(name)
        for r in self.store.replicas(name):
            if r.job_id is not None:
                with contextlib.suppress(Conflict, NotFound):  # ended already
                    self.cluster.cancel(r.job_id)
        self.reconciler.wake.set()  # drops the rows once the jobs have ended
        out.state = "deleting"
        return out


def start_services(cluster: ClusterService) -> ServiceManager:
    """The head's services: the reconciler's thread started, the /metrics collector registered."""
    from gpucluster.services.metrics import ServiceCollector

    manager = ServiceManager(cluster)
    cluster.private_collectors.append(ServiceCollector(manager))
    manager.start()
    return manager
