"""What every CLI command module shares, main.py included: the consoles, the common options, and
one-line errors instead of tracebacks. Here rather than in main.py because command modules
importing main.py would be circular when it runs as `python -m gpucluster.cli.main`."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from gpucluster.cli.console import Console, escape
from gpucluster.clientbase import ApiError, ClusterUnreachable
from gpucluster.connection import Head
from gpucluster.userconfig import ConfigError

if TYPE_CHECKING:
    from gpucluster.client import Client

# rich's consoles, imported when what is printed needs rich (see cli/console.py).
out = Console()
err = Console(stderr=True)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="GPUCLUSTER_URL", help="the head's URL [default: http://127.0.0.1:8642]"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print machine-readable JSON only")]


def fail(message: str, code: int = 1) -> NoReturn:
    # The message is text, not markup: `gpucluster[ray]` or `[default: ...]` must print as written.
    err.print(f"[red]error:[/red] {escape(message)}", markup=True, highlight=False)
    raise typer.Exit(code)


def refuse_stray_option(words: list[str] | None, command_name: str) -> None:
    """Fail on a mistyped option before the command. Why: `submit`, `run` and `serve` accept
    unknown options so that the command's own (`python -u`) pass through, so without this check
    `gpucluster submit --gpuz 2 -- train.py` would queue a job whose program is `--gpuz`."""
    if words and words[0].startswith("-") and words[0] not in ("-", "--"):
        fail(f"no such option: {words[0]}; see `gpucluster {command_name} --help` (the command goes after --)")


def client(url: str | None) -> Client:
    """The SDK's typed client, for commands that use its models (admin, usage, drain)."""
    from gpucluster.client import Client

    try:
        return Client(url)
    except ConfigError as e:
        fail(str(e))


def head(url: str | None) -> Head:
    """The light client (stdlib HTTP, plain dicts) for commands that print what the head sends:
    they start without httpx and pydantic (issue 19)."""
    try:
        return Head(url)
    except ConfigError as e:
        fail(str(e))


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except (ApiError, ClusterUnreachable) as e:
        fail(str(e))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def ts(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def wait_text(job: Any) -> str:
    """Why a queued job waits, made here from the API's numbers (`wait`) with times in the
    viewer's local zone, named; the API's sentence (times in UTC) where the head sent no numbers
    (other states, an older head)."""
    wait = job.get("wait")
    if not wait:
        return str(job.get("reason") or "")
    from gpucluster.waits_text import render_stored  # only when a wait is shown: the CLI starts light

    return render_stored(wait, tz=None)


def start_window(est: float | None, low: float | None, high: float | None) -> str:
    """`2026-11-27 14:20 (13:50-15:10)`: an estimated start and its 80% interval (issue 24);
    the interval's ends carry their date only when it is not the estimate's day."""
    if not est:
        return "-"
    if low is None or high is None:
        return ts(est)
    day = time.strftime("%Y-%m-%d", time.localtime(est))

    def hm(t: float) -> str:
        same = time.strftime("%Y-%m-%d", time.localtime(t)) == day
        return time.strftime("%H:%M" if same else "%Y-%m-%d %H:%M", time.localtime(t))

    return f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(est))} ({hm(low)}-{hm(high)})"
