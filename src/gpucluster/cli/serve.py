"""`gpucluster serve ...` and `gpucluster services`: create, show, update and delete services.

    gpucluster serve --name clf --gpus 1 --replicas 1..4 --readiness /health -- python server.py
    gpucluster serve -f service.yaml
    gpucluster serve show NAME | serve delete NAME
    gpucluster serve update NAME [--image IMG] [--command "python new.py"] [--replicas 2..6] [-- CMD...]
    gpucluster services

`serve` takes its verb as its first word (show, delete, update) rather than as Typer
subcommands: a group cannot also take `-- COMMAND` for the create form.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from gpucluster.cli.common import JsonOpt, UrlOpt, fail, out, refuse_stray_option
from gpucluster.cli.common import call as _call
from gpucluster.cli.common import head as _head
from gpucluster.cli.common import print_json as _print_json

VERBS = ("show", "delete", "update")


def serve(
    args: Annotated[list[str] | None, typer.Argument(help="-- the command; or show|delete|update NAME")] = None,
    file: Annotated[Path | None, typer.Option("-f", "--file", help="a YAML service file; options override it")] = None,
    name: Annotated[str | None, typer.Option("--name", help="the service's name: /serve/NAME/")] = None,
    gpus: Annotated[float | None, typer.Option(help="GPUs per replica, or a share such as 0.25 [default: 1]")] = None,
    gpu_type: Annotated[str | None, typer.Option("--gpu-type", help="GPU model for the replicas")] = None,
    cpus: Annotated[float | None, typer.Option("--cpus", help="CPU cores per replica")] = None,
    mem: Annotated[str | None, typer.Option("--mem", help="host memory per replica, e.g. 16G")] = None,
    port: Annotated[
        int | None, typer.Option(help="the first port tried for replicas; each gets its own in $PORT")
    ] = None,
    replicas: Annotated[str | None, typer.Option(help="a count (2) or an autoscaled range (1..4, 0..4)")] = None,
    readiness: Annotated[str | None, typer.Option(help="GET this path; 2xx/3xx means ready [default: /]")] = None,
    startup_timeout: Annotated[
        str | None, typer.Option("--startup-timeout", help="not ready by then: replaced (or the service fails)")
    ] = None,
    target: Annotated[
        float | None, typer.Option("--target", help="requests in flight per replica the autoscaler aims at")
    ] = None,
    target_rps: Annotated[
        float | None, typer.Option("--target-rps", help="also scale on requests per second per replica")
    ] = None,
    team: Annotated[str | None, typer.Option(help="the team the replicas are accounted to")] = None,
    priority: Annotated[str | None, typer.Option(help="the replicas' priority class")] = None,
    image: Annotated[str | None, typer.Option("--image", help="run the replicas in this container image")] = None,
    command: Annotated[str | None, typer.Option("--command", help="update: the new command line")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="K=V, repeatable")] = None,
    public: Annotated[
        bool | None, typer.Option("--public/--private", help="anyone may call it, or only its team [default]")
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a service: replicas of a command behind the head's gateway at /serve/NAME/."""
    words = list(args or [])
    refuse_stray_option(words, "serve")
    if words and words[0] in VERBS and name is None and file is None:
        verb, rest = words[0], words[1:]
        if not rest:
            fail(f"serve {verb}: name the service, e.g. gpucluster serve {verb} clf")
        target_name, flags, cmd = rest[0], _verb_flags(rest[1:]), []
        if "--" in flags:
            cmd = flags.pop("--")
        command = flags.get("--command", command)
        image = flags.get("--image", image)
        replicas = flags.get("--replicas", replicas)
        url = flags.get("--url", url)
        as_json = as_json or "--json" in flags
        env = [*(env or []), *flags.get("--env", [])]
        if "--public" in flags or "--private" in flags:
            public = "--public" in flags
        if verb == "show":
            _show(target_name, url, as_json)
        elif verb == "delete":
            with _head(url) as h:
                _call(h.json, "DELETE", _path(target_name))
            out.print(f"deleting service {target_name}: its replicas are being stopped")
        else:
            change: dict[str, Any] = {}
            if command is not None:
                change["command"] = shlex.split(command)
            elif cmd:
                change["command"] = cmd
            if image is not None:
                change["image"] = image
            if env:
                change["env"] = _env(env)
            if replicas is not None:
                change["min_replicas"], change["max_replicas"] = _replicas(replicas)
            if public is not None:
                change["public"] = public
            if not change:
                fail("serve update: give --command, --image, --env, --replicas or --public/--private")
            with _head(url) as h:
                svc = _call(h.json, "POST", _path(target_name) + "/update", None, change)
            if as_json:
                _print_json(svc)
            else:
                rolls = any(k in change for k in ("command", "image", "env"))
                then = ", its replicas replaced one by one" if rolls else ""
                out.print(f"service {svc.name} updated: revision {svc.revision}{then}")
        return
    fields: dict[str, Any] = {}
    if file is not None:
        fields = _read_file(file)
    if words:
        fields["command"] = words
    options = {
        "name": name,
        "gpus": gpus,
        "gpu_type": gpu_type,
        "cpus": cpus,
        "mem": mem,
        "port": port,
        "readiness": readiness,
        "target_concurrency": target,
        "target_rps": target_rps,
        "team": team,
        "priority": priority,
        "image": image,
        "public": public,
    }
    fields.update({k: v for k, v in options.items() if v is not None})
    if replicas is not None:
        fields["replicas"] = replicas
    if "replicas" in fields:
        fields["min_replicas"], fields["max_replicas"] = _replicas(str(fields.pop("replicas")))
    if startup_timeout is not None:
        fields["startup_timeout_s"] = startup_timeout
    if isinstance(fields.get("startup_timeout_s"), str):
        from gpucluster.durations import parse_duration

        try:
            fields["startup_timeout_s"] = parse_duration(fields["startup_timeout_s"])
        except ValueError as e:
            fail(f"--startup-timeout: {e}")
    if env:
        fields["env"] = {**dict(fields.get("env") or {}), **_env(env)}
    if "name" not in fields:
        fail("no name given: --name NAME (the service is reached at /serve/NAME/)")
    if "command" not in fields:
        fail("no command given; put it after --, e.g. gpucluster serve --name clf -- python server.py")
    fields.setdefault("workdir", os.getcwd())
    from gpucluster.launch.env import exported_env

    exported = exported_env(os.environ, "ALL")
    if exported is not None:
        fields["exported_env"] = exported
    with _head(url) as h:
        svc = _call(h.json, "POST", "/v1/services", None, fields)
    if as_json:
        _print_json(svc)
    else:
        out.print(f"service {svc.name} created: {h.url.rstrip('/')}/serve/{svc.name}/")


