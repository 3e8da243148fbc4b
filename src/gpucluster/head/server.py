"""`gpucluster up`: one process that holds the data dir, runs the head loop and serves the API.

One head per data dir, enforced with an exclusive lock, and one head per database, enforced by
the database's lease (store/lease.py), which every write of the head checks: two heads on one
store could each start the same queued job. Running jobs outlive the head (they are in their own
sessions) and are re-adopted by the next head on the same data dir. A head that loses the lease
stops scheduling and leaves every job alone; one that stops cleanly releases it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import uvicorn

from gpucluster.api.app import create_app
from gpucluster.api.connections import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    connection_cap,
    raise_fd_limit,
    server_settings,
)
from gpucluster.api.follow import DEFAULT_PER_USER as DEFAULT_FOLLOWS_PER_USER
from gpucluster.core.restarts import RESTART_BACKOFF_S
from gpucluster.core.states import JobState
from gpucluster.core.types import Node
from gpucluster.dashboard.link import announce as announce_dashboard
from gpucluster.discovery.gpus import NoGpus, discover_nvml, nvml_minor_numbers, virtual_gpus
from gpucluster.discovery.host import discover_cpus, discover_memory_mb
from gpucluster.errors import GpuclusterError
from gpucluster.executors.base import Executor
from gpucluster.executors.cgroups import detect as detect_cgroups
from gpucluster.executors.image_cache import DEFAULT_CAP_BYTES as DEFAULT_IMAGE_CACHE_BYTES
from gpucluster.executors.image_cache import ImageCache
from gpucluster.executors.local import LocalExecutor
from gpucluster.executors.podman import ContainerNode
from gpucluster.executors.podman import describe_node as describe_container_node
from gpucluster.head.loop import Head
from gpucluster.head.paths import DataDir
from gpucluster.head.policy_source import PolicySource
from gpucluster.head.security import SecurityError, SecurityOptions, check_listen, client_url, setup_access, ssl_options
from gpucluster.head.service import ClusterService
from gpucluster.policyfile import PolicyFileError
from gpucluster.services.manager import start_services
from gpucluster.store import Store, StoreError
from gpucluster.store.lease import DEFAULT_LEASE_S, Holder
from gpucluster.telemetry.setup import DEFAULT_INTERVAL_S as DEFAULT_TELEMETRY_INTERVAL_S
from gpucluster.telemetry.setup import start_telemetry

DEFAULT_PORT = 8642
DEFAULT_VIRTUAL_GPUS = 8
DEFAULT_VIRTUAL_TYPE = "VGPU-80GB"
DEFAULT_MAX_LOG_BYTES = 1024**3  # per attempt per rank: a chatty job cannot fill the disk
# `--on-shutdown stop` waits this long past the grace period for the stopped jobs to be recorded.
SHUTDOWN_SLACK_S = 15.0

log = logging.getLogger("gpucluster.head")


class StartupError(RuntimeError, GpuclusterError):
    """The cluster cannot start; the message says why and what to do."""


@dataclass(frozen=True)
class UpOptions:
    host: str
    port: int
    data_dir: Path
    virtual_gpus: int | None
    gpu_type: str | None
    gpu_memory_mb: int | None
    grace_period_s: float | None
    node_name: str
    policy_path: Path | None = None
    restart_backoff_s: float | None = None
    # Check mode: each plan first compares the event-fed cluster state with the store (slower:
    # a full read of the queue each plan), failing the cycle on a difference.
    debug: bool = False
    gpus_per_domain: int | None = None
    node_labels: tuple[str, ...] = ()  # what jobs select the local node by (up --label)
    # CPU cores and host memory (MiB) jobs on the local node may ask for (up --cpus/--memory);
    # None: discovered from this machine (discovery/host.py).
    node_cpus: float | None = None
    node_memory_mb: int | None = None
    security: SecurityOptions = field(default_factory=SecurityOptions)
    telemetry_interval_s: float = DEFAULT_TELEMETRY_INTERVAL_S
    ray_address: str | None = None  # run jobs on a Ray cluster's nodes (head/ray_up.py)
    prices: dict[str, float] = field(default_factory=dict)  # --price: money per GPU-hour per model
    on_shutdown: str = "keep"  # "keep": running jobs outlive the head; "stop": stopped and requeued
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES  # each job process's log; 0: no cap
    database_url: str | None = None  # PostgreSQL (postgresql://...); None: SQLite in the data dir
    lease_s: float = DEFAULT_LEASE_S  # the database's one-head lease: renewed every third of it
    public_team_usage: bool = False  # /metrics shows each team's usage and spend without a token
    max_follows_per_user: int = DEFAULT_FOLLOWS_PER_USER
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # lowered to fit the open-files limit
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    container_config: Path | None = None  # containers.conf + storage.conf for container jobs' podman
    # The local node's image store past this is pruned, least recently used first (0: never).
    image_cache_bytes: int = DEFAULT_IMAGE_CACHE_BYTES
    gateway_port: int | None = None  # the services' gateway alone on this port too (/NAME/...)


def default_data_dir() -> Path:
    if os.geteuid() == 0:
        # A root head runs jobs as their submitters, who must pass through to their job's own
        # directory: not under root's private home.
        return Path("/var/lib/gpucluster")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpucluster"


def lock_data_dir(data: DataDir) -> IO[str]:
    data.secure()
    f = open(data.lock, "a+")  # noqa: SIM115 - held open for the head's lifetime
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise StartupError(
            f"another head is already running on {data.root} (pid {holder}); stop it or use --data-dir"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def local_node(opts: UpOptions, say: IO[str]) -> tuple[Node, bool]:
    cpus = opts.node_cpus if opts.node_cpus is not None else discover_cpus()
    memory = opts.node_memory_mb if opts.node_memory_mb is not None else discover_memory_mb()
    how = "declared" if opts.node_cpus is not None or opts.node_memory_mb is not None else "found"
    host = f"; jobs may ask for {cpus:g} CPU(s) and {memory / 1024:.1f} GiB of memory ({how})" if memory else ""
    if opts.virtual_gpus is None:
        try:
            gpus = discover_nvml()
            say.write(f"found {len(gpus)} GPU(s) through NVML: {', '.join(sorted({g.model for g in gpus}))}{host}\n")
            return Node(opts.node_name, tuple(gpus), frozenset(opts.node_labels), cpus, memory), False
        except NoGpus as e:
            count = DEFAULT_VIRTUAL_GPUS
            say.write(f"{e}; using {count} virtual GPUs of type {opts.gpu_type or DEFAULT_VIRTUAL_TYPE}{host}\n")
    else:
        count = opts.virtual_gpus
    gpus = virtual_gpus(
        count, opts.gpu_type or DEFAULT_VIRTUAL_TYPE, opts.gpu_memory_mb, opts.node_name, opts.gpus_per_domain
    )
    return Node(opts.node_name, tuple(gpus), frozenset(opts.node_labels), cpus, memory), True


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise StartupError(f"port {port} on {host} is in use; pick another with --port") from None
            raise StartupError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def run_up(opts: UpOptions, say: IO[str] = sys.stderr) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Everything the head makes is its own unless made otherwise on purpose: the database, its
    # journals, the run records (head/paths.py says who may read what).
    os.umask(0o077)
    try:
        check_listen(opts.host, opts.security)
    except SecurityError as e:
        raise StartupError(str(e)) from None
    data = DataDir(opts.data_dir.expanduser().resolve())
    lock = lock_data_dir(data)
    _check_port(opts.host, opts.port)
    if opts.gateway_port is not None:
        _check_port(opts.host, opts.gateway_port)
    try:
        policy = PolicySource(opts.policy_path)
    except PolicyFileError as e:
        raise StartupError(f"invalid policy: {e}") from None
    try:
        store = Store(opts.database_url or data.db)
    except StoreError as e:
        raise StartupError(str(e)) from None
    try:
        # One head per database: this head's writes check the lease from now on. The data dir's
        # lock is ours, so a head that held the lease from this data dir on this machine is gone.
        store.claim(Holder.this_process(str(data.root)), opts.lease_s, holds_data_dir=True, say=_say(say))
    except StoreError as e:
        store.close()
        raise StartupError(str(e)) from None
    ray_mode = None
    executor: Executor
    if opts.ray_address is not None:
        from gpucluster.head.ray_up import RayStartupError, start_ray

        try:
            ray_mode = start_ray(opts.ray_address, data, store, say, opts.max_log_bytes, opts.container_config)
        except RayStartupError as e:
            raise StartupError(str(e)) from None
        is_virtual = ray_mode.all_virtual
        executor = ray_mode.executor
    else:
        node, is_virtual = local_node(opts, say)
        cgroup_support = detect_cgroups()
        say.write(f"{cgroup_support.describe()}\n")  # what jobs get (or lose) from this node's cgroups
        # Job cgroups live under gpucluster/<instance>, one instance per data dir.
        instance = "head-" + hashlib.sha256(str(data.root).encode()).hexdigest()[:12]
        container_node = ContainerNode.from_config_dir(
            opts.container_config, gpu_uuids=None if is_virtual else {g.index: g.uuid for g in node.gpus if g.uuid}
        )
        say.write(f"{describe_container_node(container_node)}\n")  # what --image jobs need of this node
        image_cache = (
            ImageCache(container_node, data.root / "images.json", opts.image_cache_bytes)
            if opts.image_cache_bytes > 0
            else None
        )
        executor = LocalExecutor(
            max_log_bytes=opts.max_log_bytes,
            cgroup_support=cgroup_support,
            instance=instance,
            gpu_minors=None if is_virtual else nvml_minor_numbers(),
            container_node=container_node,
            image_cache=image_cache,
        )
        store.put_node(node, is_virtual, time.time())
    if os.geteuid() == 0 and (closed := data.unreachable_by_jobs()) is not None:
        say.write(
            f"warning: {closed} is closed to other accounts (no o+x): jobs run as their submitters cannot "
            f"reach their logs and checkpoints under {data.root / 'jobs'}; "
            "use a --data-dir such as /var/lib/gpucluster\n"
        )
    url = client_url(opts.host, opts.port, opts.security)
    access = setup_access(store, time.time, opts.security, url, say)
    policy.on_change = lambda what: access.record("policy-file", "policy", str(opts.policy_path), what)
    head = Head(
        store=store,
        executor=executor,
        data_dir=data,
        clock=time.time,
        grace_period_s=opts.grace_period_s,
        policy=policy,
        head_url=url,
        virtual_gpus=is_virtual,
        restart_backoff_s=opts.restart_backoff_s if opts.restart_backoff_s is not None else RESTART_BACKOFF_S,
        prices=opts.prices,
    )
    head.identity = access  # each job's own token, and its Unix account under a root head
    head.check_state = head.check_state or opts.debug
    if isinstance(executor, LocalExecutor) and executor.image_cache is not None:
        # What the node's cache kept is where placement may prefer; what it removes, no longer.
        for ref in executor.image_cache.known():
            head.images.seen(ref, {node.name})
        executor.image_cache.on_removed = head.images.forget
        executor.image_cache.prune_soon()  # a smaller cap than the last head's applies now
    head.inventory = ray_mode.inventory if ray_mode is not None else None
    head.tick()  # re-adopt or settle jobs left by a previous head before taking requests
    loop = threading.Thread(target=head.run, name="head-loop", daemon=True)
    loop.start()
    service = ClusterService(head)
    if ray_mode is not None:
        from gpucluster.head.ray_up import ray_telemetry

        monitor, sampler = ray_telemetry(service, opts.telemetry_interval_s)
    else:
        monitor, sampler = start_telemetry(service, node, is_virtual, opts.telemetry_interval_s)
    head.on_lease_lost = monitor.stop  # it would fail every step: the lease is gone for good
    # Every connection is a file descriptor: raise the soft limit, and hold no more connections
    # than it allows (api/connections.py: the cap, and the header timeout against slowloris).
    max_connections = connection_cap(opts.max_connections, raise_fd_limit())
    if max_connections < opts.max_connections:
        say.write(
            f"holding at most {max_connections} HTTP connections (--max-connections {opts.max_connections} "
            "is more than the open-files limit allows; raise it with ulimit -n)\n"
        )
    services = start_services(service)  # services/: replicas, probes, autoscaling; the gateway's routes
    app = create_app(
        service,
        access,
        follow_limit=opts.max_follows_per_user,
        public_team_usage=opts.public_team_usage,
        services=services,
        gateway_port=opts.gateway_port,
    )

    def config(port: int) -> uvicorn.Config:
        return uvicorn.Config(
            app,
            host=opts.host,
            port=port,
            log_level="warning",
            **server_settings(max_connections, opts.header_timeout_s),
            **ssl_options(opts.security),
        )

    server = uvicorn.Server(config(opts.port))
    # One server, one event loop, and a second listening socket for the gateway's own port: the
    # app tells the two apart by the port a connection came in on (services/gateway.py).
    sockets = None if opts.gateway_port is None else [config(p).bind_socket() for p in (opts.port, opts.gateway_port)]
    then = "jobs keep running" if opts.on_shutdown == "keep" else "running jobs are stopped and requeued"
    if opts.database_url:
        say.write(f"state in the database {store.display}\n")
    if store.migrated and store.migrated != "created":
        say.write(f"state database {store.migrated}\n")
    say.write(f"gpucluster head listening on {url} (data dir {data.root}); Ctrl-C stops it, {then}\n")
    announce_dashboard(url, say)
    if opts.gateway_port is not None:
        say.write(f"services' gateway also on {client_url(opts.host, opts.gateway_port, opts.security)}/NAME/\n")
    say.flush()
    # uvicorn stops on SIGTERM/SIGINT, then re-raises the signal to the handler it found: make
    # that one a no-op, so the shutdown below runs instead of the default action killing us.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda *_: None)
    try:
        server.run(sockets)
    finally:
        services.stop()
        service.close()
        try:
            shut_down(head, opts.on_shutdown)
        except StoreError as e:
            log.error("head shutting down: %s; running jobs are left as they are", e)
        head.stop()
        monitor.stop()
        loop.join(timeout=5)
        sampler.join(timeout=5)
        if isinstance(executor, LocalExecutor):
            executor.close()
        if ray_mode is not None:
            ray_mode.close()
        try:
            store.release()  # the next head takes over at once, not after the lease expires
        except StoreError as e:
            log.warning("could not release the database's lease (%s); the next head waits for it to expire", e)
        store.close()
        lock.close()


def _say(out: IO[str]) -> Callable[[str], None]:
    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    return say


def shut_down(head: Head, on_shutdown: str) -> None:
    """What a stopping head does to running jobs, said in one log line.

    "keep": nothing: each job runs on under its shim and the next head on this data dir adopts it.
    "stop": no new starts, then every running job is preempted through the loop (SIGTERM, the
    grace period, SIGKILL) and requeued, so no process is left holding GPUs unseen.
    """
    if head.lease_lost is not None:
        log.info("head shutting down: it lost the database's lease; the jobs are the other head's")
        return
    running = head.store.list_jobs(states=[JobState.RUNNING])
    if on_shutdown != "stop":
        log.info("head shutting down: %d running job(s) keep running; the next head adopts them", len(running))
        return
    log.info(
        "head shutting down: stopping %d running job(s) (SIGTERM, %.0fs grace, SIGKILL) and requeueing them",
        len(running),
        head.grace_period_s,
    )
    head.hold_starts = True
    for job in running:
        head.request_stop(job.id, "preempt", "the head shut down (--on-shutdown stop)")
    deadline = time.monotonic() + head.grace_period_s + SHUTDOWN_SLACK_S
    while time.monotonic() < deadline and head.store.list_jobs(states=[JobState.RUNNING]):
        time.sleep(0.2)
    left = head.store.list_jobs(states=[JobState.RUNNING])
    if left:
        log.warning("head shutting down: %d job(s) still running after the grace period", len(left))
