"""The head's HTTP protocol hands a response to the socket in one write (issue 18), and a response
still streaming gets each part out within the event loop's turn, not held for the next part.

The real uvicorn httptools protocol of api/connections.py with a real ASGI app, over a
transport that records its writes (standing in for the socket: the unit is what the protocol
hands it, and how often). The real head's connections are covered by tests/e2e/test_api_limits.py
(follows, slow headers, the cap) and every e2e test's requests."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from gpucluster.api.connections import OneWritePerTurn, server_settings

WAIT_S = 30.0  # generous: a loaded 2-core machine


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.wrote = asyncio.Event()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        self.wrote.set()

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def _serve(app: Any, request: bytes) -> tuple[RecordingTransport, Any]:
    config = uvicorn.Config(app, log_level="warning", **server_settings(100, 15.0))
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    protocol.connection_made(transport)
    protocol.data_received(request)
    return transport, protocol


REQUEST = b"POST /v1/jobs HTTP/1.1\r\nhost: head\r\ncontent-length: 2\r\n\r\n{}"


def test_a_response_goes_to_the_socket_in_one_write() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-length", b"9")]})
        await send({"type": "http.response.body", "body": b'{"id": 1}'})

    async def scenario() -> list[bytes]:
        transport, _ = await _serve(app, REQUEST)
        await asyncio.wait_for(transport.wrote.wait(), WAIT_S)
        for _ in range(3):  # a few more turns: nothing else follows
            await asyncio.sleep(0)
        return transport.writes

    writes = asyncio.run(scenario())
    assert len(writes) == 1, writes  # before: the head and the body, a write (a syscall) each
    assert writes[0].startswith(b"HTTP/1.1 201 Created\r\n") and writes[0].endswith(b'\r\n\r\n{"id": 1}')


def test_a_streaming_response_gets_its_head_out_before_its_body_exists() -> None:
    more = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first line\n", "more_body": True})
        await asyncio.wait_for(more.wait(), WAIT_S)  # a log follow waiting for the job's next line
        await send({"type": "http.response.body", "body": b"next line\n", "more_body": False})

    async def scenario() -> list[bytes]:
        transport, _ = await _serve(app, REQUEST)
        await asyncio.wait_for(transport.wrote.wait(), WAIT_S)
        sent_before_more = b"".join(transport.writes)
        assert sent_before_more.startswith(b"HTTP/1.1 200 OK\r\n") and b"first line\n" in sent_before_more
        assert b"next line" not in sent_before_more
        transport.wrote.clear()
        more.set()
        await asyncio.wait_for(transport.wrote.wait(), WAIT_S)
        return transport.writes

    writes = asyncio.run(scenario())
    assert b"".join(writes).endswith(b"next line\n\r\n0\r\n\r\n")


def test_close_sends_what_was_gathered_first_and_abort_drops_it() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        inner = RecordingTransport()
        t = OneWritePerTurn(inner, loop)
        t.write(b"HTTP/1.1 408 ")
        t.writelines([b"Request ", b"Timeout\r\n\r\n"])
        assert inner.writes == [] and t.get_write_buffer_size() == len(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        t.close()
        assert inner.writes == [b"HTTP/1.1 408 Request Timeout\r\n\r\n"] and t.is_closing()

        aborted = RecordingTransport()
        aborted.abort = lambda: aborted.close()  # type: ignore[method-assign]
        t2 = OneWritePerTurn(aborted, loop)
        t2.write(b"never sent")
        t2.abort()
        await asyncio.sleep(0)  # the turn's end finds nothing to send
        assert aborted.writes == [] and aborted.closed

    asyncio.run(scenario())
