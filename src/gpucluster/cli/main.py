"""`gpucluster`: start the cluster, submit and watch jobs. A thin shell over `gpucluster.Client`.

Every error a user can cause prints one message (no traceback) and exits non-zero; every read
command takes --json and then prints JSON only.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucluster.cli import fastparams
from gpucluster.cli.common import JsonOpt, UrlOpt, err, fail, out, refuse_stray_option, start_window, wait_text
from gpucluster.cli.common import call as _call
from gpucluster.cli.common import client as _client
from gpucluster.cli.common import head as _head
from gpucluster.cli.common import print_json as _print_json
from gpucluster.cli.common import ts as _ts
from gpucluster.cli.console import Table, escape
from gpucluster.cli.transport import job_path
from gpucluster.clientbase import DEFAULT_QUEUE_PAGE, ApiError, ClusterUnreachable
from gpucluster.connection import Head, View
from gpucluster.durations import begin_time, format_duration
from gpucluster.labels import gpu_types, gpus_label
from gpucluster.launch.env import exported_env
from gpucluster.ranklogs import LinePrefixer
from gpucluster.sizes import parse_bytes

if TYPE_CHECKING:  # the SDK's types, for --all-ranks only (the CLI starts without them)
    from gpucluster.client import Client
    from gpucluster.models import Job

fastparams.install()  # Typer's coercion without pydantic for plain str/int options (issue 19)

app = typer.Typer(
    help="gpucluster: a GPU cluster. Start it with `gpucluster up`, then submit jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


# Options of every command, given before or after the subcommand (main() moves them before it).
GLOBAL_VALUE_OPTIONS = ("--token", "--url")


@app.callback()
def _global(
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="your token (default: $GPUCLUSTER_TOKEN, else the config file's token for the head; "
            "see `gpucluster whoami`)",
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="the head's URL (default: $GPUCLUSTER_URL, else the config file's url:, which `gpucluster up` "
            "records, else http://127.0.0.1:8642)",
        ),
    ] = None,
) -> None:
    """gpucluster: a GPU cluster. Start it with `gpucluster up`, then submit jobs."""
    if token is not None:
        os.environ["GPUCLUSTER_TOKEN"] = token  # where Client looks; jobs never inherit it
    if url is not None:
        os.environ["GPUCLUSTER_URL"] = url  # where each command's --url and Client look


# The commands below read the head's JSON as Views (plain dicts whose fields read as attributes),
# not the SDK's models: a command starts without httpx and pydantic (issue 19).


def _gpus(job: View) -> str:
    return "; ".join(f"{s.node}:{','.join(map(str, s.gpu_indices)) or 'no GPU'}" for s in job.allocation) or "-"


def _gpus_label(spec: View) -> str:
    return gpus_label(spec.gpus, spec.min_gpus, spec.gpu_memory)


def _gpu_count(job: View) -> str:
    """GPUs asked for; an elastic job's range, with the size it runs at."""
    if job.spec.min_gpus is not None and job.allocation:
        return f"{sum(len(s.gpu_indices) for s in job.allocation)} of {_gpus_label(job.spec)}"
    return _gpus_label(job.spec)


def _mode(job: View) -> str:
    s = job.spec
    if s.per_gpu:
        return "one process per GPU (--per-gpu)"
    if s.launcher:
        return f"one {s.launcher} launcher per node"
    return "one process"


# ---- up ------------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """'100MiB' / '64KiB' / '1GiB' / a number of bytes -> bytes (binary units: logs are files)."""
    return parse_bytes(text, 1, "100MiB, 64KiB or 1GiB")


