"""The gateway: `/serve/NAME/...` on the head, proxied to one of the service's ready replicas.

Built on httpx.AsyncClient with one connection pool for all services (keep-alive to replicas, so
a request costs no new TCP connection). The caller's token is checked here and never forwarded:
a replica runs as its owner and must not see other users' tokens (nor cookies), and its answers
are sandboxed (their own origin, not the head's: see SANDBOX). Responses are streamed as
they come (chunked bodies, server-sent events), never buffered whole.

Retries: a request that could not be sent (connection refused: the replica just died) is sent
once more to another replica whatever its method; one whose replica failed mid-way (the
connection dropped before the response began) only if its method is idempotent. One exception,
as browsers make it: a request that failed before any answer on a *reused* keep-alive connection
is sent again on a new one, whatever its method. That is the replica closing an idle connection
just as the gateway sent on it (uvicorn closes after 5 s idle, gunicorn after 2 s): the replica
never read the request, so sending it again runs it once, not twice. Pooled connections are
kept only KEEPALIVE_S, under those servers' timeouts, so the race is rare to begin with.

httpx is imported where it is first used, never with this module: `import httpx` also imports
its command line's rich and pygments, 4.9 MiB of a head's 84 MiB at rest (issue 18 asks the
head at rest for 80 MiB or less), and a cluster without services never needs it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gpucluster.auth.control import AccessControl
from gpucluster.auth.identity import RateLimited, Unauthorized
from gpucluster.services.balancer import Endpoint
from gpucluster.services.runtime import Runtimes
from gpucluster.services.spec import IDEMPOTENT_METHODS

if TYPE_CHECKING:
    import httpx

# Hop-by-hop headers (RFC 9110 7.6.1) and what the gateway sets itself.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "authorization",
        "cookie",
        "set-cookie",
    }
)
# A service's pages are served from the head's origin, where the dashboard keeps its token (in
# localStorage): a sandboxed document gets an opaque origin of its own, so a member's service
# cannot script the head's origin to read another user's token.
SANDBOX = {"content-security-policy": "sandbox allow-scripts allow-forms allow-popups allow-downloads"}
HOLD_TIMEOUT_S = 300.0  # a request waits this long for a replica of a service scaled to zero
PREFIX = "/serve/"
MOUNT = "gpucluster.gateway_mount"  # scope key: where services are mounted (PREFIX, or / on the gateway port)
WHOLE_BODY_BYTES = 256 * 1024  # answers up to this size (with a Content-Length) are read whole
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
KEEPALIVE_S = 1.5  # an idle pooled connection to a replica is closed by us first (servers: 2-5 s)
STALE_RETRIES = 3  # sends again after a reused connection failed before any answer (see above)


class _Dialed:
    """httpcore's trace hook for one request: was a new connection dialed for it? A failure on a
    reused connection before any answer is the replica's idle close racing the send."""

    __slots__ = ("fresh",)

    def __init__(self) -> None:
        self.fresh = False

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.started":
            self.fresh = True


class GatewayRoutes:
    """ASGI: `/serve/NAME/...` goes to the gateway, everything else to the API; and on the
    gateway's own port (`up --gateway-port`), `/NAME/...` goes to the gateway and nothing else
    is served.

    Why in front of FastAPI rather than a route in it: a proxied request needs none of the API's
    routing, dependency resolution, audit and error machinery, which cost milliseconds per
    request on a busy head; the gateway checks its own callers. Why a port of its own: a
    platform engineer can open the services to callers (a load balancer, another network) that
    should never reach the API or the dashboard; one server and one event loop serve both
    sockets, told apart by the port each connection came in on."""

    def __init__(self, api: ASGIApp, gateway: ASGIApp, gateway_port: int | None = None) -> None:
        self.api = api
        self.gateway = gateway
        self.gateway_port = gateway_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.api(scope, receive, send)
        elif self.gateway_port is not None and (scope.get("server") or ("", None))[1] == self.gateway_port:
            if scope["type"] != "http":  # a WebSocket: not relayed (yet); refuse the handshake
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.gateway({**scope, MOUNT: "/"}, receive, send)
        elif scope["type"] == "http" and scope["path"].startswith(PREFIX):
            await self.gateway(scope, receive, send)
        else:
            await self.api(scope, receive, send)


