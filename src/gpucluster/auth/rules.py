"""Who may call which endpoint: one declared rule per route, enforced by one app-wide dependency.

A route says who may call it with `openapi_extra=allow(Rule.X)`; the rule is then enforced by
`guard` (attached to the whole app, so routes added later, or by an included router, are guarded
too) and published in the OpenAPI document as `x-access`, where users and the authorization
matrix test read it. A route that declares nothing still requires a valid token (safe default),
and the matrix test names it until it gets a rule.

Every successful call of a route that changes something (any method but GET/HEAD) is written to
the audit log with the caller, the route's name as the action, and its path parameters as the
target, unless the route opts out with `allow(..., audit=False)` (submissions are audited by the
jobs table itself; progress reports are a job's own bookkeeping).
"""

from __future__ import annotations

import logging
import math
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpucluster.auth.control import AccessControl
from gpucluster.auth.identity import Denied, Identity, RateLimited, Unauthorized
from gpucluster.head.service import NotFound
from gpucluster.models import MAX_SQL_INT

log = logging.getLogger("gpucluster.auth")

ACCESS_KEY = "x-access"
AUDIT_KEY = "x-audit"
_IDENTITY = "gpucluster.identity"
_AUDIT = "gpucluster.audit"


class Rule(StrEnum):
    PUBLIC = "public"  # no token: liveness probes
    SIGNED_IN = "signed-in"  # any user; what they get is filtered to their teams
    JOB_VIEW = "job-view"  # members of the job's team (and cluster admins)
    JOB_OPERATE = "job-operate"  # the job's submitter, its team's admins, cluster admins
    JOB_REPORT = "job-report"  # the job's own token, or whoever may operate the job
    CLUSTER_ADMIN = "cluster-admin"


JOB_RULES = (Rule.JOB_VIEW, Rule.JOB_OPERATE, Rule.JOB_REPORT)


def allow(rule: Rule, *, audit: bool = True, **extra: Any) -> dict[str, Any]:
    """`openapi_extra` for a route: who may call it, and whether its calls are audited."""
    out: dict[str, Any] = {ACCESS_KEY: rule.value, **extra}
    if not audit:
        out[AUDIT_KEY] = False
    return out


bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="a user's token (`gpucluster admin add-user`), or a job's own GPUCLUSTER_JOB_TOKEN",
)


def route_rule(route: Any) -> Rule | None:
    """The rule a route declares, or None."""
    value = (getattr(route, "openapi_extra", None) or {}).get(ACCESS_KEY)
    return Rule(value) if value is not None else None


async def guard(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """Authenticate the caller and apply the route's rule (401, 403, 404, 429 with the reason)."""
    route = request.scope.get("route")
    rule = route_rule(route) or Rule.SIGNED_IN
    if rule is Rule.PUBLIC:
        return
    control: AccessControl = request.app.state.access
    who = control.authenticate(creds.credentials if creds else None)
    control.check_rate(who)
    request.scope[_IDENTITY] = who
    what = f"{request.method} {getattr(route, 'path', request.url.path)}"
    if who.is_job and rule is not Rule.JOB_REPORT:
        raise Denied(f"{what}: a job's own token may only report that job's progress")
    if rule is Rule.CLUSTER_ADMIN and not who.cluster_admin:
        raise Denied(f"{what} is for cluster admins; you ({who.user}) are not one")
    if rule in JOB_RULES:
        await _check_job(request, who, rule)
    if request.method not in ("GET", "HEAD") and (getattr(route, "openapi_extra", None) or {}).get(AUDIT_KEY, True):
        params = dict(request.path_params)
        target = " ".join(f"job {v}" if k == "job_id" else f"{k} {v}" for k, v in params.items())
        action = str(getattr(route, "name", what)).replace("_", "-")
        request.scope[_AUDIT] = (who.user, action, target, what)


async def _check_job(request: Request, who: Identity, rule: Rule) -> None:
    raw = request.path_params.get("job_id")
    try:
        job_id = int(raw) if raw is not None else None
    except ValueError:
        return  # not a job id: the route's validation answers 422
    if job_id is None or not 1 <= job_id <= MAX_SQL_INT:
        return  # not an id the store can hold: the route's validation answers 422
    if rule is Rule.JOB_REPORT and who.is_job:
        if who.job_id != job_id:
            raise Denied(f"this job token belongs to job {who.job_id}, not job {job_id}")
        return
    store = request.app.state.service.store
    record = await run_in_threadpool(store.get_job, job_id)
    if record is None:
        raise NotFound(f"no job with id {job_id}")
    if not who.can_see(record.team):
        # Another team's job answers as a missing one, word for word: a caller learns nothing
        # about other teams' jobs, not even which ids exist.
        raise NotFound(f"no job with id {job_id}")
    if rule is not Rule.JOB_VIEW and not who.can_operate(record.team, record.owner):
        raise Denied(
            f"job {job_id} was submitted by {record.owner or 'someone else'}; only they, an admin of its "
            f"team, or a cluster admin may {'report for' if rule is Rule.JOB_REPORT else 'change'} it"
        )


async def caller(request: Request) -> Identity:
    """The authenticated caller, for a handler that filters by team or records who acted.

    async, though it only reads what `guard` stored: FastAPI runs a plain `def` dependency on
    its thread pool, and that hop cost every request more CPU than the rest of its checks."""
    who = request.scope.get(_IDENTITY)
    if not isinstance(who, Identity):
        raise Unauthorized("this endpoint needs a token")
    return who


Caller = Annotated[Identity, Depends(caller)]


def install(app: FastAPI, control: AccessControl) -> None:
    """Guard every route of `app` (call before adding routes) and answer denials in one shape."""
    app.state.access = control
    app.router.dependencies.insert(0, Depends(guard))

    @app.exception_handler(Unauthorized)
    async def _unauthorized(_: Request, exc: Unauthorized) -> JSONResponse:
        return JSONResponse({"error": str(exc), "detail": []}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(Denied)
    async def _denied(_: Request, exc: Denied) -> JSONResponse:
        return JSONResponse({"error": str(exc), "detail": []}, status_code=403)

    @app.exception_handler(RateLimited)
    async def _limited(_: Request, exc: RateLimited) -> JSONResponse:
        retry = max(1, math.ceil(exc.retry_after_s - 1e-9))
        return JSONResponse({"error": str(exc), "detail": []}, status_code=429, headers={"Retry-After": str(retry)})


class AuditLog:
    """ASGI wrapper: writes the audit entry `guard` prepared once the call has succeeded."""

    def __init__(self, app: ASGIApp, control: AccessControl) -> None:
        self.app = app
        self.control = control

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        status = 500

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, receive, watch)
        entry = scope.get(_AUDIT)
        if entry is not None and status < 400:
            try:
                await run_in_threadpool(self.control.record, *entry)
            except Exception:  # the action happened; a failed audit write must not hide that
                log.exception("could not write the audit entry %s", entry)


def note_audit(request: Request, target: str, detail: str = "") -> None:
    """Name what a call acted on when its path does not (a user created from the body)."""
    entry = request.scope.get(_AUDIT)
    if entry is not None:
        request.scope[_AUDIT] = (entry[0], entry[1], target, detail or entry[3])