@app.command()
def up(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=1, max=65535)] = 8642,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="where state and logs live [default: ~/.local/share/gpucluster; as root /var/lib/gpucluster]",
        ),
    ] = None,
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            envvar="GPUCLUSTER_DATABASE_URL",
            help="keep the state in PostgreSQL: postgresql://USER@HOST:PORT/DB (needs the extra "
            "gpucluster[postgres]); a URL with a password only through $GPUCLUSTER_DATABASE_URL or "
            "--database-file, never in argv [default: SQLite in the data dir]",
        ),
    ] = None,
    database_file: Annotated[
        Path | None,
        typer.Option("--database-file", help="read the PostgreSQL URL from this file (mode 0600, yours)"),
    ] = None,
    virtual_gpus: Annotated[
        int | None,
        typer.Option(
            "--virtual-gpus",
            min=0,
            max=1024,
            help="declare N virtual GPUs instead of discovering real ones (0: a node without GPUs, for CPU-only "
            "jobs; give --cpus/--memory)",
        ),
    ] = None,
    gpu_type: Annotated[
        str | None, typer.Option("--gpu-type", help="model name of the virtual GPUs, e.g. H100-80GB")
    ] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option("--gpu-memory", help="memory of each virtual GPU, e.g. 80GiB [default: from --gpu-type]"),
    ] = None,
    node_cpus: Annotated[
        float | None,
        typer.Option(
            "--cpus",
            help="CPU cores jobs here may ask for in all (--cpus of submit) [default: this machine's, "
            "from its CPU affinity and cgroup quota]",
        ),
    ] = None,
    node_memory: Annotated[
        str | None,
        typer.Option(
            "--memory",
            help="host memory jobs here may ask for in all, e.g. 256G (--mem of submit) [default: this "
            "machine's MemTotal or cgroup limit, less a reserve]",
        ),
    ] = None,
    grace_period: Annotated[
        str | None,
        typer.Option(
            "--grace-period", help="time between SIGTERM and SIGKILL when stopping a job [default: the policy's, 30s]"
        ),
    ] = None,
    policy: Annotated[
        Path | None,
        typer.Option("--policy", help="scheduling policy YAML (teams, quotas, preemption); reloaded when it changes"),
    ] = None,
    node_name: Annotated[str | None, typer.Option("--node-name", help="this node's name [default: hostname]")] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="a label of this node that jobs select it by (submit --constraint): a flag such as ib or "
            "KEY=VALUE such as rack=r1 (repeatable)",
        ),
    ] = None,
    restart_backoff: Annotated[
        str | None,
        typer.Option(
            "--restart-backoff",
            help="wait before a failed job's first restart; doubles with each restart, at most 5m [default: 1s]",
        ),
    ] = None,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="check mode: compare the head's event-fed cluster state with the database before each plan "
            "(slower; a difference fails the cycle and is logged)",
        ),
    ] = False,
    gpus_per_domain: Annotated[
        int | None,
        typer.Option(
            "--gpus-per-domain", min=1, help="virtual GPUs: declare NVLink/PCIe domains of this many consecutive GPUs"
        ),
    ] = None,
    tls_cert: Annotated[Path | None, typer.Option("--tls-cert", help="serve HTTPS with this certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="the certificate's private key (PEM)")] = None,
    allow_plain_http: Annotated[
        bool,
        typer.Option(
            "--allow-plain-http", help="listen on a non-loopback address without TLS (a TLS proxy is in front)"
        ),
    ] = False,
    rate_limit: Annotated[
        float,
        typer.Option(
            "--rate-limit",
            min=0,
            help="API requests per second per token, bursts of twice that; 0: no limit "
            "(cluster admins are never limited)",
        ),
    ] = 100.0,
    telemetry_interval: Annotated[
        str,
        typer.Option("--telemetry-interval", help="how often GPUs are sampled (NVML, or synthetic for virtual GPUs)"),
    ] = "5s",
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="run jobs on the nodes of this Ray cluster (HOST:PORT of its head, or 'auto') instead of this "
            "machine; needs pip install 'gpucluster[ray]'",
        ),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price",
            help="MODEL=PRICE: money per GPU-hour of a GPU model, for accounting (repeatable; a policy file's "
            "prices: override it)",
        ),
    ] = None,
    on_shutdown: Annotated[
        str,
        typer.Option(
            "--on-shutdown",
            help="what SIGTERM/Ctrl-C to the head does to running jobs: keep (they run on, the next head "
            "adopts them) or stop (SIGTERM, grace period, SIGKILL, then requeued)",
        ),
    ] = "keep",
    max_log_size: Annotated[
        str,
        typer.Option(
            "--max-log-size",
            help="cap on each job process's log (per attempt, per rank); past it the oldest output is rotated "
            "away, keeping the newest; 0: no cap",
        ),
    ] = "1GiB",
    lease: Annotated[
        str,
        typer.Option(
            "--lease",
            help="how long the head's lease on the database lasts unrenewed (renewed every third of it): a "
            "second head takes over a dead head's database after at most this",
        ),
    ] = "15s",
    public_team_usage: Annotated[
        bool,
        typer.Option(
            "--public-team-usage",
            help="show each team's GPU-hours, cost and energy in /metrics without a token (a scraper on a "
            "trusted network); otherwise only a cluster admin's token sees them",
        ),
    ] = False,
    max_follows: Annotated[
        int,
        typer.Option("--max-follows-per-user", min=1, max=100_000, help="log follows one user may hold open at once"),
    ] = 100,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections",
            min=16,
            max=1_000_000,
            help="HTTP connections held at once (open log follows count); past it new ones get 503 "
            "[lowered to fit the open-files limit]",
        ),
    ] = 16_384,
    header_timeout: Annotated[
        str,
        typer.Option(
            "--header-timeout", help="close a connection whose request headers are not all in after this long"
        ),
    ] = "15s",
    container_config: Annotated[
        Path | None,
        typer.Option(
            "--container-config",
            help="a directory with containers.conf, storage.conf and/or registries.conf for the podman of "
            "container jobs (--image) [default: the system's]",
        ),
    ] = None,
    image_cache_size: Annotated[
        str,
        typer.Option(
            "--image-cache-size",
            help="past this size of the node's image store, remove the images of the cluster's jobs used "
            "least recently (never one in use; 0: never remove)",
        ),
    ] = "100GiB",
    gateway_port: Annotated[
        int | None,
        typer.Option(
            "--gateway-port",
            min=1,
            max=65535,
            help="also serve the services' gateway on this port of --host, at /NAME/... (nothing else: "
            "no API, no dashboard), so it can be opened to callers the API is not [default: only "
            "/serve/NAME/ on --port]",
        ),
    ] = None,
) -> None:
    """Start the head (HTTP API) and a local worker on this machine, or use a Ray cluster's nodes; runs until Ctrl-C."""
    import socket

    from gpucluster.durations import parse_duration
    from gpucluster.head.database_url import DatabaseUrlError
    from gpucluster.head.database_url import resolve as resolve_database_url
    from gpucluster.head.security import SecurityOptions
    from gpucluster.head.server import StartupError, UpOptions, default_data_dir, run_up
    from gpucluster.models import check_node_labels, parse_memory_mb
    from gpucluster.store.lease import MAX_LEASE_S, MIN_LEASE_S

    try:
        grace = parse_duration(grace_period) if grace_period is not None else None
        backoff = parse_duration(restart_backoff) if restart_backoff is not None else None
        mem = parse_memory_mb(gpu_memory) if gpu_memory else None
        host_mem = parse_memory_mb(node_memory) if node_memory else None
        sample_every = parse_duration(telemetry_interval)
        lease_s = parse_duration(lease)
    except ValueError as e:
        fail(str(e))
    if not MIN_LEASE_S <= lease_s <= MAX_LEASE_S:
        fail(f"--lease must be between {MIN_LEASE_S:.0f}s and {MAX_LEASE_S / 60:.0f}m, not {lease}")
    try:
        headers_within = parse_duration(header_timeout)
    except ValueError as e:
        fail(str(e))
    if not 0.5 <= headers_within <= 600:
        fail(f"--header-timeout must be between 0.5s and 10m, not {header_timeout}")
    if gateway_port is not None and gateway_port == port:
        fail(f"--gateway-port must differ from --port ({port}): the gateway port serves services only")
    if on_shutdown not in ("keep", "stop"):
        fail(f"--on-shutdown must be keep or stop, not {on_shutdown!r}")
    try:
        log_cap = parse_size(max_log_size)
    except ValueError as e:
        fail(f"--max-log-size: {e}")
    if 0 < log_cap < 4096:
        fail(f"--max-log-size must be at least 4KiB (or 0 for no cap), not {max_log_size}")
    try:
        image_cap = parse_size(image_cache_size)
    except ValueError as e:
        fail(f"--image-cache-size: {e}")
    if not 0.1 <= sample_every <= 3600:
        fail(f"--telemetry-interval must be between 0.1s and 1h, not {telemetry_interval}")
    if gpu_type is not None and not gpu_type.strip():
        fail("--gpu-type must not be empty")
    if node_cpus is not None and not 0.01 <= node_cpus <= 1_048_576:
        fail(f"--cpus must be between 0.01 and 1048576, not {node_cpus:g}")
    try:
        prices = parse_prices(price or [])
    except ValueError as e:
        fail(str(e))
    try:
        node_labels = check_node_labels(label or [])
    except ValueError as e:
        fail(f"--label: {e}")
    if ray is not None:
        local = {"--virtual-gpus": virtual_gpus, "--gpu-type": gpu_type, "--gpu-memory": gpu_memory,
                 "--gpus-per-domain": gpus_per_domain, "--node-name": node_name,
                 "--label": label or None, "--cpus": node_cpus, "--memory": node_memory}  # fmt: skip
        given = [k for k, v in local.items() if v is not None]
        if given:
            fail(
                f"--ray takes its nodes and GPUs from Ray; drop {', '.join(given)} "
                "(declare GPUs, CPUs, memory and labels with ray start --resources/--num-cpus/--memory/--labels)"
            )
        if not ray.strip():
            fail("--ray needs an address: HOST:PORT of the Ray head, or auto")
    try:
        database_url = resolve_database_url(database, database_file, os.environ)
    except DatabaseUrlError as e:
        fail(str(e))
    opts = UpOptions(
        host=host,
        port=port,
        data_dir=data_dir or default_data_dir(),
        virtual_gpus=virtual_gpus,
        gpu_type=gpu_type,
        gpu_memory_mb=mem,
        grace_period_s=grace,
        node_name=node_name or socket.gethostname(),
        policy_path=policy,
        restart_backoff_s=backoff,
        debug=debug,
        gpus_per_domain=gpus_per_domain,
        node_labels=tuple(node_labels),
        node_cpus=node_cpus,
        node_memory_mb=host_mem,
        telemetry_interval_s=sample_every,
        ray_address=ray,
        prices=prices,
        on_shutdown=on_shutdown,
        max_log_bytes=log_cap,
        database_url=database_url,
        lease_s=lease_s,
        public_team_usage=public_team_usage,
        max_follows_per_user=max_follows,
        max_connections=max_connections,
        header_timeout_s=headers_within,
        container_config=container_config,
        image_cache_bytes=image_cap,
        gateway_port=gateway_port,
        security=SecurityOptions(
            tls_cert=tls_cert, tls_key=tls_key, allow_plain_http=allow_plain_http, rate_limit_per_s=rate_limit
        ),
    )
    try:
        run_up(opts)
    except StartupError as e:
        fail(str(e))


