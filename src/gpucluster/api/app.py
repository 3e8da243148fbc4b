"""The FastAPI application. OpenAPI at /openapi.json, interactive docs at /docs.

Errors have one shape everywhere: {"error": "<field>: <what is wrong and what is allowed>",
"detail": [...]}, so the CLI can print the message as is.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpucluster import __version__
from gpucluster.api.accounting_routes import add_accounting_routes
from gpucluster.api.admin import add_admin_routes
from gpucluster.api.errors import MAX_ID, Id, document_errors
from gpucluster.api.follow import DEFAULT_PER_USER as DEFAULT_FOLLOWS_PER_USER
from gpucluster.api.follow import LogFollows
from gpucluster.api.service_routes import add_service_routes
from gpucluster.api.session_routes import add_session_routes
from gpucluster.api.submit_path import SubmitPath
from gpucluster.api.telemetry_routes import add_telemetry_routes
from gpucluster.auth import grants, rules
from gpucluster.auth.control import AccessControl
from gpucluster.auth.identity import Denied, Identity
from gpucluster.auth.rules import Caller, Rule, allow
from gpucluster.containers import check_mounts, outside_roots
from gpucluster.core.states import JobState
from gpucluster.dashboard import serve as dashboard_serve
from gpucluster.errors import GpuclusterError
from gpucluster.executors.logfile import read_log
from gpucluster.head import sessions
from gpucluster.head.service import ClusterService, Conflict, NotFound, Rejected
from gpucluster.models import (
    DEFAULT_QUEUE_PAGE,
    MAX_QUEUE_PAGE,
    ArrayUpdate,
    DryRunOut,
    HealthOut,
    HoldOut,
    Job,
    JobList,
    JobSpec,
    JobUpdate,
    NodeList,
    PipelineOut,
    PolicyOut,
    ProgressIn,
    QueueOut,
    unstorable,
)
from gpucluster.ranklogs import prefix_lines
from gpucluster.services.gateway import Gateway, GatewayRoutes
from gpucluster.services.manager import ServiceManager
from gpucluster.store import DatabaseUnavailable, DataDirUnwritable, LeaseLost

MAX_BODY_BYTES = 1024 * 1024
GATEWAY_MAX_BODY_BYTES = 64 * 1024 * 1024  # a request to a service (an image, a batch) may be larger
BODY_READ_TIMEOUT_S = 30.0


class BodyLimit:
    """Refuses request bodies over the limit with 413, whether or not Content-Length is sent, and
    bodies that stall (no byte for `read_timeout_s`) with 408: a client cannot hold a request
    open by sending its body slowly (the headers are bounded by api/connections.py)."""

    def __init__(self, app: ASGIApp, limit: int, read_timeout_s: float = BODY_READ_TIMEOUT_S) -> None:
        self.app = app
        self.limit = limit
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _too_large(self.limit)(scope, receive, send)
            return
        seen = 0
        body_done = False

        async def limited() -> Message:
            nonlocal seen, body_done
            if body_done:  # past the body: waiting for a disconnect (a stream's) is not bounded here
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.read_timeout_s)
            except TimeoutError:
                raise _BodyTimeout(self.read_timeout_s) from None
            seen += len(message.get("body", b""))
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            if seen > self.limit:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLarge:
            await _too_large(self.limit)(scope, receive, send)
        except _BodyTimeout as e:  # read outside a route
            body = {"error": e.detail, "detail": []}
            await JSONResponse(body, status_code=408, headers=e.headers)(scope, receive, send)


class _BodyTooLarge(GpuclusterError):
    pass


class _BodyTimeout(HTTPException, GpuclusterError):
    """An HTTPException, so that FastAPI, reading the body for a route, passes it on as it is
    (its own handler answers 408 in the usual error shape) rather than as a 400."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, f"the request body stalled for {timeout_s:g} s", {"Connection": "close"})


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse({"error": f"request body is larger than {limit} bytes", "detail": []}, status_code=413)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    """The field a user wrote, as they wrote it: `state`, not pydantic's `query.state.0` (a list
    item's position means nothing to someone who typed `--state nope`; `_message` names the value)."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path") and not isinstance(p, int)]
    return ".".join(parts) or "body"


ArrayIndex = Annotated[int | None, Query(ge=0, le=10_000_000, description="one element of the array (ID[7])")]
# core/arrays.py ELEMENT_STATES: queued (held or not), held, running, preempted
ElementState = Literal["queued", "held", "running", "preempted"]
StateFilter = Annotated[
    list[ElementState] | None,
    Query(
        max_length=4,
        description="only the jobs (an array's elements) in these states: queued (held or not), held, running, "
        "preempted; repeatable",
    ),
]


def _message(msg: str, error: dict[str, Any] | None = None) -> str:
    """pydantic's sentence, naming the offending value when it was one item of a list."""
    text = msg.removeprefix("Value error, ")
    if error is not None and any(isinstance(p, int) for p in error.get("loc", ())):
        value = error.get("input")
        if isinstance(value, str | int | float):
            return f"{value!r}: {text}"
    return text


