"""HTTP/1.1 to the head on a standard-library socket: the one connection of the CLI and the SDK.

Why not httpx: per call it spent ~0.45 ms of the caller's CPU against ~0.15 ms through the SDK
here (one client submitting jobs from Python, a reused connection; bench/bench_client.py), so a sweep
submitted from a script was bounded by its own client, and on a shared 2-core machine took that
CPU from the head (issue 18). Importing it (and pydantic) also cost the CLI ~150 ms of CPU per
command (issue 19). Where the head is, which token it is shown, and how a refusal or an
unreachable head reads come from `gpucluster.clientbase`, so both clients say the same.

`Head` is one connection (the CLI's, one per command); `Connections` keeps several for a caller
with threads (the SDK's `Client`, which may be shared between threads as an httpx one could).
"""

from __future__ import annotations

import codecs
import copy
import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

from gpucluster import userconfig
from gpucluster.clientbase import ClusterUnreachable, refusal, resolve_token, resolve_url, unreachable
from gpucluster.errors import GpuclusterError


class View(dict[str, Any]):
    """A JSON object whose fields also read as attributes (`job.spec.team`), as the SDK's models
    do; still a dict, so `--json` prints it as the head sent it. A field named like a dict method
    would read as the method: no wire model has one (tests/unit/test_cli_light.py)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _tls_context(url: str, verify: bool | str = True) -> Any:
    """How an https:// head is checked. `verify` True: $SSL_CERT_FILE, else $SSL_CERT_DIR, else
    certifi's bundle (what httpx trusted, so a head reached before is reached now); a path: that
    CA bundle; False: not checked at all (the caller's explicit choice, as with httpx)."""
    import ssl

    if verify is False:
        unchecked = ssl.create_default_context()
        unchecked.check_hostname = False
        unchecked.verify_mode = ssl.CERT_NONE
        return unchecked
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class ProtocolError(GpuclusterError):
    """The head's answer is not HTTP/1.1 as this reader knows it."""


# Requests sent again, once, when a reused connection fails after they went out: only those that
# change nothing on the head. A submission (POST) the head committed before it died unanswered
# would be stored twice (tests/e2e/test_crash_consistency.py found such jobs: in the store, never
# acknowledged); the caller gets ClusterUnreachable and decides, as for any unanswered request.
_RESENDABLE = frozenset({"GET", "HEAD"})

# How long the head keeps an idle connection open (uvicorn's timeout_keep_alive, set from here in
# api/connections.py). A client reconnects rather than send on a connection idle for nearly that
# long: the head's close and a request crossing on the wire would leave a POST unanswered, and a
# POST is not sent twice.
KEEP_ALIVE_S = 5
_REUSE_IDLE_S = KEEP_ALIVE_S - 1.5
_clock = time.monotonic  # how idle a connection is; a test moves it


class _Closed(ProtocolError):
    """The head closed the connection before answering (an idle keep-alive connection, or a crash)."""


def _failure(e: BaseException, connecting: bool) -> str:
    """How the head failed to answer, named as httpx names it (the CLI's messages stay the same)."""
    if isinstance(e, TimeoutError):
        return "ConnectTimeout" if connecting else "ReadTimeout"
    if connecting:
        return "ConnectError"
    if isinstance(e, ProtocolError):
        return "RemoteProtocolError"
    return "ReadError"


class _Response:
    """One HTTP/1.1 answer read off the connection: status, headers, then the body on demand."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        line = reader.readline(65537)
        if not line:
            raise _Closed("the head closed the connection without answering")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code, _, self.reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"not an HTTP answer: {line[:80]!r}")
        self.status = int(code)
        self.headers: dict[str, str] = {}
        while (header := reader.readline(65537)) not in (b"\r\n", b"\n"):
            if not header or len(self.headers) > 200:
                raise ProtocolError("the answer's headers end early or never")
            name, _, value = header.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()
        connection = self.headers.get("connection", "").lower()
        self.will_close = version == "HTTP/1.0" or connection == "close"
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        self._left = int(length) if length is not None and length.isdigit() else None
        if self._left is None and not self._chunked:
            self.will_close = True  # the body runs until the head closes the connection
        self._done = self.status in (204, 304) or self._left == 0

    def read1(self) -> bytes:
        """The next piece of the body, b"" at its end."""
        if self._done:
            return b""
        if self._chunked:
            size_line = self._reader.readline(1026)
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_line[:40]!r}") from None
            if size == 0:
                while self._reader.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                self._done = True
                return b""
            data: bytes = self._reader.read(size)
            self._reader.readline(3)
            if len(data) < size:
                raise ProtocolError("the connection closed inside a chunk")
            return data
        if self._left is None:
            data = self._reader.read1(65536)
            self._done = not data
            return bytes(data)
        data = self._reader.read1(min(self._left, 65536))
        if not data:
            raise ProtocolError("the connection closed before the answer's end")
        self._left -= len(data)
        self._done = self._left == 0
        return bytes(data)

    def read(self) -> bytes:
        parts = []
        while chunk := self.read1():
            parts.append(chunk)
        return b"".join(parts)


class Head:
    """`with Head(url) as h: h.json("GET", "/v1/jobs")`: one keep-alive connection.

    HTTP/1.1 over a socket, by hand: http.client imports the email package and ssl (~20 ms of
    CPU), for the dozen lines of HTTP a client speaks to its own head. ssl is imported for an
    https:// head only. `token`: else $GPUCLUSTER_TOKEN, else the config file's for that head;
    `verify`: how an https:// head's certificate is checked (`_tls_context`). Not for several
    threads at once: `Connections` is.
    """

    def __init__(
        self,
        url: str | None = None,
        timeout: float = 30.0,
        token: str | None = None,
        verify: bool | str = True,
        agent: str = "gpucluster-cli",
    ) -> None:
        config = userconfig.load()
        self.url = resolve_url(url, config)
        self.config_path = config.path
        token = resolve_token(self.url, token, config)
        self.has_token = token is not None
        self._verify = verify
        self._tls_ctx: Any = None  # built at the first https:// connection, shared by `another`
        parts = urlsplit(self.url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        default_port = parts.port is None or parts.port == (443 if self._tls else 80)
        self._headers = {
            "Host": host if default_port else f"{host}:{self._port}",
            "Accept": "application/json",
            "Accept-Encoding": "identity",
            "User-Agent": agent,
        }
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._used = False
        self._last_sent = 0.0  # _clock() of the last request sent on this connection

    def another(self) -> Head:
        """A second connection to the same head, as this one was set up (no config read)."""
        if self._tls and self._tls_ctx is None:
            self._tls_ctx = _tls_context(self.url, self._verify)  # built once, shared by both
        twin = copy.copy(self)
        twin._headers = dict(self._headers)
        twin._sock, twin._reader, twin._used = None, None, False
        return twin

    def __enter__(self) -> Head:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._reader.close()
            self._sock.close()
            self._sock, self._reader, self._used = None, None, False

    def _connect(self, timeout: float | None) -> None:
        try:
            sock = socket.create_connection((self._host, self._port), timeout=timeout)
            if self._tls:
                if self._tls_ctx is None:  # loading the CA bundle costs ~20 ms: once per client
                    self._tls_ctx = _tls_context(self.url, self._verify)
                sock = self._tls_ctx.wrap_socket(sock, server_hostname=self._host)
        except OSError as e:
            raise unreachable(self.url, _failure(e, connecting=True)) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._reader, self._used = sock, sock.makefile("rb"), False

    def _target(self, path: str, params: dict[str, Any] | None) -> str:
        query = {k: ("true" if v is True else "false" if v is False else v) for k, v in (params or {}).items()}
        return self._prefix + path + (f"?{urlencode(query, doseq=True)}" if query else "")

    def _send(
        self, method: str, path: str, params: dict[str, Any] | None, body: Any, timeout: float | None = 30.0
    ) -> _Response:
        data = b"" if body is None else json.dumps(body).encode()
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        if body is not None or method not in ("GET", "HEAD"):
            headers["Content-Length"] = str(len(data))
        head = f"{method} {self._target(path, params)} HTTP/1.1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        for retry in (True, False):
            if (
                self._sock is not None
                and self._used
                and (_clock() - self._last_sent > _REUSE_IDLE_S or self._closed_by_head())
            ):
                self.close()  # the head closed (or is about to close) this idle connection: a new one
            reused = self._sock is not None and self._used
            if self._sock is None:
                self._connect(self._timeout if timeout is not None else None)
            assert self._sock is not None
            sent = False
            try:
                self._last_sent = _clock()
                self._sock.sendall(head.encode("latin-1") + data)
                sent = True
                response = _Response(self._reader)
            except (_Closed, ConnectionResetError, BrokenPipeError) as e:
                self.close()
                if reused and retry and (not sent or method in _RESENDABLE):
                    continue  # the head closed an idle keep-alive connection under us: a new one, once
                raise unreachable(self.url, _failure(e, connecting=False)) from None
            except (OSError, ProtocolError) as e:
                self.close()
                raise unreachable(self.url, _failure(e, connecting=False)) from None
            self._used = True
            return response
        raise AssertionError("not reached")  # pragma: no cover

    def _closed_by_head(self) -> bool:
        """Whether the head has closed this idle connection (its end of file, or anything but
        an answer to a request, is waiting on it). Asked before a request is sent on a reused
        connection, so an idle close is found before sending, not by a request lost after it:
        a submission sent again there could be stored twice (the first copy committed by a
        head killed before it answered), which is why a request is sent again after it went
        out only when it changes nothing (`_RESENDABLE`)."""
        sock = self._sock
        assert sock is not None
        if self._tls and sock.pending():  # type: ignore[attr-defined]  # an SSLSocket (ssl is imported lazily)
            return True  # decrypted bytes nobody asked for: not a connection to send on
        poller = select.poll()  # not select: a process with many files has descriptors above 1,024
        try:
            poller.register(sock, select.POLLIN)
            events = poller.poll(0)
        except (OSError, ValueError):
            return True
        return bool(events)  # idle, a readable socket holds an end of file or stray bytes (or an error)

    def _body(self, response: _Response) -> str:
        try:
            text = response.read().decode("utf-8", "replace")
        except (OSError, ProtocolError) as e:
            self.close()
            raise unreachable(self.url, _failure(e, connecting=False)) from None
        if response.will_close:
            self.close()
        return text

    def request(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> str:
        """The answer's text; a 4xx/5xx answer raises ApiError with the head's message."""
        response = self._send(method, path, params, body)
        text = self._body(response)
        if response.status >= 400:
            raise refusal(response.status, text, response.reason, self.url, self.has_token, self.config_path)
        return text

    def json(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        """The answer's JSON, every object a View."""
        return json.loads(self.request(method, path, params, body), object_hook=View)

    def websocket(self, path: str, params: dict[str, Any] | None = None) -> tuple[str, dict[str, str], Any]:
        """Where a WebSocket of the head's is (ws:// or wss://), the headers that authenticate
        it, and the TLS context for a wss:// head (None for ws://)."""
        uri = f"{'wss' if self._tls else 'ws'}://{self._headers['Host']}{self._target(path, params)}"
        headers = {k: v for k, v in self._headers.items() if k in ("Authorization", "User-Agent")}
        return uri, headers, _tls_context(self.url, self._verify) if self._tls else None

    def stream(self, path: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """The answer's text as it arrives (a followed log), with no read deadline."""
        self.close()
        response = self._send("GET", path, params, None, timeout=None)
        if response.status >= 400:
            text = self._body(response)
            raise refusal(response.status, text, response.reason, self.url, self.has_token, self.config_path)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            while chunk := response.read1():
                if text := decoder.decode(chunk):
                    yield text
        except (OSError, ProtocolError) as e:
            raise ClusterUnreachable(f"lost the head at {self.url} while following logs ({e})") from None
        finally:
            self.close()
        if tail := decoder.decode(b"", final=True):
            yield tail


class Answer:
    """An answer's body: `.text`, and `.json()` as the SDK reads it (httpx's response did both)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def json(self) -> Any:
        return json.loads(self.text)


class Connections:
    """Keep-alive connections to one head for any number of threads: a request takes an idle
    connection, or opens one, and gives it back when its answer is read. A failed request's
    connection closed itself (`Head`), and opens again when next taken."""

    def __init__(self, first: Head) -> None:
        self.first = first  # what every other connection copies (url, token, TLS, timeout)
        self._idle = [first]
        self._lock = threading.Lock()

    def request(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> str:
        """The answer's text, as `Head.request`."""
        with self._lock:
            conn = self._idle.pop() if self._idle else self.first.another()
        try:
            return conn.request(method, path, params, body)
        finally:
            with self._lock:
                self._idle.append(conn)

    def stream(self, path: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """`Head.stream` on a connection of its own (it holds it for as long as it is read)."""
        return self.first.another().stream(path, params)

    def close(self) -> None:
        """Close the idle connections (each opens again if used again)."""
        with self._lock:
            for conn in self._idle:
                conn.close()