# ---- submit --------------------------------------------------------------------------------


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def submit(
    command: Annotated[list[str] | None, typer.Argument(help="the program and its arguments, after --")] = None,
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="a YAML job file; options given here override it")
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="GPUs the job needs, a share of one GPU such as 0.25, or an elastic range such as 4..8 "
            "(started on as many as are free, at least 4), or 0 for a CPU-only job (give --cpus and/or --mem) "
            "[default: 1]"
        ),
    ] = None,
    gpu_type: Annotated[
        str | None,
        typer.Option("--gpu-type", help="GPU model, e.g. H100-80GB, or a preference list: H100-80GB,A100-80GB"),
    ] = None,
    gpu_memory: Annotated[str | None, typer.Option("--gpu-memory", help="share one GPU by memory, e.g. 10GiB")] = None,
    min_gpu_memory: Annotated[
        str | None, typer.Option("--min-gpu-memory", help="only GPUs with at least this much memory, e.g. 40GiB")
    ] = None,
    nodes: Annotated[
        int | None, typer.Option(help="spread the GPUs evenly over exactly this many nodes", min=1)
    ] = None,
    cpus: Annotated[
        float | None,
        typer.Option("--cpus", help="CPU cores in all, split like the GPUs [default: the policy's cpus_per_gpu]"),
    ] = None,
    mem: Annotated[
        str | None,
        typer.Option("--mem", help="host memory in all, e.g. 64G or 512M [default: the policy's mem_per_gpu]"),
    ] = None,
    nodelist: Annotated[str | None, typer.Option("--nodelist", help="run only on these nodes: NODE[,NODE...]")] = None,
    exclude: Annotated[str | None, typer.Option("--exclude", help="never run on these nodes: NODE[,NODE...]")] = None,
    constraint: Annotated[
        str | None,
        typer.Option(
            "--constraint",
            help="node labels its nodes must have: ib, rack=r1; A&B all of, A|B any of (see gpucluster nodes)",
        ),
    ] = None,
    exclusive: Annotated[
        bool, typer.Option("--exclusive", help="its nodes run no other job while it runs (it waits for idle nodes)")
    ] = False,
    name: Annotated[str | None, typer.Option(help="a name for the job")] = None,
    team: Annotated[str | None, typer.Option(help="the team the job is accounted to")] = None,
    priority: Annotated[str | None, typer.Option(help="low, normal, high or critical (above normal: a grant)")] = None,
    time_limit: Annotated[str | None, typer.Option("--time-limit", help="e.g. 30m, 2h, 1d")] = None,
    begin: Annotated[
        str | None,
        typer.Option("--begin", help="do not start before: 22:00, now+2h, +30m or 2026-11-26T08:00 (your zone)"),
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="K=V, repeatable")] = None,
    export: Annotated[
        str,
        typer.Option(
            "--export",
            help="your environment for the job, as sbatch: ALL (less what the cluster sets), NONE, or VAR,VAR,...",
        ),
    ] = "ALL",
    workdir: Annotated[str | None, typer.Option(help="working directory [default: the current one]")] = None,
    shell: Annotated[bool, typer.Option("--shell", help="run the command line through /bin/sh -c")] = False,
    per_gpu: Annotated[
        bool,
        typer.Option(
            "--per-gpu", help="one process per GPU with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...)"
        ),
    ] = False,
    launcher: Annotated[
        str | None,
        typer.Option("--launcher", help="one launcher per node instead: torchrun (--nnodes/--node-rank filled in)"),
    ] = None,
    max_restarts: Annotated[
        int | None,
        typer.Option("--max-restarts", min=0, help="restart after a failure up to N times, with backoff [default: 0]"),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option("--max-cost", help="stop the job before its cost (all attempts) would exceed this much money"),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            help="run in this container image (podman on the node): NAME[:TAG], HOST/NAME[:TAG], or a local "
            "archive ./env.tar (docker-archive:/oci-archive:)",
        ),
    ] = None,
    mount: Annotated[
        list[str] | None,
        typer.Option(
            "--mount", help="with --image: SRC:DST[:ro] bind mount, repeatable (SRC under the policy's roots)"
        ),
    ] = None,
    hold: Annotated[bool, typer.Option("--hold", help="submit held: it starts only after gpucluster release")] = False,
    after: Annotated[str | None, typer.Option("--after", help="start once these jobs started: ID[,ID...]")] = None,
    afterok: Annotated[
        str | None, typer.Option("--afterok", help="start once these jobs (or arrays) succeeded: ID[,ID...]")
    ] = None,
    afternotok: Annotated[
        str | None, typer.Option("--afternotok", help="start once these jobs failed or were cancelled")
    ] = None,
    afterany: Annotated[str | None, typer.Option("--afterany", help="start once these jobs ended, however")] = None,
    aftercorr: Annotated[
        int | None, typer.Option("--aftercorr", help="an array: element i waits for element i of this array")
    ] = None,
    array: Annotated[
        str | None, typer.Option("--array", help="submit an array: 0-199, 0-99:2 or 1,5,7, with %N: N at once")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="allow an array or sweep of more than 100,000 elements")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="say where and when it would start; queue nothing, write nothing")
    ] = False,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job and print its id at once: gpucluster submit --gpus 2 -- python train.py"""
    fields: dict[str, Any] = {}
    source = None
    if file is not None:
        from gpucluster.jobfile import JobFileError, read_job_file  # with -f only: it loads PyYAML (issue 18)

        try:
            fields = read_job_file(file)
        except JobFileError as e:
            fail(str(e))
        source = file
    refuse_stray_option(command, "submit")
    if command:
        fields["command"] = [" ".join(command)] if shell else list(command)
    overrides = {
        "gpus": gpus,
        "gpu_type": (gpu_type.split(",") if "," in gpu_type else gpu_type) if gpu_type else None,
        "gpu_memory": gpu_memory,
        "min_gpu_memory": min_gpu_memory,
        "nodes": nodes,
        "cpus": cpus,
        "mem": mem,
        "nodelist": nodelist,
        "exclude": exclude,
        "constraint": constraint,
        "exclusive": True if exclusive else None,
        "name": name,
        "team": team,
        "priority": priority,
        "time_limit": time_limit,
        "begin": begin,
        "launcher": launcher,
        "max_restarts": max_restarts,
        "max_cost": max_cost,
        "image": image,
        "mounts": list(mount) if mount else None,
        "after": _id_list("--after", after),
        "afterok": _id_list("--afterok", afterok),
        "afternotok": _id_list("--afternotok", afternotok),
        "afterany": _id_list("--afterany", afterany),
        "aftercorr": aftercorr,
        "array": array,
        "hold": True if hold else None,
        "allow_large_array": True if yes else None,
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(fields.get("image"), str):
        from gpucluster.containers import local_image  # only for a container job: the CLI starts light

        fields["image"] = local_image(fields["image"], source.parent if source is not None else Path.cwd())
    if shell:
        fields["shell"] = True
    if per_gpu:
        fields["per_gpu"] = True
    if env:
        merged = dict(fields.get("env") or {})
        for item in env:
            key, sep, value = item.partition("=")
            if not sep:
                fail(f"--env {item!r}: write it as KEY=VALUE")
            merged[key] = value
        fields["env"] = merged
    if "command" not in fields:
        fail("no command given; put it after --, e.g. gpucluster submit --gpus 1 -- python train.py")
    if isinstance(fields.get("begin"), str | date):  # the option, or a job file's `begin: 22:00`
        try:
            fields["begin"] = begin_time(fields["begin"], time.time())
        except ValueError as e:
            fail(f"--begin: {e}")
    try:
        exported = exported_env(os.environ, export)  # sbatch --export=ALL: PATH, a venv, PYTHONPATH...
    except ValueError as e:
        fail(str(e))
    if exported is not None:
        fields["exported_env"] = exported
    wd = workdir or fields.get("workdir") or os.getcwd()
    fields["workdir"] = str(Path(wd).expanduser().absolute()) if wd else None
    node = fields.pop("__node__", None)
    if dry_run:
        with _head(url) as h:
            body = _validated(fields, node, source).model_dump(mode="json", exclude_none=True)
            answer = _call(
                h.json,
                "POST",
                "/v1/jobs/dry-run",
                body={k: v for k, v in body.items() if k != "team" or "team" in fields},
            )
        if as_json:
            _print_json(answer)
        else:
            out.print(dry_run_line(answer), markup=False)
        return
    with _head(url) as h:
        try:
            json.dumps(fields, allow_nan=False)
        except (TypeError, ValueError):  # a YAML date or .nan: pydantic says which field, and how
            body = _validated(fields, node, source).model_dump(mode="json", exclude_none=True)
            job = _call(
                h.json, "POST", "/v1/jobs", body={k: v for k, v in body.items() if k != "team" or "team" in fields}
            )
        else:
            try:
                job = h.json("POST", "/v1/jobs", body=fields)
            except (ApiError, ClusterUnreachable) as e:
                _validated(fields, node, source)  # a spec the head refuses is named with its file and line
                fail(str(e))
    if as_json:
        _print_json(job)
    elif job.array_id is not None:
        count = sum((job.array_counts or {}).values())
        out.print(f"submitted array {job.array_id} ({job.name}): {count} elements {job.state}", markup=False)
    else:
        held = " (held)" if job.held else ""
        out.print(f"submitted job {job.id} ({job.name}): {job.state}{held}", markup=False)


WHAT_IF_FIELDS = {"gpus": "gpus", "gpu-type": "gpu_type", "priority": "priority", "time-limit": "time_limit"}


def _what_if(job_id: int, items: list[str], url: str | None, as_json: bool) -> None:
    """`why JOB --what-if gpus=4`: the job's start were it changed so, beside its own."""
    from gpucluster.durations import format_duration

    body: dict[str, Any] = {}
    for item in items:
        for part in item.split(","):
            key, sep, value = part.partition("=")
            field = WHAT_IF_FIELDS.get(key.strip().replace("_", "-"))
            if not sep or field is None or not value.strip():
                fail(f"--what-if {part!r}: write KEY=VALUE with KEY one of {', '.join(WHAT_IF_FIELDS)}, e.g. gpus=4")
            body[field] = value.strip()
    with _head(url) as h:
        answer = _call(h.json, "POST", f"{job_path(job_id)}/what-if", body=body)
    if as_json:
        _print_json(answer)
        return
    said = ", ".join(f"{k}={v}" for k, v in body.items())
    line = f"with {said}: " + dry_run_line(answer).replace(" (dry run: nothing queued)", "")
    now_at, then_at = answer.get("current_start"), answer.get("estimated_start")
    if answer.starts_now:
        then_at = time.time()
    if now_at is not None and then_at is not None:
        delta = now_at - then_at
        line += f"; as it is: ~{_ts(now_at)}, so ~{format_duration(abs(delta))} {'earlier' if delta >= 0 else 'later'}"
    out.print(line + " (nothing changed)", markup=False)


