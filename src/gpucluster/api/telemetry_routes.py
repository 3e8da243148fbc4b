"""Routes of telemetry and health: drain / undrain a node, read GPU samples, Prometheus /metrics.

Their own module so the rest of the API stays as it was; `create_app` adds them with one call.
Who may call what is declared per route (gpucluster.auth.rules): draining is a cluster admin's
act; /metrics is public like /v1/health (a Prometheus scrape needs no token; it tells GPU
readings, counts per team and state, never a job's name or command). What a team used and spent
(GPU-hours, cost, energy, fair-share usage) is in it only for a cluster admin's token, or for
anyone when the head runs with `--public-team-usage` (a scraper on a trusted network).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Path, Query
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials

from gpucluster.api.errors import JOB_QUERY_KEY, MAX_ID
from gpucluster.auth.identity import Identity
from gpucluster.auth.rules import Caller, Rule, allow, bearer
from gpucluster.head.service import ClusterService, Conflict, NotFound, Rejected
from gpucluster.models import DrainIn, ErrorBody, GpuSampleList, GpuSampleOut, NodeOut
from gpucluster.telemetry.metrics import CONTENT_TYPE, metrics_registry, render_metrics

MAX_SAMPLES = 100_000
NodeName = Annotated[str, Path(min_length=1, max_length=255)]


def add_telemetry_routes(app: FastAPI, service: ClusterService, *, public_team_usage: bool = False) -> None:
    router = APIRouter()
    full = metrics_registry(service, team_usage=True)
    public = full if public_team_usage else metrics_registry(service, team_usage=False)

    def node_out(name: str) -> NodeOut:
        for n in service.nodes():
            if n.name == name:
                return n
        known = ", ".join(r.node.name for r in service.store.nodes()) or "none"
        raise NotFound(f"no node named {name!r}; nodes: {known}")

    @router.post("/v1/nodes/{name}/drain", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def drain(name: NodeName, body: DrainIn | None = None) -> NodeOut:
        """Take a node out of scheduling: no new jobs go there; its running jobs go on. With
        `until`, the drain ends by itself then, and waiting jobs' estimates count from it."""
        node_out(name)
        reason = (body.reason if body is not None else None) or "drained by user"
        until = body.until if body is not None else None
        now = service.head.clock()
        if until is not None and until <= now:
            raise Rejected("until", "is not in the future; give when the drain ends, e.g. --until 14:00 or now+2h")
        if service.head.telemetry.set_drained(name, True, reason, "user", now, until):
            service.head.nodes_changed()
        return node_out(name)

    @router.post("/v1/nodes/{name}/undrain", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def undrain(name: NodeName) -> NodeOut:
        """Return a drained node to scheduling, forgetting its health problems (an ECC error or a
        fatal XID stays until this); one still present drains it again at the next sample."""
        node = node_out(name)
        if not node.drained:
            raise Conflict(f"node {name} is not drained")
        now = service.head.clock()
        if service.telemetry is not None:
            service.telemetry.undrain(name, now)
        else:
            store = service.head.telemetry
            store.clear_problems([k for k in store.problems() if k[0] == name])
            store.set_drained(name, False, "undrained by user", "user", now)
        service.head.nodes_changed()
        return node_out(name)

    @router.get("/v1/telemetry/samples", openapi_extra={**allow(Rule.SIGNED_IN), JOB_QUERY_KEY: True})
    def samples(
        node: Annotated[str | None, Query(max_length=255)] = None,
        gpu: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
        job: Annotated[int | None, Query(ge=1, le=MAX_ID, description="only while this job held the GPU")] = None,
        since: Annotated[float | None, Query(ge=0, description="Unix time")] = None,
        until: Annotated[float | None, Query(ge=0, description="Unix time")] = None,
        level: Annotated[int | None, Query(ge=0, le=2, description="0 raw, 1 minute means, 2 hour means")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_SAMPLES, description="newest N")] = 10_000,
        *,
        who: Caller,
    ) -> GpuSampleList:
        """Stored GPU samples, oldest first: each covers [at, at + seconds), so energy in joules
        is the sum of power_w x seconds. Written in batches: the newest ~10 s may be missing.

        A GPU's readings are the node's, for every signed-in caller (as nvidia-smi would show
        them); which jobs held it is told only for jobs the caller's teams may see, and `job=`
        of another team's job answers as a missing one: what another team's job did is theirs."""
        if since is not None and until is not None and until < since:
            raise Rejected("until", "must not be before since")
        visible = _visible_jobs(who)
        if job is not None and not visible(job):
            raise NotFound(f"no job with id {job}")  # word for word what a missing job answers
        rows = service.head.telemetry.samples(node=node, gpu=gpu, since=since, until=until, job_id=job, level=level)
        return GpuSampleList(
            samples=[
                GpuSampleOut(
                    node=s.node,
                    gpu=s.gpu,
                    at=s.at,
                    seconds=s.seconds,
                    level=s.level,
                    jobs=[j for j in s.jobs if visible(j)],
                    utilization=s.utilization,
                    memory_used_mb=s.memory_used_mb,
                    temperature_c=s.temperature_c,
                    power_w=s.power_w,
                    sm_clock_mhz=s.sm_clock_mhz,
                    memory_clock_mhz=s.memory_clock_mhz,
                )
                for s in rows[-limit:]
            ]
        )

    def _visible_jobs(who: Identity) -> Callable[[int], bool]:
        """Whether the caller may see a job, one store read per distinct job id."""
        if who.visible_teams() is None:
            return lambda _job_id: True
        seen: dict[int, bool] = {}

        def visible(job_id: int) -> bool:
            if job_id not in seen:
                record = service.store.get_job(job_id)
                seen[job_id] = record is not None and who.can_see(record.team)
            return seen[job_id]

        return visible

    @router.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"},
            401: {"model": ErrorBody, "description": "a token was sent and it is not valid (none is needed)"},
        },
        openapi_extra=allow(Rule.PUBLIC),
    )
    def metrics(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Response:
        """GPU readings, queue length and waits per team and priority, cycle time, jobs by state.

        No token needed. Each team's GPU-hours, cost, energy and fair-share usage are added for a
        cluster admin's token (or for everyone under `gpucluster up --public-team-usage`); a token
        that is not valid is refused (401) rather than quietly served less."""
        registry = public
        if creds is not None:
            who = app.state.access.authenticate(creds.credentials)
            if who.cluster_admin:
                registry = full
        return Response(render_metrics(registry), media_type=CONTENT_TYPE)

    app.include_router(router)
