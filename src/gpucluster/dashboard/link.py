"""The dashboard's address, optionally signed in: `URL/#token=TOKEN`.

The token rides in the URL fragment, which browsers never send to the server (so it is not in
any access log); the page moves it into its own storage and strips it from the address bar.
"""

from __future__ import annotations

from typing import IO
from urllib.parse import quote

from gpucluster import userconfig
from gpucluster.clientbase import resolve_token


def dashboard_url(head_url: str, token: str | None = None) -> str:
    base = head_url.rstrip("/") + "/"
    return f"{base}#token={quote(token, safe='')}" if token else base


def known_token(head_url: str) -> str | None:
    """The token this user's CLI would send to `head_url` ($GPUCLUSTER_TOKEN, else the config
    file's), or None; an unreadable config file counts as none."""
    try:
        config = userconfig.load()
    except userconfig.ConfigError:
        config = None
    return resolve_token(head_url, None, config)


def announce(head_url: str, say: IO[str]) -> None:
    """What `gpucluster up` prints about the dashboard: a ready-to-click signed-in link on a
    terminal (the same user's, who holds the token anyway), never into a log file."""
    token = known_token(head_url) if say.isatty() else None
    if token:
        say.write(f"dashboard: {dashboard_url(head_url, token)}  (signed in; keep this link private)\n")
    else:
        say.write(f"dashboard: {dashboard_url(head_url)}  (`gpucluster dashboard` prints a signed-in link)\n")
