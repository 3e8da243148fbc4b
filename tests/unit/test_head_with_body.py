"""api/connections.py `_HeadWithBody`: a sized answer's head goes out with its body, in one
write; a streamed (chunked) answer's head, a HEAD answer's and a 100 Continue go out at once.
Against uvicorn's own RequestResponseCycle, driven through its ASGI `send` as an app does."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gpucluster.api.connections import _HeadWithBody


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _cycle(method: str = "POST", keep_alive: bool = True) -> tuple[RequestResponseCycle, _Recorder]:
    raw = _Recorder()
    scope: Any = {"type": "http", "method": method, "path": "/v1/jobs", "headers": []}
    cycle = RequestResponseCycle(
        scope=scope,
        transport=raw,  # type: ignore[arg-type]
        flow=FlowControl(raw),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )
    cycle.transport = _HeadWithBody(raw, cycle)  # type: ignore[assignment]  # as GuardedHttpTools does
    return cycle, raw


def _answer(cycle: RequestResponseCycle, headers: list[tuple[bytes, bytes]], *bodies: bytes) -> None:
    async def send() -> None:
        await cycle.send({"type": "http.response.start", "status": 201, "headers": headers})
        for i, body in enumerate(bodies):
            await cycle.send({"type": "http.response.body", "body": body, "more_body": i < len(bodies) - 1})

    asyncio.run(send())


def test_a_sized_answer_is_one_write() -> None:
    cycle, raw = _cycle()
    _answer(cycle, [(b"content-length", b"9")], b'{"id": 1}')
    assert len(raw.writes) == 1
    assert raw.writes[0].startswith(b"HTTP/1.1 201 Created\r\n") and raw.writes[0].endswith(b'\r\n\r\n{"id": 1}')


def test_a_sized_answer_in_parts_sends_its_head_with_the_first() -> None:
    cycle, raw = _cycle()
    _answer(cycle, [(b"content-length", b"6")], b"abc", b"def")
    assert len(raw.writes) == 2 and raw.writes[0].endswith(b"\r\n\r\nabc") and raw.writes[1] == b"def"


def test_a_streamed_answer_sends_its_head_at_once() -> None:
    """A log follow's client must see its 200 before the job writes a line."""
    cycle, raw = _cycle()

    async def start_only() -> None:
        await cycle.send({"type": "http.response.start", "status": 200, "headers": []})

    asyncio.run(start_only())
    assert len(raw.writes) == 1 and raw.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n")


def test_a_head_request_and_an_empty_body_send_the_head_at_once() -> None:
    cycle, raw = _cycle(method="HEAD")
    _answer(cycle, [(b"content-length", b"9")], b"")
    assert len(raw.writes) == 1 and raw.writes[0].endswith(b"\r\n\r\n")
    cycle, raw = _cycle()
    _answer(cycle, [(b"content-length", b"0")], b"")
    assert raw.writes[0].endswith(b"\r\n\r\n") and b"".join(raw.writes[1:]) == b""  # uvicorn writes the b""


def test_a_held_head_is_sent_before_a_close_and_on_flush() -> None:
    """An answer cut short (the app failed after its start): the head still goes out first."""
    cycle, raw = _cycle()

    async def start_only() -> None:
        await cycle.send({"type": "http.response.start", "status": 201, "headers": [(b"content-length", b"9")]})

    asyncio.run(start_only())
    assert raw.writes == []
    cycle.transport.close()
    assert len(raw.writes) == 1 and raw.writes[0].endswith(b"\r\n\r\n") and raw.closed
