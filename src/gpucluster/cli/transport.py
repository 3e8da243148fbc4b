"""The CLI's own way to the head: the standard library's http.client, JSON back as plain dicts.

Why not `gpucluster.Client`: importing httpx and pydantic (and building a model's validator at
first use) cost ~150 ms of CPU per command, half of what `gpucluster jobs` spent, for a command
that prints what the head sent (issue 19: a read command answers within 150 ms of CPU). The SDK
stays the typed public client; the CLI's commands that only read and print what comes back use
this one. Where the head is, which token it is shown, and how a refusal or an unreachable head
reads come from `gpucluster.clientbase`, shared with the SDK, so both say the same.
"""

from __future__ import annotations

import codecs
import http.client
import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from gpucluster import userconfig
from gpucluster.clientbase import ClusterUnreachable, refusal, resolve_token, resolve_url, unreachable


class View(dict[str, Any]):
    """A JSON object whose fields also read as attributes (`job.spec.team`), as the SDK's models
    do; still a dict, so `--json` prints it as the head sent it."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _tls_context(url: str) -> Any:
    """The CA store httpx (the SDK) trusts, so a head the SDK reaches the CLI reaches too:
    $SSL_CERT_FILE, else $SSL_CERT_DIR, else certifi's bundle."""
    import ssl

    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _failure(e: BaseException, connecting: bool) -> str:
    """How the head failed to answer, named as httpx names it (the CLI's messages stay the same)."""
    if isinstance(e, TimeoutError):
        return "ConnectTimeout" if connecting else "ReadTimeout"
    if connecting:
        return "ConnectError"
    if isinstance(e, http.client.HTTPException):
        return "RemoteProtocolError"
    return "ReadError"


class Head:
    """`with Head(url) as h: h.json("GET", "/v1/jobs")`: one keep-alive connection per command."""

    def __init__(self, url: str | None = None, timeout: float = 30.0) -> None:
        config = userconfig.load()
        self.url = resolve_url(url, config)
        self.config_path = config.path
        token = resolve_token(self.url, None, config)
        self.has_token = token is not None
        self._headers = {"Accept": "application/json", "User-Agent": "gpucluster-cli"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        parts = urlsplit(self.url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._used = False

    def __enter__(self) -> Head:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self._tls:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=_tls_context(self.url)
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            raise unreachable(self.url, _failure(e, connecting=True)) from None
        return conn

    def _target(self, path: str, params: dict[str, Any] | None) -> str:
        query = {k: ("true" if v is True else "false" if v is False else v) for k, v in (params or {}).items()}
        return self._prefix + path + (f"?{urlencode(query, doseq=True)}" if query else "")

    def _send(self, method: str, path: str, params: dict[str, Any] | None, body: Any) -> http.client.HTTPResponse:
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        target = self._target(path, params)
        for retry in (True, False):
            reused = self._conn is not None and self._used
            if self._conn is None:
                self._conn = self._connect(self._timeout)
            try:
                self._conn.request(method, target, body=data, headers=headers)
                response = self._conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                self.close()
                if reused and retry:
                    continue  # the head closed an idle keep-alive connection: a new one, once
                raise unreachable(self.url, _failure(e, connecting=False)) from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise unreachable(self.url, _failure(e, connecting=False)) from None
            self._used = True
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def request(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> str:
        """The answer's text; a 4xx/5xx answer raises ApiError with the head's message."""
        response = self._send(method, path, params, body)
        try:
            text = response.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise unreachable(self.url, _failure(e, connecting=False)) from None
        if response.will_close:
            self.close()
        if response.status >= 400:
            raise refusal(response.status, text, response.reason, self.url, self.has_token, self.config_path)
        return text

    def json(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        """The answer's JSON, every object a View."""
        return json.loads(self.request(method, path, params, body), object_hook=View)

    def stream(self, path: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """The answer's text as it arrives (a followed log), with no read deadline."""
        self.close()
        self._conn, self._used = self._connect(None), False
        response = self._send("GET", path, params, None)
        if response.status >= 400:
            text = response.read().decode("utf-8", "replace")
            self.close()
            raise refusal(response.status, text, response.reason, self.url, self.has_token, self.config_path)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            while chunk := response.read1(65536):
                yield decoder.decode(chunk)
        except (OSError, http.client.HTTPException) as e:
            raise ClusterUnreachable(f"lost the head at {self.url} while following logs ({e})") from None
        finally:
            self.close()
        if tail := decoder.decode(b"", final=True):
            yield tail


def job_path(job_id: int, action: str = "") -> str:
    return f"/v1/jobs/{job_id}" + (f"/{action}" if action else "")


def node_path(node: str, action: str) -> str:
    return f"/v1/nodes/{quote(node, safe='')}/{action}"