def dry_run_line(answer: Any) -> str:
    """`submit --dry-run`'s answer in one line: where it would start now, or when and why not."""
    run = f"; {answer.expected_run.sentence}" if answer.get("expected_run") else ""
    if answer.starts_now:
        where = ", ".join(f"{s.node} GPUs {','.join(map(str, s.gpu_indices))}" for s in answer.allocation)
        return f"would start now on {where}{run} (dry run: nothing queued)"
    if answer.get("estimated_start") is None:
        return f"would wait: {wait_text(answer)}; no estimate{run} (dry run: nothing queued)"
    when = start_window(answer.estimated_start, answer.get("start_low"), answer.get("start_high"))
    return f"would start ~{when}; until then: {wait_text(answer)}{run} (dry run: nothing queued)"


def _id_list(option: str, text: str | None) -> list[int] | None:
    """`41,42` -> [41, 42]; one line of error for anything else."""
    if text is None:
        return None
    try:
        ids = [int(p) for p in text.replace(":", ",").split(",") if p.strip()]
    except ValueError:
        fail(f"{option} {text!r}: give job ids separated by commas, e.g. {option} 41,42")
    if not ids or any(i < 1 for i in ids):
        fail(f"{option} {text!r}: give job ids separated by commas, e.g. {option} 41,42")
    return ids


def parse_job_ref(text: str) -> tuple[int, int | None]:
    """`41` -> (41, None): a job, or every element of array 41; `41[7]` -> (41, 7): element 7."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:\[\s*(\d+)\s*\])?\s*", text)
    if m is None or int(m.group(1)) < 1:
        fail(f"{text!r} is not a job id; write 41, or 41[7] for element 7 of array 41")
    return int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None


def _validated(fields: dict[str, Any], node: Any, source: Path | None) -> Any:
    """The JobSpec the fields make, or exit 1 with the message the CLI always gave for them.

    Why only after the head refused: the head validates with the same model, so a valid spec
    costs no local validation, and the CLI starts without pydantic (issue 19); a refused one
    gets the same words it got when the CLI validated first (`job.yaml:3: gpus: ...`), and an
    invalid one the same words whether or not the head is up.
    """
    from gpucluster.jobfile import JobFileError, spec_from_fields

    try:
        return spec_from_fields({**fields, "__node__": node}, source)
    except JobFileError as e:
        fail(str(e))


# ---- reading -------------------------------------------------------------------------------


@app.command()
def jobs(
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="queued, running, preempted, succeeded, failed or cancelled; repeatable"),
    ] = None,
    team: Annotated[str | None, typer.Option(help="only this team's jobs")] = None,
    limit: Annotated[int | None, typer.Option(help="the newest N jobs", min=1)] = None,
    expand: Annotated[bool, typer.Option("--expand", help="list every element of arrays")] = False,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, oldest first; an array is one line with its elements counted by state."""
    params: dict[str, Any] = {k: v for k, v in (("state", state), ("team", team), ("limit", limit)) if v}
    if not expand:
        params["collapse"] = "true"
    with _head(url) as h:
        listing = _call(h.json, "GET", "/v1/jobs", params).jobs
    if as_json:
        _print_json(listing)
        return
    table = Table("ID", "NAME", "TEAM", "STATE", "GPUS", "PRIO", "SUBMITTED", "WHERE / WHY", box=None)
    for j in listing:
        where = _gpus(j) if j.state == "running" else wait_text(j)
        ident, shown = str(j.id), j.state
        if j.array_counts:
            ident = f"{j.id}[]"
            shown = " ".join(f"{n} {s}" for s, n in sorted(j.array_counts.items()))
            where = f"array of {sum(j.array_counts.values())}"
        elif j.array_id is not None:
            ident = f"{j.array_id}[{j.array_index}]"
        if j.held and j.state == "queued" and not j.array_counts:
            shown = "queued (held)"
        table.add_row(
            ident,
            j.name + (" (session)" if j.get("kind") == "session" else ""),
            j.spec.team,
            shown,
            _gpu_count(j),
            j.spec.priority,
            _ts(j.submitted_at),
            where,
        )
    out.print(table)


