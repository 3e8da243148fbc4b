"""`gpucluster drain NODE` / `undrain NODE`, and how `gpucluster nodes` shows health and drains."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # the CLI passes the head's JSON as Views, with the same fields (issue 19)
    from gpucluster.models import GpuOut, Job, NodeOut


def gpu_readings(g: GpuOut | Any) -> tuple[str, str, str]:
    """UTIL, MEM USED, TEMP cells from the latest telemetry ('-' where there is none)."""
    util = f"{g.utilization:.0f}%" if g.utilization is not None else "-"
    mem = f"{g.memory_used_mb / 1024:.1f} GiB" if g.memory_used_mb is not None else "-"
    temp = f"{g.temperature_c:.0f} C" if g.temperature_c is not None else "-"
    return util, mem, temp


def node_notes(listing: list[NodeOut] | list[Any]) -> list[str]:
    """One line per drained node or unhealthy GPU: what and why."""
    lines = []
    for n in listing:
        if n.drained:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(n.drained_since)) if n.drained_since else "?"
            who = "by health checks" if n.drained_by == "health" else "by a user"
            end = getattr(n, "drained_until", None)
            until = f" until {_at(end)}" if end else ""
            lines.append(f"node {n.name} is drained {who} since {since}{until}: {n.drain_reason}")
        if n.problem:
            lines.append(f"node {n.name}: {n.problem}")
        for g in n.gpus:
            if not g.healthy and g.problem and not (n.drained and n.drain_reason and g.problem in n.drain_reason):
                lines.append(f"node {n.name} GPU {g.index} unhealthy: {g.problem}")
    return lines


def drain(
    node: Annotated[str, typer.Argument(help="the node's name, as `gpucluster nodes` shows it")],
    reason: Annotated[str | None, typer.Option("--reason", help="why; shown by `gpucluster nodes`")] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            help="when the drain ends by itself: 14:00, now+2h, 2026-11-26T08:00 (your zone); "
            "waiting jobs' estimates count from it [default: no end, until undrain]",
        ),
    ] = None,
    url: Annotated[str | None, typer.Option("--url", envvar="GPUCLUSTER_URL", help="the head's URL")] = None,
) -> None:
    """Take a node out of scheduling: no new jobs go there; its running jobs go on."""
    from gpucluster.cli.common import call as _call
    from gpucluster.cli.common import fail, out
    from gpucluster.cli.common import head as _head
    from gpucluster.cli.transport import node_path
    from gpucluster.durations import begin_time

    body: dict[str, Any] = {"reason": reason} if reason else {}
    if until is not None:
        try:
            body["until"] = begin_time(until, time.time())
        except ValueError as e:
            fail(f"--until: {e}")
    with _head(url) as h:
        n = _call(h.json, "POST", node_path(node, "drain"), None, body or None)
    end = f" until {_at(n.drained_until)}" if n.drained_until else ""
    out.print(
        f"node {n.name} drained{end}: {n.drain_reason}; running jobs go on, no new ones start there", markup=False
    )


def _at(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def undrain(
    node: Annotated[str, typer.Argument(help="the node's name")],
    url: Annotated[str | None, typer.Option("--url", envvar="GPUCLUSTER_URL", help="the head's URL")] = None,
) -> None:
    """Return a drained node to scheduling (also forgets its health problems, e.g. after a GPU reset)."""
    from gpucluster.cli.common import call as _call
    from gpucluster.cli.common import head as _head
    from gpucluster.cli.common import out
    from gpucluster.cli.transport import node_path

    with _head(url) as h:
        n = _call(h.json, "POST", node_path(node, "undrain"))
    out.print(f"node {n.name} undrained: new jobs may start there", markup=False)


def job_usage_line(job: Job | Any) -> str:
    """`show`'s line on a running job's GPUs now: utilisation and its own memory per GPU."""
    parts = []
    for u in job.gpu_usage:
        util = f"{u.utilization:.0f}%" if u.utilization is not None else "?"
        mem = f", {u.memory_mb / 1024:.1f} GiB" if u.memory_mb is not None else ""
        parts.append(f"{u.node}:{u.gpu} {util}{mem}")
    return "  gpu use:    " + "; ".join(parts)
