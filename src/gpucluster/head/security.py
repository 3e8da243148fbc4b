"""What `gpucluster up` does about security before it serves: where it may listen, TLS, the first
cluster admin and its token, and which Unix account jobs run as.

Every API call needs a token, on every address. On a non-loopback address a token sent over
plain HTTP can be read and replayed by anyone on the network, which is no authentication at all,
so the head refuses to listen there without TLS, unless told that a TLS proxy sits in front.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpucluster import userconfig
from gpucluster.auth import unix
from gpucluster.auth.control import DEFAULT_RATE_PER_S, AccessControl
from gpucluster.errors import GpuclusterError
from gpucluster.store import Store

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class SecurityOptions:
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_plain_http: bool = False  # a TLS-terminating proxy in front of a non-loopback head
    rate_limit_per_s: float = DEFAULT_RATE_PER_S  # per token; 0 turns the limit off
    admin_name: str | None = None  # the first cluster admin [default: the Unix user running the head]


class SecurityError(RuntimeError, GpuclusterError):
    """The head must not start this way; the message says what to do instead."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def check_listen(host: str, sec: SecurityOptions) -> None:
    if (sec.tls_cert is None) != (sec.tls_key is None):
        raise SecurityError("TLS needs both --tls-cert and --tls-key")
    for flag, path in (("--tls-cert", sec.tls_cert), ("--tls-key", sec.tls_key)):
        if path is not None and not path.is_file():
            raise SecurityError(f"{flag} {path}: no such file")
    if sec.tls_cert is None and not sec.allow_plain_http and not is_loopback(host):
        raise SecurityError(
            f"refusing to listen on {host} over plain HTTP: tokens would cross the network in clear text. "
            "Give --tls-cert FILE --tls-key FILE, or --allow-plain-http if a TLS proxy in front of the head "
            "terminates TLS, or listen on 127.0.0.1"
        )


def ssl_options(sec: SecurityOptions) -> dict[str, Any]:
    if sec.tls_cert is None:
        return {}
    return {"ssl_certfile": str(sec.tls_cert), "ssl_keyfile": str(sec.tls_key)}


def client_url(host: str, port: int, sec: SecurityOptions) -> str:
    """The URL a client on this machine uses: a wildcard address is reached through loopback."""
    scheme = "https" if sec.tls_cert is not None else "http"
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"{scheme}://{shown}:{port}"


def setup_access(store: Store, clock: Any, sec: SecurityOptions, url: str, say: IO[str]) -> AccessControl:
    """Access control for the head; on a fresh data dir, the first cluster admin and its token."""
    access = AccessControl(store, clock, rate_per_s=sec.rate_limit_per_s)
    me = unix.head_account()
    admin = sec.admin_name or (me if _NAME.match(me) else "admin")
    token = access.bootstrap(admin, unix_user=me if access.run_as_submitter else None)
    try:
        path = userconfig.save_head(url, token)  # this head becomes the CLI's default (`url:`)
    except (OSError, userconfig.ConfigError) as e:
        if token is not None:
            say.write(f"created cluster admin {admin!r}; could not write its token to the config file ({e}):\n")
            say.write(f"  {token}\nkeep it: it is not shown again\n")
        else:
            say.write(f"could not record {url} in the config file ({e}); point commands to it with --url\n")
    else:
        if token is not None:
            say.write(
                f"created cluster admin {admin!r}; its token is in {path} (mode 0600), "
                "so gpucluster commands on this machine just work\n"
            )
        say.write(f"gpucluster commands on this machine now go to {url} (recorded in {path})\n")
    if access.run_as_submitter:
        say.write("the head runs as root: each job runs as its submitter's Unix account\n")
    else:
        say.write(f"jobs run as {me}, the head's own user (a head started as root runs each job as its submitter)\n")
    return access
