"""Bounds on connections the head's HTTP server holds, whatever their requests are.

Why: uvicorn keeps a connection that never finishes its request headers for ever (its keep-alive
timeout only runs between requests), and takes every connection offered until the process runs
out of file descriptors; its `limit_concurrency` answers 503 only once a request's headers are
in, so it does not stop a slowloris either. So the head serves HTTP with `GuardedHttpTools`, the
usual httptools protocol plus:

- a connection cap: past `max_connections` open at once, a new connection gets a one-line 503
  and is closed (existing ones, open log follows among them, carry on);
- TCP keepalive probes: a peer that vanished without closing (a laptop that slept, a dropped
  NAT entry), whose connection would otherwise look open for ever to a quiet log follow, is found
  dead within `KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES` (two minutes);
- a header timeout: a request's headers (from the connection's start, or from the first byte
  of the next request on a kept-alive connection) must be in within `header_timeout_s`, else the
  connection is closed; and at most `MAX_HEADER_BYTES` of them (431).

A request body that stalls is bounded at the ASGI level (api/app.py's BodyLimit), where the app
can still answer 408 with its usual error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpucluster.connection import KEEP_ALIVE_S

log = logging.getLogger("gpucluster.head")

DEFAULT_MAX_CONNECTIONS = 16_384  # 10,000 open log follows fit (bench/bench_follow.py)
DEFAULT_HEADER_TIMEOUT_S = 15.0
MAX_HEADER_BYTES = 64 * 1024
KEEPALIVE_IDLE_S = 60
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 6
FD_RESERVE = 512  # descriptors kept for the store, job logs and the head's own files


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one (a connection is a descriptor); the new
    soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = 1_048_576 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(wanted: int, fd_limit: int) -> int:
    """The connections the head can hold: `wanted`, or fewer where file descriptors run out first."""
    return max(16, min(wanted, fd_limit - FD_RESERVE))


def _keepalive(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):  # not TCP (a Unix socket), or not Linux
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


def _response(status: bytes, message: str) -> bytes:
    body = json.dumps({"error": message, "detail": []}).encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class _HeadWithBody:
    """A response's transport that sends its head (status line and headers) together with the
    first part of its body, in one write, where the body's length is known (Content-Length).

    Why: uvicorn writes the head and the body of every response apart, so each answer cost two
    send() calls and reached the client as two segments for it to read. A submission's answer
    is ~100 bytes of JSON: the second system call on each side was a measurable part of a
    submission's CPU (bench/bench_submit.py). A chunked (streamed) answer's head is never
    held: a log follow's client must see its 200 before the first line is written."""

    __slots__ = ("_cycle", "_head", "_head_seen", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle  # uvicorn's RequestResponseCycle: where its response stands
        self._head: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        head, self._head = self._head, None
        if head is not None:
            self._transport.write(head + data)
            return
        cycle = self._cycle
        if cycle.response_started and not self._head_seen:  # not a "100 Continue" written before it
            self._head_seen = True
            if (
                cycle.chunked_encoding is False
                and cycle.expected_content_length > 0
                and cycle.scope["method"] != "HEAD"
            ):
                self._head = data  # sent with the body, which must follow
                return
        self._transport.write(data)

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None:
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


def guarded_protocol(max_connections: int, header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with the bounds of this module (pass as Config(http=...))."""

    class GuardedHttpTools(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0
        _awaiting_headers = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(
                    _response(
                        b"503 Service Unavailable",
                        f"the head holds {max_connections} connections, its most; retry later",
                    )
                )
                transport.close()
                return
            _keepalive(transport)
            self._expect_headers()

        def _expect_headers(self) -> None:
            self._awaiting_headers = True
            self._header_bytes = 0
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self._awaiting_headers and not self.transport.is_closing():
                self.transport.write(
                    _response(b"408 Request Timeout", f"request headers took longer than {header_timeout_s:g} s")
                )
                self.transport.close()

        def _headers_done(self) -> None:
            self._awaiting_headers = False
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def data_received(self, data: bytes) -> None:
            if self._awaiting_headers:
                self._header_bytes += len(data)
            # Parsed first: a chunk that holds the end of the headers holds the start of the body
            # too (a large submission), and only bytes still before the headers' end count.
            super().data_received(data)
            if self._awaiting_headers and self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                self._headers_done()
                self.transport.write(
                    _response(b"431 Request Header Fields Too Large", f"request headers over {MAX_HEADER_BYTES} bytes")
                )
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._awaiting_headers:  # the next request on a kept-alive connection
                self._expect_headers()

        def on_headers_complete(self) -> None:
            self._headers_done()
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.transport is self.transport:
                cycle.transport = _HeadWithBody(self.transport, cycle)  # type: ignore[assignment]

        def on_response_complete(self) -> None:
            cycle = self.cycle
            if cycle is not None and isinstance(cycle.transport, _HeadWithBody):
                cycle.transport.flush()  # a head with no body after all (an error): sent now
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_done()
            super().connection_lost(exc)

    return GuardedHttpTools


def server_settings(max_connections: int, header_timeout_s: float) -> dict[str, Any]:
    """uvicorn.Config keywords for the head: the guarded protocol, and a bounded backlog."""
    return {
        "http": guarded_protocol(max_connections, header_timeout_s),
        "backlog": min(4096, max_connections),
        "timeout_keep_alive": KEEP_ALIVE_S,  # clients reconnect before it (gpucluster.connection)
        # The head logs at "warning": uvicorn's access lines (info) were never printed, but with
        # the access log on it still built each line's arguments for every response.
        "access_log": False,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,  # if uvicorn is ever run with h11
    }