@app.command()
def show(job_id: Annotated[int, typer.Argument(help="job id")], url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """A job's spec, state, history of state changes, allocation and exit code."""
    with _head(url) as h:
        job = _call(h.json, "GET", job_path(job_id))
    if as_json:
        _print_json(job)
        return
    s = job.spec
    restarts = f"   restarts: {job.restarts} of {s.max_restarts}" if s.max_restarts else ""
    lines = [
        f"job {job.id} ({job.name})",
        f"  state:      {job.state} — {wait_text(job)}",
        f"  command:    {' '.join(s.command) if not s.shell else s.command[0] + '   (shell)'}",
        *(
            [f"  kind:       interactive session (gpucluster attach {job.id}; its log is the transcript)"]
            if job.get("kind") == "session"
            else []
        ),
        f"  gpus:       {_gpus_label(s)}{' x ' + ' or '.join(gpu_types(s.gpu_type)) if s.gpu_type else ''}"
        f"   ({_mode(job)})",
        f"  team:       {s.team}   priority: {s.priority}",
        f"  time limit: {format_duration(float(s.time_limit)) if s.time_limit else 'none'}"
        + (f"   begin: {_ts(s.begin)}" if s.begin else ""),
        *([f"  run time:   {job.expected_run.sentence}"] if job.get("expected_run") else []),
        f"  workdir:    {s.workdir or '-'}",
        f"  allocation: {_gpus(job)}",
        f"  attempt:    {job.attempt}{restarts}",
        f"  exit code:  {job.exit_code if job.exit_code is not None else '-'}",
        f"  submitted:  {_ts(job.submitted_at)}   started: {_ts(job.started_at)}   ended: {_ts(job.ended_at)}",
    ]
    if getattr(s, "image", None):
        mounts = "".join(f"   -v {m}" for m in (getattr(s, "mounts", None) or []))
        lines.insert(7, f"  image:      {s.image}{mounts}")
    if job.array_id is not None:
        whole = f"; the array: {_counts(job.array_counts)}" if job.array_counts else ""
        lines.insert(
            1, f"  array:      {job.array_id}, element {job.array_index} ({job.array_id}[{job.array_index}]){whole}"
        )
    if job.held and job.state == "queued":
        lines.insert(2, "  held:       yes (gpucluster release to let it start)")
    p = job.progress
    if p is not None:
        step = f"step {p.step}" if p.step is not None else "no step reported"
        heard = f" (reported {_ago(p.reported_at)} ago)" if p.reported_at else ""
        ckpt = (
            f"last checkpoint {_ts(p.checkpoint_at)}"
            + (f" at step {p.checkpoint_step}" if p.checkpoint_step is not None else "")
            + (f", {_ago(p.checkpoint_at)} ago" if job.state == "running" else "")
            if p.checkpoint_at
            else "no checkpoint yet"
        )
        lines.append(f"  progress:   {step}{heard}; {ckpt}")
    if job.gpu_usage:
        from gpucluster.cli.drain import job_usage_line

        lines.append(job_usage_line(job))
    lines += [f"  flagged:    {f.flag} since {_ts(f.since)}: {f.message}" for f in job.flags]
    if job.attempts:
        lines.append("  attempts:")
        for a in job.attempts:
            lost = f"   work lost {a.work_lost_s:.1f}s" if a.work_lost_s is not None else ""
            shown = ",".join("-" if c is None else str(c) for c in a.exit_codes)
            codes = f"   exit codes {shown}" if a.exit_codes else ""
            used = f"   CPU {a.cpu_s:.1f}s" if a.cpu_s is not None else ""
            used += f", peak memory {a.memory_peak_bytes / 2**20:.0f} MiB" if a.memory_peak_bytes is not None else ""
            used += f"   image pull {pull:.1f}s" if (pull := getattr(a, "pull_s", None)) is not None else ""
            lines.append(
                f"    #{a.attempt}  {_ts(a.started_at)} .. {_ts(a.ended_at) if a.ended_at else 'running':<19}  "
                f"{a.gpus:g} GPUs  {a.outcome:<11} {a.reason}{codes}{lost}{used}"
            )
    if job.metrics:
        lines.append("  metrics:    (newest value of each, per attempt; gpucluster.train.report)")
        for attempt in sorted({m.attempt for m in job.metrics}):
            newest = [
                f"{m.name} {m.reported[-1]:.4g}" + (f" at step {m.steps[-1]}" if m.steps[-1] is not None else "")
                for m in job.metrics
                if m.attempt == attempt
            ]
            lines.append(f"    #{attempt}  " + ", ".join(newest))
    lines.append("  history:")
    lines += [f"    {_ts(e.at)}  {e.state:<10} {e.reason}" for e in job.events]
    out.print("\n".join(lines), markup=False)


@app.command()
def logs(
    job_id: Annotated[int, typer.Argument(help="job id")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing as the log grows, until the job ends")
    ] = False,
    attempt: Annotated[int | None, typer.Option(help="an earlier attempt's log [default: the latest]", min=1)] = None,
    rank: Annotated[
        int | None,
        typer.Option(help="a distributed job's process: rank R (--per-gpu) or node R's launcher [default: 0]", min=0),
    ] = None,
    all_ranks: Annotated[
        bool, typer.Option("--all-ranks", help="every rank's output, each line prefixed [rank N] (torchrun's --tee)")
    ] = False,
    url: UrlOpt = None,
) -> None:
    """Print a job's output (stdout and stderr); of rank 0 for a distributed job, unless --rank."""
    if all_ranks and rank is not None:
        fail("--all-ranks and --rank: give one of them")
    if all_ranks:
        with _client(url) as c:  # the SDK: every rank's log, or one follow per rank on threads
            if follow:
                _follow_all_ranks(c, url, job_id, attempt)
            else:
                sys.stdout.write(_call(c.logs, job_id, attempt=attempt, all_ranks=True))
        return
    params = {k: v for k, v in (("attempt", attempt), ("rank", rank)) if v is not None}
    with _head(url) as h:
        if follow:
            try:
                for chunk in h.stream(job_path(job_id, "logs"), {"follow": True, **params}):
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
            except (ApiError, ClusterUnreachable) as e:
                fail(str(e))
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
        else:
            sys.stdout.write(_call(h.request, "GET", job_path(job_id, "logs"), {"offset": 0, **params}))


def _follow_all_ranks(c: Client, url: str | None, job_id: int, attempt: int | None) -> None:
    """One follow per rank, on threads of their own, printing whole lines as they come, each
    prefixed `[rank N] `, until every rank's stream ends (the attempt ended) or Ctrl-C."""
    job = _call(c.job, job_id)
    ranks = _rank_count(job)
    lock = threading.Lock()
    errors: list[str] = []

    def follow_one(rank: int) -> None:
        lines = LinePrefixer(f"[rank {rank}] ")
        try:
            with _client(url) as mine:
                for chunk in mine.follow_logs(job_id, attempt, rank if job.spec.distributed else None):
                    if text := lines.feed(chunk):
                        with lock:
                            sys.stdout.write(text)
                            sys.stdout.flush()
        except (ApiError, ClusterUnreachable) as e:
            errors.append(str(e))
        with lock:
            sys.stdout.write(lines.flush())
            sys.stdout.flush()

    threads = [threading.Thread(target=follow_one, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)  # short joins, so Ctrl-C is seen at once
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if errors:
        fail(errors[0])


def _rank_count(job: Job) -> int:
    """How many processes the job's latest attempt runs: one per GPU (--per-gpu), one launcher
    per node (--launcher), else one."""
    if not job.spec.distributed or not job.allocation:
        return 1
    if job.spec.per_gpu:
        return sum(len(s.gpu_indices) for s in job.allocation)
    return len(job.allocation)


StateOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--state",
        help="only the jobs (an array's elements) in this state: queued (held or not), held, running, preempted; "
        "repeatable",
    ),
]