def services(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """List services: replicas ready / wanted, requests per second, latency."""
    from gpucluster.cli.console import Table

    with _head(url) as h:
        listing = _call(h.json, "GET", "/v1/services").services
    if as_json:
        _print_json(listing)
        return
    table = Table("NAME", "TEAM", "STATE", "READY", "WANTED", "REQ/S", "P50", "P99", "GPU-H", "COST", "REV")
    for s in listing:
        ready = sum(1 for r in s.replicas if r.phase == "ready")
        table.add_row(
            s.name,
            s.team,
            s.state if not s.reason else f"{s.state}: {s.reason}",
            str(ready),
            str(s.desired_replicas),
            f"{s.stats.requests_per_s:.1f}",
            _ms(s.stats.latency_p50_s),
            _ms(s.stats.latency_p99_s),
            f"{s.usage.gpu_hours:.2f}",
            f"{s.usage.cost:.2f}",
            str(s.revision),
        )
    out.print(table)


def _show(name: str, url: str | None, as_json: bool) -> None:
    with _head(url) as h:
        s = _call(h.json, "GET", _path(name))
    if as_json:
        _print_json(s)
        return
    out.print(f"service {s.name} ({s.team}, by {s.owner or '-'}): {s.state}{': ' + s.reason if s.reason else ''}")
    out.print(f"  at {h.url.rstrip('/')}{s.url_path}  ({'public' if s.spec.public else 'team only'})")
    out.print(f"  command: {shlex.join(s.spec.command)}")
    out.print(
        f"  replicas {s.spec.min_replicas}..{s.spec.max_replicas}, wanted {s.desired_replicas}, "
        f"target {s.spec.target_concurrency:g} in flight each, revision {s.revision}"
    )
    st = s.stats
    out.print(
        f"  requests {st.requests} ({st.errors} failed), {st.requests_per_s:.1f}/s, "
        f"p50 {_ms(st.latency_p50_s)}, p99 {_ms(st.latency_p99_s)}"
    )
    used = s.usage
    out.print(
        f"  used {used.gpu_hours:.2f} GPU-hours, cost {used.cost:.2f}, {used.energy_kwh:.3f} kWh (all replicas so far)"
    )
    for r in s.replicas:
        where = f"job {r.job_id}, port {r.port}, rev {r.revision}"
        out.print(f"  replica {r.id}: {where}, {r.phase}, {r.in_flight} in flight")


_VALUE_FLAGS = ("--command", "--image", "--replicas", "--url", "--env")
_BOOL_FLAGS = ("--json", "--public", "--private")


def _verb_flags(words: list[str]) -> dict[str, Any]:
    """`serve update NAME ...`'s options (click stops parsing at the verb): --flag VALUE or
    --flag=VALUE; `--env` repeatable; what follows `--` is a new command."""
    found: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            found["--"] = words[i + 1 :]
            break
        flag, eq, value = w.partition("=")
        if flag in _BOOL_FLAGS and not eq:
            found[flag] = True
        elif flag in _VALUE_FLAGS:
            if not eq:
                if i + 1 >= len(words):
                    fail(f"{flag} needs a value")
                value = words[i + 1]
                i += 1
            if flag == "--env":
                found.setdefault("--env", []).append(value)
            else:
                found[flag] = value
        else:
            fail(f"serve: unknown option {w!r} here; see gpucluster serve --help")
        i += 1
    return found


def _path(name: str) -> str:
    return f"/v1/services/{quote(name, safe='')}"


def _ms(v: float | None) -> str:
    return f"{v * 1000:.1f} ms" if v is not None else "-"


def _env(items: list[str]) -> dict[str, str]:
    out_env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--env {item!r}: write it as KEY=VALUE")
        out_env[key] = value
    return out_env


def _replicas(text: str) -> tuple[int, int]:
    from gpucluster.services.spec import parse_replicas

    try:
        return parse_replicas(text)
    except ValueError as e:
        fail(str(e))


def _read_file(path: Path) -> dict[str, Any]:
    from gpucluster.yamlfile import YamlFileError, read_yaml

    try:
        data, _ = read_yaml(path, "service file")
    except YamlFileError as e:
        fail(str(e))
    if not isinstance(data, dict):
        fail(f"{path}: a service file is a mapping of fields (name, command, gpus, replicas, ...)")
    if isinstance(data.get("command"), str):
        data["command"] = shlex.split(data["command"])
    if "replicas" in data:
        data["replicas"] = str(data["replicas"])
    return data
