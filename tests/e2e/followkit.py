"""Raw asyncio HTTP/1.1 connections for holding many log follows open at once (tests and
bench/bench_follow.py): an httpx client per follow would cost a thread or a connection pool
each, and hundreds or thousands of them would measure the client, not the head."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

END = b"\r\n0\r\n\r\n"  # the end of a chunked body (after the last chunk's data)


@dataclass
class Stream:
    status: int
    head: bytes  # the status line and headers
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    data: bytes = b""  # what was read of the body so far, chunk framing included

    async def read_until(self, needle: bytes, timeout: float) -> bytes:
        """Read until `needle` is in the body (or it ended); the body so far."""
        async with asyncio.timeout(timeout):
            while needle not in self.data and not self.ended:
                more = await self.reader.read(65536)
                if not more:
                    break
                self.data += more
        return self.data

    async def wait_closed_by_server(self, timeout: float) -> bytes:
        """Read until the server ends the body or closes the connection; the body."""
        async with asyncio.timeout(timeout):
            while not self.ended:
                more = await self.reader.read(65536)
                if not more:
                    break
                self.data += more
        return self.data

    @property
    def ended(self) -> bool:
        return self.data.endswith(END) or self.data == b"0\r\n\r\n"

    def close(self) -> None:
        self.writer.close()


async def request(url: str, path: str, token: str | None, timeout: float = 30.0) -> Stream:
    """Send GET `path` and read the status line and headers; the body is left to read."""
    parts = urlsplit(url)
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{auth}\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return Stream(status, head, reader, writer)


async def follow(url: str, job_id: int, token: str | None, timeout: float = 30.0) -> Stream:
    return await request(url, f"/v1/jobs/{job_id}/logs?follow=true", token, timeout)
