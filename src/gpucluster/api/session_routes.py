"""WebSocket routes of interactive sessions: a terminal, and TCP tunnels to a job's ports.

- `/v1/jobs/{id}/attach?rows=R&cols=C`: the session's terminal. The bytes both ways are the
  session server's frames (executors/_session.py), which the CLI speaks; the head relays them
  and reads none of them, so a keystroke costs it one read and one write.
- `/v1/jobs/{id}/forward/{port}`: one TCP connection to 127.0.0.1:port on the job's node, made
  by the session's own process, as the job's user (so a tunnel reaches nothing its owner could
  not reach from a job of their own); raw bytes both ways.

Who: attach is for the session's owner alone (what is typed runs as their Unix account, so not
even a team admin may type into it; they may cancel it); forward for the members of the job's
team, as the issue asks (a notebook shared with one's team). A job's own token may do neither.
Every refusal is an HTTP 403 before the upgrade, with the reason as the body's `error`, and a
job of another team reads exactly like a missing one.

These are plain Starlette routes, not FastAPI ones: the app's guard dependency reads an HTTP
request, so the routes authenticate here with the same AccessControl and the same rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from gpucluster.auth.control import AccessControl
from gpucluster.auth.identity import Identity, RateLimited, Unauthorized
from gpucluster.errors import GpuclusterError
from gpucluster.head import sessions
from gpucluster.head.service import ClusterService
from gpucluster.models import MAX_SQL_INT
from gpucluster.store import JobRecord

log = logging.getLogger("gpucluster.api")

# How long an attach waits for a just-started session's launch to be recorded: one start's work
# on the loop (moments), generous for a loaded machine; past it the caller is told to retry.
SESSION_START_WAIT_S = 10.0
RECHECK_S = 5.0  # how soon a revoked token or a removed member loses an open terminal or tunnel


class _Refused(GpuclusterError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def add_session_routes(app: FastAPI, service: ClusterService, access: AccessControl) -> None:
    async def attach(ws: WebSocket) -> None:
        try:
            record, who = await _authorize(ws, service, access, owner_only=True)
            rows = _int(ws.query_params.get("rows"), 24, 1, 10000)
            cols = _int(ws.query_params.get("cols"), 80, 1, 10000)
            sock = await _connect(record, {"op": "attach", "rows": rows, "cols": cols})
        except _Refused as e:
            await _deny(ws, e.status, str(e))
            return
        await _audit(access, who, "attach", record.id, "WS /v1/jobs/{job_id}/attach")
        await _relay(ws, sock, lambda: _authorize(ws, service, access, owner_only=True))

    async def forward(ws: WebSocket) -> None:
        try:
            record, who = await _authorize(ws, service, access, owner_only=False)
            port = _int(ws.path_params.get("port"), 0, 1, 65535)
            if port == 0:
                raise _Refused(422, "port: a TCP port is 1-65535")
            sock = await _connect(record, {"op": "forward", "port": port})
        except _Refused as e:
            await _deny(ws, e.status, str(e))
            return
        await _audit(access, who, "forward", record.id, f"WS /v1/jobs/{{job_id}}/forward/{port}")
        await _relay(ws, sock, lambda: _authorize(ws, service, access, owner_only=False, rated=False))

    app.router.routes.append(WebSocketRoute("/v1/jobs/{job_id}/attach", attach, name="attach"))
    app.router.routes.append(WebSocketRoute("/v1/jobs/{job_id}/forward/{port}", forward, name="forward"))


async def _audit(access: AccessControl, who: Identity, action: str, job_id: int, detail: str) -> None:
    """Who opened a terminal or a tunnel into which job: in the audit log, as changes are."""
    try:
        await run_in_threadpool(access.record, who.user, action, f"job {job_id}", detail)
    except Exception:  # the connection is made; a failed audit write must not hide that
        log.exception("could not write the audit entry for %s of job %s", action, job_id)


def _int(raw: Any, default: int, low: int, high: int) -> int:
    try:
        value = int(raw) if raw is not None else default
    except ValueError:
        return default
    return value if low <= value <= high else default


def _token(ws: WebSocket) -> str | None:
    scheme, _, token = ws.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


async def _authorize(
    ws: WebSocket, service: ClusterService, access: AccessControl, owner_only: bool, rated: bool = True
) -> tuple[JobRecord, Identity]:
    """The job and the caller, if the caller may do this with it now; _Refused says why not."""
    try:
        who = await run_in_threadpool(access.authenticate, _token(ws))
        if rated:
            access.check_rate(who)
    except Unauthorized as e:
        raise _Refused(401, str(e)) from None
    except RateLimited as e:
        raise _Refused(429, str(e)) from None
    if who.is_job:
        raise _Refused(403, "a job's own token may only report that job's progress")
    try:
        job_id = int(ws.path_params["job_id"])
    except ValueError:
        raise _Refused(422, "job_id: a job id is a whole number") from None
    if not 1 <= job_id <= MAX_SQL_INT:
        raise _Refused(422, "job_id: a job id is a whole number from 1")
    record = await run_in_threadpool(service.store.get_job, job_id)
    if record is None or not who.can_see(record.team):
        # The same words for another team's job and a missing one: nothing about other teams leaks.
        raise _Refused(403, f"job {job_id} is not a job of your teams ({who.describe_teams()})")
    if owner_only and record.owner != who.user:
        raise _Refused(
            403,
            f"job {job_id} is {record.owner or 'someone else'}'s session; only its owner may attach "
            "(what is typed runs as their account); a team admin may cancel it",
        )
    # A session that has just started may not have its launch recorded yet (RUNNING is committed
    # first): `run` attaches the moment it sees "running", so that is waited out here, not refused.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SESSION_START_WAIT_S
    while True:
        try:
            sessions.run_dir_of(record)
            return record, who
        except sessions.Starting as e:
            if loop.time() > deadline:
                raise _Refused(409, str(e)) from None
        except sessions.NotReachable as e:
            raise _Refused(409, str(e)) from None
        await asyncio.sleep(0.05)
        again = await run_in_threadpool(service.store.get_job, job_id)
        if again is None:
            raise _Refused(403, f"job {job_id} is not a job of your teams ({who.describe_teams()})")
        record = again


async def _connect(record: JobRecord, hello: dict[str, Any]) -> socket.socket:
    """The session server's connection after `hello`, retried while it is still starting."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while True:
        try:
            sock, answer = await run_in_threadpool(sessions.connect, record, hello)
            break
        except sessions.NotReachable as e:
            if loop.time() > deadline:
                raise _Refused(409, str(e)) from None
            await asyncio.sleep(0.02)
    if not answer.get("ok"):
        sock.close()
        raise _Refused(502, str(answer.get("error") or "the session refused the connection"))
    return sock