def parse_states(states: list[str] | None) -> list[str]:
    """`--state queued --state held` (or `--state queued,held`) -> the filter, checked."""
    from gpucluster.core.arrays import ELEMENT_STATES  # here: only these commands pay for the import

    out = [s.strip().lower() for text in states or [] for s in text.split(",") if s.strip()]
    for s in out:
        if s not in ELEMENT_STATES:
            fail(f"--state {s!r}: give one of {', '.join(ELEMENT_STATES)}")
    return out


@app.command()
def cancel(
    job_ids: Annotated[list[str], typer.Argument(help="job id(s); an array's id: all its elements; 41[7]: one")],
    state: StateOpt = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel jobs: queued ones at once, running ones with SIGTERM, then SIGKILL after the grace period.
    `gpucluster cancel 41 --state queued` cancels only array 41's queued elements."""
    _for_each_job(
        [parse_job_ref(j) for j in job_ids],
        url,
        as_json,
        "cancel",
        lambda job: (
            "array: " + _counts(job.array_counts)
            if job.array_counts
            else ("cancelled" if job.state == "cancelled" else "stopping (SIGTERM sent)")
        ),
        parse_states(state),
    )


@app.command()
def hold(
    job_ids: Annotated[list[str], typer.Argument(help="job id(s); an array's id: all its elements; 41[7]: one")],
    state: StateOpt = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Hold queued jobs: they are never started until released."""
    _for_each_job(
        [parse_job_ref(j) for j in job_ids],
        url,
        as_json,
        "hold",
        lambda r: f"held {_id_count(r.count, r.changed)}",
        parse_states(state),
    )


@app.command()
def release(
    job_ids: Annotated[list[str], typer.Argument(help="job id(s); an array's id: all its elements; 41[7]: one")],
    state: StateOpt = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release held jobs: they wait for GPUs (and their dependencies) again."""
    _for_each_job(
        [parse_job_ref(j) for j in job_ids],
        url,
        as_json,
        "release",
        lambda r: f"released {_id_count(r.count, r.changed)}",
        parse_states(state),
    )


from gpucluster.cli.update import update  # noqa: E402  (queued jobs, running limits, throttles)

app.command()(update)


def _counts(counts: dict[str, int] | None) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted((counts or {}).items()))


def _id_count(count: int, ids: list[int]) -> str:
    return f"job {ids[0]}" if count == 1 and len(ids) == 1 else f"{count} job{'s' if count != 1 else ''}"


def _for_each_job(
    job_ids: list[int] | list[tuple[int, int | None]],
    url: str | None,
    as_json: bool,
    action: str,
    says: Callable[[View], str],
    states: list[str] | None = None,
) -> None:
    """POST `action` to each job (or array, or `(array, index)` element), with a state filter
    if given: a refused job is reported and the rest still go; exit 1 if any was refused; an
    unreachable head stops at once."""
    results = []
    failed = False
    with _head(url) as h:
        for ref in job_ids:
            job_id, index = ref if isinstance(ref, tuple) else (ref, None)
            label = f"{job_id}[{index}]" if index is not None else str(job_id)
            try:
                query = ([f"index={index}"] if index is not None else []) + [f"state={s}" for s in states or []]
                path = job_path(job_id, action) + ("?" + "&".join(query) if query else "")
                job = h.json("POST", path)
            except ApiError as e:
                failed = True
                err.print(f"[red]error:[/red] {e}")
                continue
            except ClusterUnreachable as e:
                fail(str(e))
            results.append(job)
            if not as_json:
                out.print(f"job {label}: {says(job)}", markup=False)
    if as_json:
        _print_json(results)
    if failed:
        raise typer.Exit(1)


@app.command()
def requeue(
    job_ids: Annotated[
        list[str], typer.Argument(help="job id(s); an array's id: its running elements; 41[7]: one element")
    ],
    state: StateOpt = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Checkpoint and requeue running jobs: SIGTERM, the grace period, then back in the queue with
    the same id; each restarts later as a new attempt (from its checkpoint, if it wrote one)."""
    _for_each_job(
        [parse_job_ref(j) for j in job_ids],
        url,
        as_json,
        "requeue",
        lambda job: (
            "array: " + _counts(job.array_counts) + " (running elements requeueing)"
            if job.array_counts
            else "requeueing (SIGTERM sent; back in the queue once it exits)"
        ),
        parse_states(state),
    )


@app.command()
def nodes(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Nodes and their GPUs: model, memory, which job holds each, live readings, health, drains and labels."""
    with _head(url) as h:
        listing = _call(h.json, "GET", "/v1/nodes").nodes
    if as_json:
        _print_json(listing)
        return
    from gpucluster.cli.drain import gpu_readings, node_notes

    table = Table("NODE", "GPU", "MODEL", "MEMORY", "DOMAIN", "STATE", "JOB", "UTIL", "MEM USED", "TEMP", box=None)
    for n in listing:
        for g in n.gpus:
            state = "used" if g.job_id is not None else "free"
            if not n.up:
                state = "down"
            elif not g.healthy:
                state = "unhealthy"
            elif n.drained and g.job_id is None:
                state = "drained"
            table.add_row(
                n.name + (" (virtual)" if n.virtual else ""),
                str(g.index),
                g.model,
                f"{g.memory_mb // 1024} GiB",
                g.domain or "-",
                state,
                str(g.job_id) if g.job_id is not None else "-",
                *gpu_readings(g),
            )
    out.print(table)
    for n in listing:
        cpus, memory = getattr(n, "cpus", None), getattr(n, "memory_mb", None)  # None: not accounted
        if cpus is not None or memory is not None:
            parts = []
            if cpus is not None:
                parts.append(f"CPUs {getattr(n, 'cpus_used', 0) or 0:g}/{cpus:g} used")
            if memory is not None:
                parts.append(f"memory {(getattr(n, 'memory_used_mb', 0) or 0) / 1024:.1f}/{memory / 1024:.1f} GiB used")
            out.print(f"{n.name} {', '.join(parts)}", markup=False)
    for n in listing:
        labels = getattr(n, "labels", None)  # a head from before node labels has none
        if labels:
            out.print(f"{n.name} labels: {', '.join(labels)}", markup=False)
    for line in node_notes(listing):
        out.print(line, markup=False)
    for n in listing:
        if not n.up:
            out.print(f"{n.name} is down since {_ts(n.down_since)}: {n.down_reason}", markup=False)


# ---- scheduling --------------------------------------------------------------------------


@app.command()
def queue(
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help=f"show at most this many, from the front [default: {DEFAULT_QUEUE_PAGE}]"),
    ] = None,
) -> None:
    """Queued jobs in scheduling order: position, why each waits, and its estimated start."""
    with _head(url) as h:
        page = _call(h.json, "GET", "/v1/queue", {"limit": limit} if limit is not None else None)
        default_limit = _default_limit(h) if page.entries else ""
    entries = page.entries
    if as_json:
        _print_json(entries)
        return
    table = Table("POS", "ID", "NAME", "TEAM", "PRIO", "GPUS", "WAITING", "EST. START", "WHY", box=None)
    for e in entries:
        j = e.job
        table.add_row(
            str(e.position),
            str(j.id),
            j.name,
            j.spec.team,
            j.spec.priority,
            _gpus_label(j.spec),
            _ago(j.submitted_at),
            start_window(j.estimated_start, j.get("start_low"), j.get("start_high")),
            wait_text(j),
        )
    out.print(table)
    if any(e.job.estimated_start for e in entries):
        interval = "; (from-to): 80% likely between" if any(e.job.get("start_low") for e in entries) else ""
        out.print(f"EST. START: {assumption(default_limit)}{interval}", markup=False)
    if page.total > len(entries):
        out.print(f"... and {page.total - len(entries)} more queued; see them with --limit {page.total}", markup=False)


