"""`gpucluster dashboard`: print (or open) the web dashboard's address, signed in with your token."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

import typer

from gpucluster import userconfig
from gpucluster.clientbase import resolve_url
from gpucluster.dashboard.link import dashboard_url, known_token


def dashboard(
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="GPUCLUSTER_URL", help="the head's URL [default: http://127.0.0.1:8642]"),
    ] = None,
    no_token: Annotated[bool, typer.Option("--no-token", help="the plain address; the page asks for a token")] = False,
    open_it: Annotated[bool, typer.Option("--open", help="open it in a web browser too")] = False,
) -> None:
    """The web dashboard's URL; with a token known to this CLI, a signed-in link (`URL/#token=...`:
    the fragment never reaches the server; the page keeps the token and strips it)."""
    from gpucluster.cli.common import fail, out

    try:
        head = resolve_url(url, userconfig.load())
    except userconfig.ConfigError as e:
        fail(str(e))
    parts = urlsplit(head)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        fail(f"--url must be an http(s) URL such as http://127.0.0.1:8642, not {head!r}")
    token = None if no_token else known_token(head)
    link = dashboard_url(head, token)
    out.print(link, markup=False, highlight=False, soft_wrap=True)
    if open_it:
        import webbrowser  # ~5 ms of CPU, for --open only (issue 19)

        if not webbrowser.open(link):
            fail("could not open a web browser here; open the link above by hand")
