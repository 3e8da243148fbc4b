"""Routes of services (issue 23): create, list, show, update, delete (the gateway, `/serve/NAME/...`,
is in front of the API: services/gateway.py).

Who may do what: any member creates a service in one of their teams (a class above normal needs
a grant, as a job); its team's members see it; its owner, its team's admins and cluster admins
change or delete it. The gateway checks its own callers (services/gateway.py): the service's team,
or anyone when the owner made it public.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Path

from gpucluster.auth import grants
from gpucluster.auth.control import AccessControl
from gpucluster.auth.identity import Denied, Identity
from gpucluster.auth.rules import Caller, Rule, allow
from gpucluster.containers import check_mounts, outside_roots
from gpucluster.head.service import NotFound, Rejected
from gpucluster.services.manager import ServiceManager
from gpucluster.services.spec import ServiceList, ServiceOut, ServiceSpec, ServiceUpdate
from gpucluster.store.services import ServiceRecord

ServiceName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


def add_service_routes(app: FastAPI, services: ServiceManager, access: AccessControl) -> None:

    def visible(name: str, who: Identity) -> ServiceRecord:
        record = services.record(name)
        if not who.can_see(record.team):
            raise NotFound(f"no service named {name!r}")  # another team's: as if missing
        return record

    def operable(name: str, who: Identity) -> ServiceRecord:
        record = visible(name, who)
        if not who.can_operate(record.team, record.owner):
            raise Denied(
                f"service {name} was created by {record.owner or 'someone else'}; only they, an admin of its "
                "team, or a cluster admin may change it"
            )
        return record

    @app.post("/v1/services", status_code=201, openapi_extra=allow(Rule.SIGNED_IN))
    def create_service(spec: ServiceSpec, who: Caller) -> ServiceOut:
        """Create a service: `min_replicas` replicas of `command`, each a job told its port in $PORT,
        reached at `/serve/NAME/` once its `readiness` path answers (409 if the name is taken)."""
        team = who.submit_team(spec.team if "team" in spec.model_fields_set else None)
        grants.check_priority(who, team, spec.priority, services.cluster.head.policy, service=True)
        if spec.mounts and (why := outside_roots(check_mounts(spec.mounts), services.cluster.head.policy.mount_roots)):
            raise Rejected("mounts", why)
        access.check_can_run(who)
        spec = spec.model_copy(update={"team": team})
        services.cluster._check_fits(spec.replica_job(0, spec.port or 20000))  # one that can never run: 422 now
        return services.create(spec, who.user)

    @app.get("/v1/services", openapi_extra=allow(Rule.SIGNED_IN))
    def list_services(who: Caller) -> ServiceList:
        """Services of your teams (a cluster admin: all), oldest first."""
        usage = services.store.usage()
        return ServiceList(services=[services.describe(r, usage) for r in services.list() if who.can_see(r.team)])

    @app.get("/v1/services/{name}", openapi_extra=allow(Rule.SIGNED_IN))
    def get_service(name: ServiceName, who: Caller) -> ServiceOut:
        """One service: its replicas (job, port, phase, requests in flight) and numbers."""
        return services.describe(visible(name, who))

    @app.post("/v1/services/{name}/update", openapi_extra=allow(Rule.SIGNED_IN))
    def update_service(name: ServiceName, change: ServiceUpdate, who: Caller) -> ServiceOut:
        """A new command, image or env rolls the replicas one by one (a new one ready before an old
        one drains); replica bounds and `public` apply at once."""
        operable(name, who)
        return services.update(name, change)

    @app.delete("/v1/services/{name}", openapi_extra=allow(Rule.SIGNED_IN))
    def delete_service(name: ServiceName, who: Caller) -> ServiceOut:
        """Stop every replica and forget the service."""
        operable(name, who)
        return services.delete(name)
