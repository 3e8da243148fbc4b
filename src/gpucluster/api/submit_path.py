"""POST /v1/jobs without FastAPI's routing and dependency solving (issue 18).

Why: a submission is the call a sweep makes thousands of times a second, and on the head's
event loop FastAPI's machinery around it (its telemetry check, the middleware stack, matching
the path against every route, solving the dependency tree, reading the body through a
`Request`) cost ~150-190 us of the ~600 us the loop spent per submission (py-spy, the submit
phases of bench_submit): more than validating, authenticating and answering it together.

Nothing of the call is done twice or differently here; this module only removes the plumbing:
- the body is decoded and validated as FastAPI does it (`json.loads`, then JobSpec's
  validation in Python mode, what FastAPI's body field runs);
- the caller goes through the app's own `guard` (token, rate limit, the route's declared rule,
  its audit entry) with the route's own declaration, and the identity is read by `caller`;
- the submission is made and answered by the route's own handler body (`accept`);
- every error is answered by the app's own exception handler for it.
Only the plain case is taken: a request whose body FastAPI would refuse (not JSON, not a valid
JobSpec, another content type, an empty body) is handed to the app with its body before
anything is counted against the caller, so its answer (400, 401, 422, in FastAPI's order) is the
app's, word for word. The route stays declared in the app: the OpenAPI document, and every
request this module passes on, are served by it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpucluster.auth.identity import Identity
from gpucluster.auth.rules import bearer, caller, guard
from gpucluster.models import JobSpec

PATH = "/v1/jobs"
_JSON = b"application/json"

Accept = Callable[[JobSpec, Identity], Awaitable[Response]]


class SubmitPath:
    """ASGI: answers a well-formed POST /v1/jobs itself; passes every other request to `app`.

    `api` is the FastAPI app whose route, guard and exception handlers it uses; `accept` the
    route's own handler body (validated spec and caller in, the 201 out)."""

    def __init__(self, app: ASGIApp, api: FastAPI, accept: Accept) -> None:
        self.app = app
        self.api = api
        self.accept = accept
        self.route = next(
            r for r in api.routes if isinstance(r, APIRoute) and r.path == PATH and "POST" in (r.methods or ())
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_plain_submission(scope):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before its body arrived: no one to answer
        spec = _spec(body)
        if spec is None:  # FastAPI says what is wrong with it, as it always has
            await self.app(scope, _replay(body, receive), send)
            return
        scope["app"] = self.api  # what a route's Request reads (request.app.state.access)
        scope["route"] = self.route  # the rule `guard` applies is the route's own declaration
        request = Request(scope, receive)
        try:
            await guard(request, await bearer(request))
            response = await self.accept(spec, await caller(request))
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise  # as FastAPI's: uvicorn logs it and answers 500
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Callable[[Request, Exception], Awaitable[Response]] | None:
        """The app's handler for this exception, looked up as Starlette does (by its classes)."""
        handlers: dict[Any, Any] = self.api.exception_handlers
        for cls in type(exc).__mro__:
            if cls in handlers:
                handler: Callable[[Request, Exception], Awaitable[Response]] = handlers[cls]
                return handler
        return None


def _is_plain_submission(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH or scope.get("root_path"):
        return False
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.lower() == _JSON)
    return False  # no content type: FastAPI's own rules decide what the body is


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (the app's body limit, around this, bounds its size and its pauses);
    None if the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _spec(body: bytes) -> JobSpec | None:
    """The spec FastAPI would pass the route, or None where it would answer an error instead."""
    try:
        return JobSpec.model_validate(json.loads(body))
    except Exception:  # not only ValueError and ValidationError: whatever it is, the app answers it
        return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` with the body already read given back first."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
