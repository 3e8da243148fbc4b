"""Long-lived and slow requests against a real head (issue 14): log follows hold no thread, are
capped per user, end when the client goes or its token is revoked; slow or idle connections
are closed; the number of connections is capped.

Follows are raw asyncio connections (tests/e2e/followkit.py), so that hundreds cost the test
little. Every wait is for an event (a status, a byte, the end of a stream) under a generous
timeout that names what did not happen, so a regression fails one test instead of hanging.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx

from tests.e2e import followkit
from tests.e2e.headproc import HeadProcess, wait_for

FOLLOWS = 300  # what two shared cores hold in a test; bench/bench_follow.py measures 10,000
ANSWER_S = 10.0  # an API call under load: normally ~10 ms; a generous bound, not a tuned one


def _submit(head: HeadProcess, command: list[str], token: str | None = None) -> int:
    r = httpx.post(
        f"{head.url}/v1/jobs",
        json={"command": command, "gpus": 1},
        headers={"Authorization": f"Bearer {token or head.token}"},
        timeout=ANSWER_S,
    )
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _running(head: HeadProcess, job_id: int) -> None:
    wait_for(
        lambda: (
            httpx.get(f"{head.url}/v1/jobs/{job_id}", headers=head.headers, timeout=ANSWER_S).json()["state"]
            == "running"
        ),
        what=f"job {job_id} to run",
    )


def _fd_limits(pid: int) -> tuple[str, str]:
    line = next(ln for ln in Path(f"/proc/{pid}/limits").read_text().splitlines() if ln.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return soft, hard


def test_hundreds_of_quiet_follows_leave_the_api_answerable(head_factory: type[HeadProcess], tmp_path: Path) -> None:
    head = head_factory(tmp_path / "data", extra_args=("--max-follows-per-user", str(FOLLOWS))).start()
    assert head.proc is not None
    soft, hard = _fd_limits(head.proc.pid)
    assert soft == hard, "the head raises its open-files limit: every connection is a descriptor"
    gate = tmp_path / "go"
    job = _submit(head, ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done; echo released"])
    _running(head, job)

    async def scenario() -> None:
        streams: list[followkit.Stream] = []
        try:
            for start in range(0, FOLLOWS, 50):
                batch = [followkit.follow(head.url, job, head.token) for _ in range(start, min(FOLLOWS, start + 50))]
                streams += await asyncio.gather(*batch)
            assert [s.status for s in streams] == [200] * FOLLOWS
            # The API answers while every follow waits on a quiet job (before: the 40 worker
            # threads were all asleep in follows, and these timed out).
            async with httpx.AsyncClient(base_url=head.url, headers=head.headers, timeout=ANSWER_S) as c:
                began = time.monotonic()
                assert (await c.get("/v1/health")).status_code == 200
                assert (await c.get("/v1/whoami")).status_code == 200
                assert (await c.post("/v1/jobs", json={"command": ["true"], "gpus": 0.1})).status_code == 201
                assert time.monotonic() - began < ANSWER_S
            gate.touch()  # the job prints and ends: every follow gets the line, then its end
            bodies = await asyncio.gather(*(s.wait_closed_by_server(60) for s in streams))
            assert all(b"released" in b and s.ended for b, s in zip(bodies, streams, strict=True))
        finally:
            for s in streams:
                s.close()

    asyncio.run(scenario())


def test_follows_are_capped_per_user_and_freed_when_the_client_goes(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    head = head_factory(tmp_path / "data", extra_args=("--max-follows-per-user", "3")).start()
    job = _submit(head, ["sleep", "600"])
    _running(head, job)

    async def scenario() -> None:
        held = [await followkit.follow(head.url, job, head.token) for _ in range(3)]
        assert [s.status for s in held] == [200, 200, 200]
        over = await followkit.follow(head.url, job, head.token)
        body = await over.read_until(b"}", ANSWER_S)
        over.close()
        assert over.status == 429 and b"retry-after:" in over.head.lower()
        assert b"already follow 3 logs" in body
        for s in held:
            s.close()  # the clients go away without a word: the head must notice
        deadline = time.monotonic() + 15
        while True:
            again = await followkit.follow(head.url, job, head.token)
            again.close()
            if again.status == 200:
                break
            assert time.monotonic() < deadline, "closed follows were not freed within 15 s"
            await asyncio.sleep(0.2)

    asyncio.run(scenario())


def test_a_revoked_token_or_a_lost_membership_ends_the_stream(head_factory: type[HeadProcess], tmp_path: Path) -> None:
    head = head_factory(tmp_path / "data").start()
    users = {}
    for name in ("eve", "fred"):
        r = httpx.post(
            f"{head.url}/v1/admin/users", json={"name": name, "teams": ["default"]}, headers=head.headers, timeout=10
        )
        assert r.status_code == 201, r.text
        users[name] = r.json()
    job = _submit(head, ["sleep", "600"])
    _running(head, job)

    async def scenario() -> None:
        eve = await followkit.follow(head.url, job, users["eve"]["token"])
        fred = await followkit.follow(head.url, job, users["fred"]["token"])
        try:
            assert eve.status == fred.status == 200
            async with httpx.AsyncClient(base_url=head.url, headers=head.headers, timeout=ANSWER_S) as c:
                r = await c.post(f"/v1/admin/tokens/{users['eve']['token_id']}/revoke")
                assert r.status_code == 200, r.text
                r = await c.put("/v1/admin/users/fred/membership", json={"team": "default", "role": None})
                assert r.status_code == 200, r.text
            # Ended by the head (the job runs on), within a few of its 1 s checks.
            await eve.wait_closed_by_server(15)
            await fred.wait_closed_by_server(15)
            assert eve.ended and fred.ended
        finally:
            eve.close()
            fred.close()

    asyncio.run(scenario())


def test_slow_headers_are_cut_off_and_connections_are_capped(head_factory: type[HeadProcess], tmp_path: Path) -> None:
    head = head_factory(tmp_path / "data", extra_args=("--header-timeout", "2s", "--max-connections", "16")).start()
    host, port = "127.0.0.1", head.port

    # Slowloris: headers begun and never finished are answered 408 and closed.
    with socket.create_connection((host, port), timeout=15) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        began = time.monotonic()
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        assert got.startswith(b"HTTP/1.1 408") and time.monotonic() - began < 10

    # Headers without end are cut off at 64 KiB (431); a large body behind small headers is not
    # mistaken for them (it is the body's own limit that answers: 413).
    with socket.create_connection((host, port), timeout=15) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 70_000)
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        assert got.startswith(b"HTTP/1.1 431"), got[:200]
    big = httpx.post(f"{head.url}/v1/jobs", json={"command": ["x" * 1000] * 2000}, headers=head.headers)
    assert big.status_code == 413, big.text

    # Sixteen idle connections fill the cap: the next one is refused at once with 503 ...
    idle = [socket.create_connection((host, port), timeout=15) for _ in range(16)]
    try:
        with socket.create_connection((host, port), timeout=15) as s:
            got = b""
            while chunk := s.recv(4096):
                got += chunk
            assert got.startswith(b"HTTP/1.1 503") and b"16 connections" in got
    finally:
        for s in idle:
            s.close()
    # ... and once they are gone the head answers again.
    wait_for(
        lambda: httpx.get(f"{head.url}/v1/health", timeout=ANSWER_S).status_code == 200, what="health after the cap"
    )
