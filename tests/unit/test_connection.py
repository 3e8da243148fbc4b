"""The SDK's connections (gpucluster/connection.py `Connections`): one client shared by threads."""

from __future__ import annotations

import json
import select
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from gpucluster.client import Client
from gpucluster.clientbase import ApiError, ClusterUnreachable


class _Handler(BaseHTTPRequestHandler):
    """Keep-alive JSON answers: GET /v1/jobs/N is job N, anything else a 404 as the head words it."""

    protocol_version = "HTTP/1.1"
    connections: ClassVar[list[int]] = []  # one entry per TCP connection the server accepted
    posts: ClassVar[list[str]] = []  # the path of every POST taken

    def setup(self) -> None:
        super().setup()
        type(self).connections.append(1)

    def do_GET(self) -> None:
        if self.path.startswith("/v1/jobs/"):
            body, status = json.dumps({"id": int(self.path.rsplit("/", 1)[1])}).encode(), 200
        else:
            body, status = json.dumps({"error": "no such thing"}).encode(), 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        """POST /v1/jobs is taken (counted) and answered; /v1/die is taken, then the connection
        closed unanswered, as by a head killed after its commit."""
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).posts.append(self.path)
        if self.path == "/v1/die":
            self.close_connection = True
            return
        body = json.dumps({"id": len(type(self).posts)}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_one_request(self) -> None:
        super().handle_one_request()
        if self.path == "/v1/jobs/-1":  # answered as keep-alive, then closed: an idle close
            self.close_connection = True

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.connections = []
    _Handler.posts = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=30)


def test_one_client_shared_by_threads_reuses_a_connection_per_thread_at_once(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An httpx client could be shared between threads; the SDK's still can: every answer reaches
    the thread that asked, and connections are kept, at most one per thread asking at once."""
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    threads, calls = 8, 40
    wrong: list[str] = []
    with Client(server, token="gc_t") as client:

        def ask(n: int) -> None:
            for i in range(calls):
                job_id = n * 1000 + i
                got = client._request("GET", f"/v1/jobs/{job_id}").json()["id"]
                if got != job_id:
                    wrong.append(f"asked {job_id}, got {got}")

        workers = [threading.Thread(target=ask, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=120)
        assert not any(w.is_alive() for w in workers)
        assert wrong == []
        assert 1 <= len(_Handler.connections) <= threads  # kept alive and reused, never one per call
        with pytest.raises(ApiError, match="no such thing"):
            client._request("GET", "/v1/nothing")
        assert client._request("GET", "/v1/jobs/7").json() == {"id": 7}  # the refusal left it usable


def test_a_submission_is_never_sent_twice(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A POST that went out on a reused connection and got no answer is not sent again: the head
    may have committed it before it died (a job stored twice, the first never acknowledged). The
    caller gets ClusterUnreachable, as for any unanswered request; the head took it once."""
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    with Client(server, token="gc_t") as client:
        assert client._request("GET", "/v1/jobs/5").json() == {"id": 5}  # the connection is now reused
        with pytest.raises(ClusterUnreachable):
            client._request("POST", "/v1/die", json={"command": ["true"]})
        assert _Handler.posts == ["/v1/die"]


def test_an_idle_close_is_found_before_sending(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head closed a kept-alive connection while it was idle: the next request, a POST too,
    goes out once on a new connection and is answered (the close is seen before sending)."""
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    with Client(server, token="gc_t") as client:
        assert client._request("GET", "/v1/jobs/-1").json() == {"id": -1}  # answered, then closed
        (idle,) = client._connections._idle
        assert idle._sock is not None
        # wait for the server's close to reach the client's socket (readable: its end of file)
        readable, _, _ = select.select([idle._sock], [], [], 60)  # generous: a loaded machine
        assert readable
        assert client._request("POST", "/v1/jobs", json={"command": ["true"]}).json() == {"id": 1}
        assert _Handler.posts == ["/v1/jobs"] and len(_Handler.connections) == 2


def test_a_connection_idle_near_the_heads_keep_alive_is_not_sent_on(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head closes a connection idle for KEEP_ALIVE_S; a request sent as it does would cross
    its close on the wire, and a POST is not sent twice. So a connection idle for nearly that long
    is replaced before sending: the POST goes out once, on a new connection, and is answered."""
    from gpucluster import connection

    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    now = [1000.0]
    monkeypatch.setattr(connection, "_clock", lambda: now[0])
    with Client(server, token="gc_t") as client:
        assert client._request("GET", "/v1/jobs/3").json() == {"id": 3}
        now[0] += connection._REUSE_IDLE_S / 2
        assert client._request("GET", "/v1/jobs/4").json() == {"id": 4}
        assert len(_Handler.connections) == 1  # briefly idle: reused
        now[0] += connection._REUSE_IDLE_S + 0.01
        assert client._request("POST", "/v1/jobs", json={"command": ["true"]}).json() == {"id": 1}
        assert _Handler.posts == ["/v1/jobs"] and len(_Handler.connections) == 2
    assert connection._REUSE_IDLE_S < connection.KEEP_ALIVE_S