async def _deny(ws: WebSocket, status: int, message: str) -> None:
    """Refuse the upgrade with an HTTP answer in the API's error shape (a bare 403 where the
    server cannot send one)."""
    body = JSONResponse({"error": message, "detail": []}, status_code=status)
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(body)
    else:
        await ws.close(code=1008, reason=message[:120])


async def _relay(ws: WebSocket, sock: socket.socket, still_allowed: Callable[[], Awaitable[object]]) -> None:
    """Bytes both ways until either side ends, or the caller may no longer do this (a token
    revoked, a user taken out of the team, the session ended: `still_allowed` raises _Refused,
    asked every RECHECK_S); then both are closed."""
    await ws.accept()
    sock.setblocking(False)
    reader, writer = await asyncio.open_unix_connection(sock=sock)

    async def up() -> None:  # the user -> the session
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes") or (message.get("text") or "").encode()
            if data:
                writer.write(data)
                await writer.drain()

    async def down() -> None:  # the session -> the user
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            await ws.send_bytes(data)

    async def recheck() -> None:
        while True:
            await asyncio.sleep(RECHECK_S)
            try:
                await still_allowed()
            except _Refused as e:
                with contextlib.suppress(Exception):
                    await ws.close(code=1008, reason=str(e)[:120])
                return
            except Exception:  # the database away for a moment: the next check decides
                continue

    tasks = [asyncio.create_task(up()), asyncio.create_task(down()), asyncio.create_task(recheck())]
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError, WebSocketDisconnect, RuntimeError):
                await t
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await ws.close()
