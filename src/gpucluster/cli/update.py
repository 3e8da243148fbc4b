"""`gpucluster update JOB ...`: change a queued job, a running job's time limit, or an array's throttle.

Why a thin shell: the head merges the change into the job's spec and validates it as a submit
(the same messages), checks the priority's grant and the caller's rights, and records the change
in the job's events and the audit log; here only options become a JSON body.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from gpucluster.cli.common import JsonOpt, UrlOpt, fail, out, print_json
from gpucluster.cli.common import call as _call
from gpucluster.cli.common import head as _head
from gpucluster.cli.transport import job_path

NONE = "none"  # `--begin none`, `--time-limit none`, `--gpu-type none`: back to the submit default


def update(
    job: Annotated[str, typer.Argument(help="job id; an array's id: its queued elements; 41[7]: one element")],
    priority: Annotated[
        str | None, typer.Option("--priority", help="low, normal, high or critical (above normal: a grant)")
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            help="e.g. 30m, 2h; none: no limit. A running job's limit: its owner may only shorten it, "
            "a cluster admin may set any",
        ),
    ] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", help="GPUs, a share such as 0.25, or a range 4..8")] = None,
    gpu_type: Annotated[
        str | None, typer.Option("--gpu-type", help="GPU model or a preference list A,B; none: any")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="a new name")] = None,
    begin: Annotated[
        str | None, typer.Option("--begin", help="do not start before: 22:00, now+2h, 2026-11-26T08:00; none: now")
    ] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", min=1, help="spread over exactly this many nodes")] = None,
    cpus: Annotated[float | None, typer.Option("--cpus", help="CPU cores in all")] = None,
    mem: Annotated[str | None, typer.Option("--mem", help="host memory in all, e.g. 64G")] = None,
    max_restarts: Annotated[
        int | None, typer.Option("--max-restarts", min=0, help="restart after a failure up to N times")
    ] = None,
    throttle: Annotated[
        int | None, typer.Option("--throttle", min=0, help="an array: the most elements that run at once; 0: no limit")
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a queued job (or a running job's time limit): gpucluster update 41 --priority low --time-limit 2h"""
    from gpucluster.cli.main import parse_job_ref

    job_id, index = parse_job_ref(job)
    body = _body(priority, time_limit, gpus, gpu_type, name, begin, nodes, max_restarts)
    body.update({k: v for k, v in (("cpus", cpus), ("mem", mem)) if v is not None})
    if not body and throttle is None:
        fail("nothing to change; e.g. gpucluster update 41 --priority low --time-limit 2h (see --help)")
    if throttle is not None and index is not None:
        fail(f"--throttle is an array's: give the array's id ({job_id}), not one element")
    label = f"{job_id}[{index}]" if index is not None else str(job_id)
    with _head(url) as h:
        result: Any = None
        if body:
            params = {"index": index} if index is not None else None
            result = _call(h.json, "PATCH", job_path(job_id), params, body)
        if throttle is not None:
            result = _call(h.json, "POST", job_path(job_id, "array"), None, {"throttle": throttle or None})
    if as_json:
        print_json(result)
        return
    said = [f"{k.replace('_', ' ')} {v if v is not None else NONE}" for k, v in body.items()]
    if throttle is not None:
        said.append(f"throttle {throttle or NONE}")
    out.print(f"job {label}: {', '.join(said)}", markup=False)


def _body(
    priority: str | None,
    time_limit: str | None,
    gpus: str | None,
    gpu_type: str | None,
    name: str | None,
    begin: str | None,
    nodes: int | None,
    max_restarts: int | None,
) -> dict[str, Any]:
    """The PATCH body: the options given, `none` as null; the head validates every value."""
    body: dict[str, Any] = {}
    if priority is not None:
        body["priority"] = priority
    if time_limit is not None:
        body["time_limit"] = None if time_limit.strip().lower() == NONE else time_limit
    if gpus is not None:
        body["gpus"] = gpus
    if gpu_type is not None:
        body["gpu_type"] = (
            None if gpu_type.strip().lower() == NONE else gpu_type.split(",") if "," in gpu_type else gpu_type
        )
    if name is not None:
        body["name"] = name
    if begin is not None:
        body["begin"] = None if begin.strip().lower() == NONE else _begin(begin)
    if nodes is not None:
        body["nodes"] = nodes
    if max_restarts is not None:
        body["max_restarts"] = max_restarts
    return body


def _begin(text: str) -> float:
    from gpucluster.durations import begin_time

    try:
        return begin_time(text, time.time())
    except ValueError as e:
        fail(f"--begin: {e}")
