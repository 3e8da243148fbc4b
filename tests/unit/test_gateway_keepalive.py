"""The gateway and a replica's idle keep-alive close: a POST sent on a pooled connection that the
replica has just closed must not come back 502 (CI saw `replica 1: ReadError` under load).

The replica here is a real TCP server that makes the race certain instead of rare: it answers the
first request on each connection with keep-alive, then resets the connection (SO_LINGER 0) when a
second request arrives on it, without reading it, as a server whose idle timer fired does. A
request on a new connection is always answered, so the only correct outcome is 200 for every call
and each POST run exactly once.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import httpx

from gpucluster.services.gateway import Gateway
from gpucluster.services.runtime import Access, Runtimes


class ResettingReplica:
    """Answers one request per connection, then resets the connection on the next one."""

    def __init__(self) -> None:
        self.handled: list[bytes] = []  # the bodies it answered, in order
        self.resets = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        self.handled.append(body)
        answer = b'{"ok": true}'
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
        )
        await writer.drain()
        await reader.read(1)  # the next request's first byte (or EOF): this "idle" connection is done
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.resets += 1
        writer.transport.abort()


class OpenService:
    """The access check's stand-in: the service is public, so no caller is looked up."""

    def authenticate(self, token: str | None) -> None:
        raise AssertionError("a public service checks no token")


async def call_through_gateway(posts: int) -> tuple[list[int], ResettingReplica]:
    replica = ResettingReplica()
    server = await asyncio.start_server(replica.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    runtimes = Runtimes()
    runtimes.set_service("clf", Access(team="a", public=True), [(1, f"http://127.0.0.1:{port}", "ready")])
    gateway = Gateway(runtimes, OpenService(), hold_timeout_s=5)
    transport = httpx.ASGITransport(app=gateway)
    statuses = []
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://head") as caller:
            for i in range(posts):  # one after another: each reuses the connection the last one left
                r = await caller.post("/serve/clf/predict", content=b"request %d" % i)
                statuses.append(r.status_code)
    finally:
        await gateway.aclose()
        server.close()
        await server.wait_closed()
    return statuses, replica


def test_a_post_on_a_connection_the_replica_just_closed_is_sent_once_on_a_new_one() -> None:
    statuses, replica = asyncio.run(call_through_gateway(5))
    assert statuses == [200] * 5
    assert replica.handled == [b"request %d" % i for i in range(5)]  # each POST ran once, in order
    assert replica.resets >= 4  # the race really happened: every later POST first met a reset