def create_app(
    service: ClusterService,
    access: AccessControl | None = None,
    *,
    follow_limit: int = DEFAULT_FOLLOWS_PER_USER,
    public_team_usage: bool = False,
    services: ServiceManager | None = None,
    gateway_port: int | None = None,
) -> FastAPI:
    """The API; every route needs a token unless its rule says otherwise (see auth/rules.py).

    `follow_limit`: log follows one user may hold open at once (api/follow.py).
    `public_team_usage`: /metrics shows each team's usage and spend without a token (a cluster
    admin's token is needed otherwise; api/telemetry_routes.py).
    `services`: the services' routes and gateway (api/service_routes.py), when the head runs them.
    `gateway_port`: connections to this port reach the gateway alone, at /NAME/... (up --gateway-port)."""
    app = FastAPI(
        title="gpucluster",
        version=__version__,
        # /docs is served from the head's own copy of Swagger UI (dashboard/serve.py); ReDoc would
        # load from a CDN, blank on a cluster without internet access, so there is none.
        docs_url=None,
        redoc_url=None,
        description="Submit, watch and cancel GPU jobs; see nodes and GPUs. Every call needs "
        "`Authorization: Bearer <token>`; each operation's `x-access` says who may make it.",
    )
    access = access or AccessControl(service.store, service.head.clock)
    app.state.service = service
    follows = LogFollows(service, access, per_user=follow_limit)
    app.state.follows = follows
    rules.install(app, access)  # before any route: the guard covers every route added after

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        text = "; ".join(f"{_field(e['loc'])}: {_message(str(e['msg']), dict(e))}" for e in errors)
        detail = [{"field": _field(e["loc"]), "message": _message(str(e["msg"]), dict(e))} for e in errors]
        return JSONResponse({"error": text, "detail": detail}, status_code=422)

    @app.exception_handler(Rejected)
    async def _rejected(_: Request, exc: Rejected) -> JSONResponse:
        return JSONResponse(
            {"error": str(exc), "detail": [{"field": exc.field, "message": exc.message}]}, status_code=422
        )

    @app.exception_handler(DataDirUnwritable)
    async def _unwritable(_: Request, exc: DataDirUnwritable) -> JSONResponse:
        # 507 Insufficient Storage when full, 503 when read-only: nothing was changed, retry later.
        return JSONResponse({"error": str(exc), "detail": []}, status_code=507 if exc.full else 503)

    @app.exception_handler(DatabaseUnavailable)
    async def _database_down(_: Request, exc: DatabaseUnavailable) -> JSONResponse:
        # Nothing was changed; the same call succeeds once the database is back. The store logs
        # the outage once, not a stack trace per call.
        return JSONResponse({"error": str(exc), "detail": []}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(LeaseLost)
    async def _lease_lost(_: Request, exc: LeaseLost) -> JSONResponse:
        # Another head holds the database now: this one changes nothing, for good.
        return JSONResponse({"error": str(exc), "detail": []}, status_code=503)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"error": str(exc), "detail": []}, status_code=404)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own: a body that is not readable JSON (400), no such path (404), method (405).
        return JSONResponse({"error": str(exc.detail), "detail": []}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"error": str(exc), "detail": []}, status_code=409)

    @app.get(
        "/v1/health",
        response_model=HealthOut,
        responses={
            503: {
                "model": HealthOut,
                "description": "the scheduling loop is failing or stalled, the database is unreachable, or this "
                "head lost the database's lease to another head",
            }
        },
        openapi_extra=allow(Rule.PUBLIC),
    )
    def health() -> JSONResponse:
        """200 when the scheduling loop runs; 503 with the reason when it fails or has stalled, the
        database cannot be reached, or this head lost the database's lease (`problem`, also as
        `error` like every error answer).

        Public so that probes and load balancers need no token; it tells job counts, nothing
        about any job."""
        head = service.head
        age = None if head.last_cycle_at is None else head.clock() - head.last_cycle_at
        problem = (
            head.lease_lost
            or head.last_error
            or (f"no scheduling cycle for {age:.0f} s" if age is not None and age > 10 else None)
        )
        try:
            jobs = service.store.count_jobs()
        except DatabaseUnavailable as e:
            jobs, problem = {}, str(e)
        body = {
            "status": "degraded" if problem else "ok",
            "problem": problem,
            "version": __version__,
            "jobs": jobs,
            "last_cycle_age_s": age,
            "last_decide_s": head.last_decide_s,
        }
        if problem:
            body["error"] = problem
        return JSONResponse(body, status_code=503 if problem else 200)

    session_submits: dict[str, asyncio.Lock] = {}  # per user: see submit()

    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=Job,
        openapi_extra=allow(Rule.SIGNED_IN, audit=False),
    )
    async def submit(spec: JobSpec, who: Caller) -> Response:
        """Submit to one of your teams (`team`, default: your first); the job is yours. A class
        above normal needs a grant in the policy (`priority_grants`; 403 without one)."""
        return await accept(spec, who)

    async def accept(spec: JobSpec, who: Identity) -> Response:
        """The route's work; api/submit_path.py calls it too, for the plain case it answers itself."""
        # One user's session submissions one at a time, from the count of GPUs their sessions
        # hold to the job's insert: two at once would both read the count from before the other
        # and together pass max_gpus_per_user. One head serves a database (its lease), so a lock
        # here covers every submission. Batch jobs take no lock.
        one_at_a_time = (
            session_submits.setdefault(who.user, asyncio.Lock()) if spec.interactive else contextlib.nullcontext()
        )
        async with one_at_a_time:
            spec = await _admissible(spec, who)
            job = await service.submit_async(spec, owner=who.user, can_see=who.can_see)
        # Serialised directly: FastAPI would re-validate a Job we just built from validated data.
        return Response(job.model_dump_json(), status_code=201, media_type="application/json")

    @app.post("/v1/jobs/dry-run", response_model=DryRunOut, openapi_extra=allow(Rule.SIGNED_IN, audit=False))
    async def dry_run(spec: JobSpec, who: Caller) -> DryRunOut:
        """Where and when this job would start if submitted now, checked as a submission is;
        nothing is queued or written (`gpucluster submit --dry-run`)."""
        spec = await _admissible(spec, who)
        return await run_in_threadpool(service.dry_run, spec, who.user, who.can_see)

    async def _admissible(spec: JobSpec, who: Identity) -> JobSpec:
        """A submission's checks beyond the spec's own: its team, class, mounts, account; a
        session gets the policy's session class (its priority, no grant needed, and limits)."""
        team = who.submit_team(spec.team if "team" in spec.model_fields_set else None)
        session_class = service.head.policy.interactive
        if spec.interactive and not getattr(service.head.executor, "supports_sessions", False):
            raise Rejected(
                "interactive",
                "this head cannot host interactive sessions: they need the local executor (a --ray head has none yet)",
            )
        if spec.interactive and spec.image:
            raise Rejected("interactive", "a session runs on the node's own system; leave out image (a container)")
        if spec.interactive:
            held = await run_in_threadpool(service.store.session_gpus, who.user)
            spec = sessions.apply_class(spec, session_class, held)
        if not (spec.interactive and session_class.priority is not None):
            if why := grants.serving_refusal(spec.priority):
                raise Rejected("priority", why)
            grants.check_priority(who, team, spec.priority, service.head.policy)
        if spec.mounts and (why := outside_roots(check_mounts(spec.mounts), service.head.policy.mount_roots)):
            raise Rejected("mounts", why)
        access.check_can_run(who)
        if team != spec.team:
            spec = spec.model_copy(update={"team": team})
        return spec

    @app.get("/v1/jobs", openapi_extra=allow(Rule.SIGNED_IN))
    def list_jobs(
        who: Caller,
        state: Annotated[list[JobState] | None, Query(description="repeat to match several")] = None,
        team: Annotated[str | None, Query(max_length=128)] = None,
        limit: Annotated[int | None, Query(ge=1, le=100_000, description="newest N")] = None,
        offset: Annotated[
            int, Query(ge=0, le=MAX_ID, description="skip the newest N first (with limit: a page, newest first)")
        ] = 0,
        q: Annotated[
            str | None, Query(max_length=128, description="name or owner contains this (any case), or the id is it")
        ] = None,
        collapse: Annotated[
            bool, Query(description="an array as one entry (its first element) with array_counts by state")
        ] = False,
    ) -> JobList:
        """Jobs of your teams (a cluster admin: all jobs), oldest first. With `limit`, `total` says
        how many match in all, so a client can page through them (the dashboard's jobs page)."""
        if team is not None and not who.can_see(team):
            raise Denied(f"team: you ({who.user}) are not in team {team!r}; your teams: {who.describe_teams()}")
        if q is not None and (problem := unstorable(q)) is not None:
            raise Rejected("q", problem)  # PostgreSQL refuses a NUL even in a query's parameter
        teams = who.visible_teams()
        text = q.strip() if q and q.strip() else None
        jobs = service.jobs(state, team, limit, teams=teams, text=text, offset=offset, collapse=collapse)
        total = None if limit is None else service.count_jobs(state, team, teams=teams, text=text, collapse=collapse)
        return JobList(jobs=jobs, total=total)

    @app.get("/v1/jobs/{job_id}", openapi_extra=allow(Rule.JOB_VIEW))
    def get_job(job_id: Id, who: Caller) -> Job:
        """One job; `spec.exported_env` (the submitter's environment) for its owner and cluster admins only."""
        return service.job(
            job_id, reveal_env=lambda owner: who.cluster_admin or (owner is not None and owner == who.user)
        )

    @app.get("/v1/jobs/{job_id}/pipeline", openapi_extra=allow(Rule.JOB_VIEW))
    def pipeline(job_id: Id, who: Caller) -> PipelineOut:
        """The chain of jobs through this one (an element: its array): what it waits for and what
        waits for it, by dependencies, with each step's state and expected start and end; only
        jobs of your teams (a cluster admin: all) are shown."""
        visible = who.visible_teams()
        return service.pipeline(job_id, None if visible is None else set(visible))

    @app.post("/v1/jobs/{job_id}/cancel", openapi_extra=allow(Rule.JOB_OPERATE))
    def cancel(job_id: Id, index: ArrayIndex = None, state: StateFilter = None) -> Job:
        """Cancel a job; an array's id cancels every element (or only element `index`); with
        `state`, only those in these states (`?state=queued`: the queued elements, as
        `scancel --state=PENDING`)."""
        return service.cancel_many(job_id, index, state or ())

    @app.post("/v1/jobs/{job_id}/hold", openapi_extra=allow(Rule.JOB_OPERATE))
    def hold(job_id: Id, index: ArrayIndex = None, state: StateFilter = None) -> HoldOut:
        """Hold a queued job (never started until released); an array's id holds its queued
        elements (or only element `index`; with `state`, only those). `changed`: the jobs it held."""
        return service.hold(job_id, True, index, state or ())

    @app.post("/v1/jobs/{job_id}/release", openapi_extra=allow(Rule.JOB_OPERATE))
    def release(job_id: Id, index: ArrayIndex = None, state: StateFilter = None) -> HoldOut:
        """Release a held job (or an array's held elements, or element `index`; with `state`, only those)."""
        return service.hold(job_id, False, index, state or ())

    @app.post("/v1/jobs/{job_id}/array", openapi_extra=allow(Rule.JOB_OPERATE))
    def update_array(job_id: Id, change: ArrayUpdate) -> Job:
        """Change an array's throttle (the most elements that run at once; null: no limit)."""
        return service.set_throttle(job_id, change.throttle)

    @app.patch("/v1/jobs/{job_id}", openapi_extra=allow(Rule.JOB_OPERATE))
    def update_job(job_id: Id, change: JobUpdate, request: Request, who: Caller, index: ArrayIndex = None) -> Job:
        """Change a queued job (an array's id: each queued element; `index`: one element), or a
        running job's time limit: fields as at submit, validated by the same rules (a class above
        normal needs its grant: 403). A running job's owner or team admin may only shorten its
        limit; a cluster admin may set any. 409 if the job is no longer queued (or running).
        Each change is in the job's events and the audit log ('priority normal -> high')."""
        job, changes = service.update(job_id, change, who, index)
        target = f"job {job_id}" + (f"[{index}]" if index is not None else "")
        rules.note_audit(request, target, "; ".join(changes) or "nothing changed")
        return job

    @app.post("/v1/jobs/{job_id}/what-if", response_model=DryRunOut, openapi_extra=allow(Rule.JOB_VIEW, audit=False))
    def what_if(job_id: Id, change: JobUpdate, who: Caller) -> DryRunOut:
        """When this queued job would start with these fields changed (as `PATCH` takes them):
        `gpucluster why JOB --what-if gpus=4`. Nothing is changed; a class above normal needs
        its grant (403), as an update would."""
        return service.what_if(job_id, change, who)

    @app.post("/v1/jobs/{job_id}/requeue", openapi_extra=allow(Rule.JOB_OPERATE))
    def requeue(job_id: Id, index: ArrayIndex = None, state: StateFilter = None) -> Job:
        """Checkpoint and requeue a running job: SIGTERM, the grace period, `preempted`, back in
        the queue with the same id; its next start is a new attempt (409 if it is not running).
        An array's id requeues its running elements (`index`: one element; `state`: a filter)."""
        return service.requeue_many(job_id, index, state or ())

    @app.post(
        "/v1/jobs/{job_id}/progress",
        status_code=204,
        openapi_extra=allow(Rule.JOB_REPORT, audit=False),
    )
    def progress(job_id: Id, report: ProgressIn) -> Response:
        """A running job reports its step and newest checkpoint (gpucluster.train does, from rank 0)."""
        service.progress(job_id, report)
        return Response(status_code=204)

    @app.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse, openapi_extra=allow(Rule.JOB_VIEW))
    async def logs(
        request: Request,
        who: Caller,
        job_id: Id,
        offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        attempt: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
        rank: Annotated[
            int | None, Query(ge=0, le=MAX_ID, description="a distributed job's process [default: 0]")
        ] = None,
        follow: Annotated[
            bool,
            Query(
                description="keep streaming as the log grows, until the attempt ends (a few hundred per user; 429 past)"
            ),
        ] = False,
        all_ranks: Annotated[
            bool, Query(description="every rank's output, each line prefixed `[rank N] ` as torchrun's --tee")
        ] = False,
    ) -> Any:
        """A job's output from `offset` (bytes since the attempt began); with follow, a stream.

        Async, so that no follow holds a worker thread (api/follow.py); reads go to a thread."""
        if all_ranks:
            if follow or rank is not None or offset:
                raise Rejected(
                    "all_ranks",
                    "all_ranks reads every rank's log from its start; it takes no follow, rank or offset "
                    "(follow each rank's log, as `gpucluster logs --all-ranks --follow` does)",
                )
            paths, _ = await run_in_threadpool(service.rank_logs, job_id, attempt)
            return PlainTextResponse(await run_in_threadpool(_read_ranks, paths))
        path, record = await run_in_threadpool(service.log_path, job_id, attempt, rank)
        if not follow:
            return PlainTextResponse(await run_in_threadpool(_read_from, path, offset) if path else "")
        token = request.headers.get("authorization", "").partition(" ")[2].strip()
        f = follows.open(who, token, job_id, attempt, rank, record.team)
        return follows.response(f, offset)

    @app.get("/v1/queue", openapi_extra=allow(Rule.SIGNED_IN))
    def queue(
        who: Caller,
        limit: Annotated[int, Query(ge=1, le=MAX_QUEUE_PAGE, description="list at most this many, from the front")] = (
            DEFAULT_QUEUE_PAGE
        ),
        job: Annotated[int | None, Query(ge=1, le=MAX_ID, description="list only this job, at its position")] = None,
    ) -> QueueOut:
        """Queued jobs in scheduling order, each with why it waits and, if known, when it starts.

        Only your teams' jobs are listed, at their positions in the whole queue: a gap in the
        positions is other teams' jobs ahead of yours, which are not shown. `total` counts all
        the queued jobs you may see; `limit` lists only the first of them."""
        return service.queue(None if who.cluster_admin else who.can_see, limit, job)

    @app.get("/v1/policy", openapi_extra=allow(Rule.SIGNED_IN))
    def policy(who: Caller) -> PolicyOut:
        """The policy in force, each team's entitled share and quota; the decayed usage and running
        GPUs of your teams only (a cluster admin: of all; null for the others)."""
        return service.policy(None if who.cluster_admin else who.can_see)

    @app.get("/v1/nodes", openapi_extra=allow(Rule.SIGNED_IN))
    def nodes() -> NodeList:
        """Nodes and GPUs; a busy GPU names its job's id (never its name, team or command)."""
        return NodeList(nodes=service.nodes())

    add_admin_routes(app, access)
    add_session_routes(app, service, access)  # WebSockets: a session's terminal, tunnels to a job's ports
    add_telemetry_routes(app, service, public_team_usage=public_team_usage)  # drain/undrain, GPU samples, /metrics
    add_accounting_routes(app, service)  # usage, budgets
    if services is not None:
        add_service_routes(app, services, access)  # /v1/services
    document_errors(app)  # every route's error answers in the OpenAPI document (api/errors.py)
    dashboard_serve.mount(app)  # the web UI at `/`: static files that read this API like any client

    # A plain submission skips FastAPI's routing (api/submit_path.py); every other request, and
    # any submission FastAPI must answer with an error about its body, goes to the app.
    api = BodyLimit(rules.AuditLog(SubmitPath(app, app, accept), access), MAX_BODY_BYTES)
    if services is not None:  # the gateway at /serve/NAME/, in front of the API (services/gateway.py)
        gateway = Gateway(services.runtimes, access)
        return GatewayRoutes(api, BodyLimit(gateway, GATEWAY_MAX_BODY_BYTES), gateway_port)  # type: ignore[return-value]
    return api  # type: ignore[return-value]


def _read_from(path: Any, offset: int) -> str:
    return read_log(path, offset)[0].decode(errors="replace")


def _read_ranks(paths: list[Path]) -> str:
    """Every rank's log, rank after rank, each line prefixed `[rank N] ` (torchrun's --tee)."""
    return "".join(prefix_lines(_read_from(p, 0), f"[rank {r}] ") for r, p in enumerate(paths))