@app.command()
def why(
    job_id: Annotated[int, typer.Argument(help="job id")],
    what_if: Annotated[
        list[str] | None,
        typer.Option(
            "--what-if",
            help="when it would start changed so: gpus=4, gpu-type=A100-80GB, priority=high, time-limit=2h "
            "(repeatable; nothing is changed)",
        ),
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Why a job waits (or what happened to it), and when it is expected to start."""
    if what_if:
        _what_if(job_id, what_if, url, as_json)
        return
    with _head(url) as h:
        job = _call(h.json, "GET", job_path(job_id))
        position, default_limit = None, ""
        if job.state == "queued":
            position = next((e.position for e in _call(h.json, "GET", "/v1/queue", {"job": job_id}).entries), None)
            if job.estimated_start:
                default_limit = _default_limit(h)
    if as_json:
        _print_json(
            {
                "id": job.id,
                "state": job.state,
                "wait_reason": job.wait_reason,
                "reason": job.reason,
                "wait": job.get("wait"),
                "estimated_start": job.estimated_start,
                "start_low": job.get("start_low"),
                "start_high": job.get("start_high"),
                "position": position,
            }
        )
        return
    if job.state != "queued":
        out.print(f"job {job.id} is {job.state}: {job.reason}", markup=False)
        return
    lines = [
        f"job {job.id} is queued, position {position or '?'} in line",
        f"  why:   [{job.wait_reason or 'pending'}] {wait_text(job)}",
    ]
    if job.estimated_start:
        lines.append(f"  start: about {_ts(job.estimated_start)} ({assumption(default_limit)})")
        low, high = job.get("start_low"), job.get("start_high")
        if low is not None and high is not None:
            lines.append(f"         80% likely between {_ts(low)} and {_ts(high)}")
        if job.get("expected_run"):
            lines.append(f"  run:   {job.expected_run.sentence}")
    else:
        lines.append("  start: no estimate yet")
    out.print("\n".join(lines), markup=False)


def _default_limit(h: Head) -> str:
    """The policy's default time limit, which start estimates assume for jobs without one."""
    return format_duration(_call(h.json, "GET", "/v1/policy").default_time_limit_s)


def assumption(default_limit: str) -> str:
    """What every start estimate assumes, said next to it: an estimate of "about 1 hour" for a
    job that started 26 s later read as a promise, when it only assumed the default time limit.
    Run times learned from finished jobs (issue 24) replace the limit where history exists."""
    return (
        "assuming jobs run as long as similar finished jobs did, else their whole time limit,"
        f" the default {default_limit} where none is set"
    )


def _ago(t: float) -> str:
    from gpucluster.durations import format_duration

    return format_duration(max(time.time() - t, 0))


policy_app = typer.Typer(
    help="Scheduling policies: check a file, show the one in force.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(policy_app, name="policy")


@policy_app.command("check")
def policy_check(file: Annotated[Path, typer.Argument(help="policy YAML file")]) -> None:
    """Validate a policy file; errors name the line and field. Needs no running head."""
    from gpucluster.policyfile import PolicyFileError, load_policy

    try:
        p = load_policy(file)
    except PolicyFileError as e:
        fail(str(e))
    out.print(
        f"{file}: ok — {len(p.teams)} team(s), preemption {'on' if p.preemption.enabled else 'off'}, "
        f"fair share {'on' if p.fair_share else 'off'}, backfill {'on' if p.backfill else 'off'}, "
        f"order in a team's line: {p.ordering.mode}",
        markup=False,
    )


def _ordering_line(order: dict[str, Any], starvation_age_s: float | None) -> str:
    """`policy show`'s line for the order inside a team's line: what `las` (the default) does,
    in the words of the policy file, so an admin sees why a newer job went first."""
    aged = f"; starvation age {format_duration(starvation_age_s)}" if starvation_age_s else ""
    if order.get("mode") != "las":
        return f"order in a team's line: {order.get('mode')} (oldest first){aged}"
    queues = ", ".join(format_duration(q) for q in order.get("queues_gpu_s") or [])
    promote = order.get("promote_after_s")
    parts = [
        f"order in a team's line: las (least GPU-time first; queues at {queues} of GPU-time",
        f"promoted after {format_duration(promote)} waiting" if promote is not None else "never promoted",
    ]
    if order.get("runtime_model") == "gittins":
        learned, every = "by learned run times inside a queue", order.get("relearn_every_s")
        if every is not None:  # (a head before `relearn_every` says nothing of it)
            learned += f", relearned every {format_duration(every)}" if every else ", relearned at every plan"
        parts.append(learned)
    if order.get("preempt"):
        parts.append(f"stops checkpointed jobs of a later queue after {format_duration(order.get('min_slice_s') or 0)}")
    return "; ".join(parts) + ")" + aged


def _limit_lines(limits: dict[str, Any]) -> list[str]:
    """`limits:` as `policy show` prints it: one line per set that limits anything."""

    def words(x: dict[str, Any]) -> str:
        gpus, queued, hours = (x.get(k) for k in ("max_running_gpus", "max_queued_jobs", "max_gpu_hours_in_flight"))
        parts = [
            *([f"{gpus:g} running GPUs"] if gpus is not None else []),
            *([f"{queued} queued jobs"] if queued is not None else []),
            *([f"{hours:g} GPU-hours in flight"] if hours is not None else []),
        ]
        return ", ".join(parts)

    sets = [
        ("every user (limits.per_user)", limits.get("per_user") or {}),
        *((f"user {name} (limits.users.{name})", x) for name, x in (limits.get("users") or {}).items()),
        *((f"each user's {c} jobs (limits.per_class.{c})", x) for c, x in (limits.get("per_class") or {}).items()),
    ]
    return [f"limits: {who}: at most {w}" for who, x in sets if (w := words(x))]


@policy_app.command("show")
def policy_show(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """The policy in force: teams with their share, quota, usage and running GPUs."""
    with _head(url) as h:
        p = _call(h.json, "GET", "/v1/policy")
    if as_json:
        _print_json(p)
        return
    out.print(f"policy: {p.source}" + (f"\n[red]last reload failed:[/red] {p.error}" if p.error else ""))
    out.print(
        f"preemption {'on' if p.preemption else 'off'} (grace {format_duration(p.grace_period_s)}, "
        f"min runtime {format_duration(p.min_runtime_s)}); fair share {'on' if p.fair_share else 'off'} "
        f"(half-life {format_duration(p.half_life_s)}); backfill {'on' if p.backfill else 'off'}",
        markup=False,
    )
    order = p.get("ordering")
    if order:  # a head from before it said its ordering: nothing
        out.print(_ordering_line(order, p.get("starvation_age_s")), markup=False)
    if p.priority_grants:
        granted = "; ".join(f"{c}: {g.holders}" for c, g in p.priority_grants.items())
        out.print(f"priority grants (low, normal: every member): {granted}", markup=False)
    for line in _limit_lines(p.get("limits") or {}):
        out.print(line, markup=False)
    per_gpu_cpus, per_gpu_mem = getattr(p, "cpus_per_gpu", 0) or 0, getattr(p, "mem_per_gpu_mb", 0) or 0
    if per_gpu_cpus or per_gpu_mem:  # a head from before resources: says none
        out.print(
            f"a job without --cpus/--mem gets per GPU: {per_gpu_cpus:g} CPU(s), {per_gpu_mem / 1024:g} GiB of memory",
            markup=False,
        )
    for pool in getattr(p, "pools", None) or ():  # a head from before pools lists none
        which = ", ".join([*pool.nodes, *(f"label {x}" for x in pool.labels)])
        who = f"teams {', '.join(pool.teams)}" if pool.teams is not None else "every team"
        classes = f"classes {', '.join(pool.classes)}" if pool.classes is not None else "every class"
        quotas = getattr(pool, "quotas", None) or {}
        capped = "; quotas " + ", ".join(f"{t} {g:g} GPUs" for t, g in sorted(quotas.items())) if quotas else ""
        out.print(f"pool {pool.name}: {which}; for {who}, {classes}{capped}", markup=False)
    table = Table("TEAM", "ORG", "WEIGHT", "SHARE", "QUOTA", "USAGE (GPU-h, decayed)", "RUNNING GPUS", box=None)
    for t in p.teams:
        quota = ", ".join(f"{m}: {n:g}" for m, n in t.quota.items()) or "-"
        table.add_row(
            t.name,
            t.org or "-",
            f"{t.weight:g}",
            f"{t.share:.1%}",
            quota,
            "-" if t.usage_gpu_hours is None else f"{t.usage_gpu_hours:.2f}",  # another team's: not shown
            "-" if t.running_gpus is None else f"{t.running_gpus:g}",
        )
    out.print(table)


# ---- simulate (issue 5) --------------------------------------------------------------------

from gpucluster.cli.simulate import simulate  # noqa: E402

app.command()(simulate)

# ---- telemetry and health (issue 7) -------------------------------------------------------

from gpucluster.cli.drain import drain, undrain  # noqa: E402

app.command()(drain)
app.command()(undrain)

# ---- identity and access (issue 8) ---------------------------------------------------------

from gpucluster.cli.admin import admin_app, whoami  # noqa: E402

app.add_typer(admin_app, name="admin")
app.command()(whoami)

# ---- web dashboard (issue 7) ----------------------------------------------------------------

from gpucluster.cli.dashboard import dashboard  # noqa: E402

app.command()(dashboard)

# ---- accounting (issue 7) -------------------------------------------------------------------

from gpucluster.cli.usage import budgets, parse_prices, usage  # noqa: E402

app.command()(usage)
app.command()(budgets)

# ---- interactive sessions (issue 21) --------------------------------------------------------

from gpucluster.cli.session import attach, forward, notebook, run  # noqa: E402

app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})(run)
app.command()(attach)
app.command()(forward)
app.command()(notebook)


# ---- services (issue 23) --------------------------------------------------------------------

from gpucluster.cli.serve import serve, services  # noqa: E402

app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})(serve)
app.command()(services)


