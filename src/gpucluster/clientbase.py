"""What every way of talking to the head shares: where the head is, which token to show it, and
how a refusal or an unreachable head reads.

Why a module of its own: the SDK (`gpucluster.Client`, over httpx) and the CLI's own light
transport (`gpucluster.cli.http`, over the standard library, so a command starts in a blink:
issue 19) must find the same head, send the same token and word the same errors; this module
imports neither httpx nor pydantic, so both can use it.
"""

from __future__ import annotations

import json
import os

from gpucluster.errors import GpuclusterError
from gpucluster.userconfig import UserConfig

DEFAULT_URL = "http://127.0.0.1:8642"
DEFAULT_QUEUE_PAGE = 1000  # queued jobs GET /v1/queue lists when no limit= is given


class ApiError(RuntimeError, GpuclusterError):
    """The head refused a request; `message` says what was wrong and how to fix it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClusterUnreachable(RuntimeError, GpuclusterError):
    pass


def resolve_url(url: str | None = None, config: UserConfig | None = None) -> str:
    configured = config.url if config is not None else None
    return (url or os.environ.get("GPUCLUSTER_URL") or configured or DEFAULT_URL).rstrip("/")


def resolve_token(url: str, token: str | None = None, config: UserConfig | None = None) -> str | None:
    """--token, else $GPUCLUSTER_TOKEN, else the config file's token for this head (or its default)."""
    return token or os.environ.get("GPUCLUSTER_TOKEN") or (config.token_for(url) if config is not None else None)


def unreachable(url: str, kind: str) -> ClusterUnreachable:
    """The head did not answer at all; `kind` names how, in httpx's words (ConnectError,
    ReadTimeout, ...), whichever transport saw it."""
    return ClusterUnreachable(
        f"cannot reach the head at {url} ({kind}); is `gpucluster up` running? Point to it with --url or GPUCLUSTER_URL"
    )


def refusal(status: int, body: str, reason: str, url: str, has_token: bool, config_path: object) -> ApiError:
    """The ApiError for a 4xx/5xx answer: the body's `error`, else its text, else the status's
    reason; a 401 to a caller without a token says where a token goes instead."""
    try:
        parsed = json.loads(body)
        message = (parsed.get("error") if isinstance(parsed, dict) else None) or body
    except ValueError:
        message = body or reason
    if status == 401 and not has_token:
        message = (
            f"no token for {url}: pass --token, set GPUCLUSTER_TOKEN, or add it to "
            f"{config_path} (heads: {{{url}: TOKEN}})"
        )
    return ApiError(status, str(message))