class Gateway:
    def __init__(self, runtimes: Runtimes, access: AccessControl, hold_timeout_s: float = HOLD_TIMEOUT_S) -> None:
        self.runtimes = runtimes
        self.access = access
        self.hold_timeout_s = hold_timeout_s
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        # Made on first use, inside the server's event loop, which its pool belongs to.
        if self._client is None:
            import httpx  # on first use, not with the module (see the module's docstring)

            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(connect=5.0, read=None, write=60.0, pool=30.0),
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=KEEPALIVE_S),
                follow_redirects=False,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The path as the caller encoded it (raw_path): `%2F` in a segment stays one segment.
        raw = scope.get("raw_path") or scope["path"].encode()
        mount: str = scope.get(MOUNT, PREFIX)
        name_raw, _, path_raw = raw[len(mount) :].partition(b"/")
        name, path = name_raw.decode("latin-1"), path_raw.decode("latin-1")
        request = Request(scope, receive)
        if not _NAME.match(name):
            response: Response = _error(404, f"{name!r} is not a service name; services are at {mount}NAME/")
        else:
            try:
                response = await self.handle(request, name, path, mount)
            except Unauthorized as e:
                response = _error(401, str(e))
                response.headers["WWW-Authenticate"] = "Bearer"
            except RateLimited as e:
                response = _error(429, str(e))
                response.headers["Retry-After"] = str(max(1, math.ceil(e.retry_after_s - 1e-9)))
        await response(scope, receive, send)

    def _refuse(self, name: str, request: Request) -> Response | None:
        """401/403/404 for a caller who may not call this service; None when they may."""
        access = self.runtimes.access(name)
        if access is None:
            return _error(404, f"no running service named {name!r}; `gpucluster services` lists them")
        if access.public:
            return None
        token = request.headers.get("authorization", "").partition(" ")[2].strip() or None
        who = self.access.authenticate(token)  # raises Unauthorized: the app's handler answers 401
        self.access.check_rate(who)
        if who.is_job or not who.can_see(access.team):
            return _error(
                403, f"service {name} is team {access.team}'s; you ({who.user}) are not in it and it is not public"
            )
        return None

    async def handle(self, request: Request, name: str, path: str, mount: str = PREFIX) -> Response:
        import httpx  # on first use, not with the module (see the module's docstring)

        refused = self._refuse(name, request)
        if refused is not None:
            return refused
        started = time.perf_counter()
        body = await request.body()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        headers += [
            ("x-forwarded-for", request.client.host if request.client else ""),
            ("x-forwarded-host", request.headers.get("host", "")),
            ("x-forwarded-proto", request.url.scheme),
            ("x-forwarded-prefix", f"{mount}{name}"),  # where the app is mounted, for the links it makes
        ]
        idempotent = request.method in IDEMPOTENT_METHODS
        tried: frozenset[int] = frozenset()
        last_error = ""
        for _ in range(2):
            endpoint = self.runtimes.acquire(name, tried)
            if endpoint is None:
                if not await self.runtimes.wait_ready(name, self.hold_timeout_s):
                    break
                endpoint = self.runtimes.acquire(name, tried)
                if endpoint is None:
                    break
            tried |= {endpoint.replica_id}
            query = request.url.query
            url = f"{endpoint.url}/{path}" + (f"?{query}" if query else "")
            try:
                upstream = await self._send(request.method, url, headers, body)
            except httpx.ConnectError as e:
                self._failed(name, endpoint)
                last_error = f"replica {endpoint.replica_id}: {e.__class__.__name__}"
                continue  # nothing was sent: safe to send again, whatever the method
            except httpx.TransportError as e:
                self._failed(name, endpoint)
                last_error = f"replica {endpoint.replica_id}: {e.__class__.__name__}"
                if idempotent:
                    continue
                break
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP} | SANDBOX
            length = upstream.headers.get("content-length", "")
            if length.isdigit() and int(length) <= WHOLE_BODY_BYTES:
                # A small body of known length: read at once, without a streaming response's
                # per-request task group (a third of the gateway's CPU for small answers).
                try:
                    # Raw bytes, as sent: aread() would decode a gzip body the header still names.
                    content = b"".join([chunk async for chunk in upstream.aiter_raw()])
                except httpx.TransportError as e:
                    self._failed(name, endpoint)
                    last_error = f"replica {endpoint.replica_id}: {e.__class__.__name__}"
                    if idempotent:
                        continue
                    break
                finally:
                    await upstream.aclose()
                self.runtimes.release(name, endpoint)
                self.runtimes.record(name, time.perf_counter() - started, ok=upstream.status_code < 500)
                return Response(content, status_code=upstream.status_code, headers=out_headers)
            return StreamingResponse(
                self._relay(name, endpoint, upstream, started),
                status_code=upstream.status_code,
                headers=out_headers,
            )
        self.runtimes.record(name, time.perf_counter() - started, ok=False)
        why = last_error or "no replica became ready"
        return _error(502 if last_error else 503, f"service {name}: {why}")

    async def _send(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> httpx.Response:
        """Send to one replica; sent again on a new connection when a reused one turns out to
        have been closed by the replica before it answered (see the module's docstring)."""
        import httpx  # on first use, not with the module (see the module's docstring)

        for stale_left in range(STALE_RETRIES, -1, -1):
            dialed = _Dialed()
            req = self.client().build_request(method, url, headers=headers, content=body, extensions={"trace": dialed})
            try:
                return await self.client().send(req, stream=True)
            except httpx.TransportError:
                if dialed.fresh or stale_left == 0:
                    raise
        raise AssertionError("unreachable: the last try raises or returns")

    def _failed(self, name: str, endpoint: Endpoint) -> None:
        self.runtimes.release(name, endpoint)
        self.runtimes.mark_unready(name, endpoint)

    async def _relay(
        self, name: str, endpoint: Endpoint, upstream: httpx.Response, started: float
    ) -> AsyncIterator[bytes]:
        import httpx  # on first use, not with the module (see the module's docstring)

        ok = upstream.status_code < 500
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.TransportError:
            ok = False
            raise
        finally:
            await upstream.aclose()
            self.runtimes.release(name, endpoint)
            self.runtimes.record(name, time.perf_counter() - started, ok=ok)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "detail": []}, status_code=status)