def _invoked(args: list[str]) -> str | None:
    """The subcommand named in `args`, skipping the global options before it; None for none."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in GLOBAL_VALUE_OPTIONS:
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            return a
    return None


def _keep_only(name: str | None) -> None:
    """Register only the invoked subcommand with Typer before it builds the click group.

    Why: Typer turns every command's signature into click parameters at each start (~60 ms of
    CPU for ~50 commands), though one runs. An unknown name or none (top-level --help) keeps
    them all, so click's own "No such command" and the full listing still appear.
    """
    if name is None:
        _listing_only(app)
        return
    commands = [c for c in app.registered_commands if _command_name(c) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if commands or groups:
        app.registered_commands[:] = commands
        app.registered_groups[:] = groups


def _listing_only(group: typer.Typer) -> None:
    """No subcommand runs (`gpucluster --help`, or a mistyped global option): each command is
    listed by its name and the first line of its docstring, so Typer gets a parameterless stand-in
    with both instead of building every parameter of ~50 commands (~40 ms of CPU, issue 19)."""
    for info in group.registered_commands:
        callback = info.callback
        if callback is None:
            continue

        def listed() -> None:  # never runs: no subcommand was named
            raise AssertionError("a listing stand-in ran")

        listed.__name__, listed.__doc__ = callback.__name__, callback.__doc__
        info.callback = listed
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _listing_only(sub.typer_instance)


def _command_name(info: Any) -> str:
    return str(info.name or info.callback.__name__).lower().replace("_", "-")


def hoist_global_options(args: list[str]) -> list[str]:
    """Move `--token X` / `--url X` given after the subcommand to before it.

    Why: click takes a group's options only before the subcommand, so `gpucluster jobs --token X`
    was refused while `gpucluster --token X jobs` worked (and the reverse for --url). A command's
    own arguments are never touched: nothing after `--`, nor after `submit`'s first command word.
    Commands that take --url themselves (every one that talks to a head) keep theirs.
    """
    name = _invoked(args)
    if name is None:
        return args
    at = args.index(name)
    head, rest, moved = args[: at + 1], args[at + 1 :], []
    kept: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        command_word = not a.startswith("-") and (not kept or not kept[-1].startswith("-"))
        if a == "--" or (name in ("submit", "serve") and command_word):
            kept += rest[i:]
            break
        flag, eq, value = a.partition("=")
        if flag == "--token":
            moved += [flag, value] if eq else rest[i : i + 2]
            i += 1 if eq else 2
            continue
        kept.append(a)
        i += 1
    return moved + head + kept if moved else args


def _click_error(name: str) -> type[Exception]:
    """click's exception class `name`, whether Typer vendors click or depends on it."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


def main() -> None:
    """Run the CLI; a usage error (unknown option, a bad number, a missing argument) is one line
    on stderr and exit 1, like every other refused input, not click's boxed usage and exit 2."""
    args = hoist_global_options(sys.argv[1:])
    name = _invoked(args)
    _keep_only(name)
    try:
        code = app(args=args, prog_name="gpucluster", standalone_mode=False)
    except _click_error("UsageError") as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `gpucluster` or `gpucluster admin` alone
            sys.stdout.write(e.ctx.get_help() + "\n")  # type: ignore[attr-defined]
            raise SystemExit(0) from None
        command = getattr(getattr(e, "ctx", None), "command_path", "gpucluster")
        err.print(f"[red]error:[/red] {escape(e.format_message())} (see `{command} --help`)")  # type: ignore[attr-defined]
        raise SystemExit(1) from None
    except _click_error("ClickException") as e:
        err.print(f"[red]error:[/red] {escape(e.format_message())}")  # type: ignore[attr-defined]
        raise SystemExit(1) from None
    except _click_error("Abort"):
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
