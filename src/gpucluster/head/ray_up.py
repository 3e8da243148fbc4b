"""`gpucluster up --ray ADDRESS`: the head joins a Ray cluster as a driver and runs jobs on its nodes.

Ray provides membership, failure detection and remote process launch; the head keeps every
decision (queue, policy, placement to exact nodes and GPUs) and the state, in its own store. A
restarted head connects again, finds the node agents (detached actors, by name) and adopts
the jobs they run.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from gpucluster.errors import GpuclusterError
from gpucluster.head.paths import DataDir
from gpucluster.store import Store

if TYPE_CHECKING:  # ray is an optional extra: imported only once --ray is asked for
    from gpucluster.executors.ray import RayExecutor
    from gpucluster.executors.ray_nodes import RayInventory
    from gpucluster.head.service import ClusterService
    from gpucluster.telemetry.monitor import TelemetryMonitor

AGENTS_READY_TIMEOUT_S = 60.0


class RayStartupError(RuntimeError, GpuclusterError):
    """The head cannot use the Ray cluster; the message says why, in one line."""


@dataclass
class RayMode:
    executor: RayExecutor
    inventory: RayInventory
    all_virtual: bool

    def close(self) -> None:
        import ray

        self.executor.close()
        ray.shutdown()


def cluster_id(data: DataDir) -> str:
    """Names this head's agents: one per data dir (and machine), so two heads never share them."""
    return hashlib.sha1(f"{socket.gethostname()}:{data.root}".encode()).hexdigest()[:10]


def start_ray(
    address: str,
    data: DataDir,
    store: Store,
    say: IO[str],
    max_log_bytes: int = 0,
    container_config: Path | None = None,
) -> RayMode:
    try:
        import ray
    except ImportError:
        raise RayStartupError("--ray needs Ray installed next to gpucluster: pip install 'gpucluster[ray]'") from None
    from gpucluster.executors.ray import RayExecutor
    from gpucluster.executors.ray_nodes import NAMESPACE, RayInventory

    if not address.strip():
        raise RayStartupError("--ray needs an address (HOST:PORT of the Ray head, or 'auto')")
    _check_reachable(address)
    say.write(f"connecting to the Ray cluster at {address}\n")
    say.flush()
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            log_to_driver=False,
            logging_level=logging.WARNING,
            include_dashboard=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RayStartupError(f"cannot connect to the Ray cluster at {address}: {first}") from None
    inventory = RayInventory(store, cluster_id(data))
    inventory.wait_ready(AGENTS_READY_TIMEOUT_S)
    nodes = [r for r in store.nodes() if r.node.name not in inventory.down()]
    gpus = sum(len(r.node.gpus) for r in nodes)
    say.write(f"Ray cluster: {len(nodes)} node(s) with GPUs, {gpus} GPU(s) in all\n")
    if not nodes:
        say.write("no Ray node declares GPUs yet (ray start --num-gpus N or --resources '{\"gpu_model:H100\": 8}')\n")
    # The nodes' logs rotate as local ones; container jobs use --container-config's path on each node.
    executor = RayExecutor(inventory, max_log_bytes=max_log_bytes, container_config=container_config)
    return RayMode(executor, inventory, all_virtual=all(r.virtual for r in nodes))


def _check_reachable(address: str) -> None:
    """Fail in seconds, with what to do, where Ray itself would retry for a minute or more."""
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep:
        return
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RayStartupError(f"--ray {address}: expected HOST:PORT of the Ray head (or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise RayStartupError(
            f"nothing answers at {address} ({e.strerror or e}); start Ray there with `ray start --head`"
        ) from None


def ray_telemetry(service: ClusterService, interval_s: float) -> tuple[TelemetryMonitor, threading.Thread]:
    """The telemetry monitor without local sources: each Ray node's agent samples its own GPUs,
    and the Ray executor's monitor round pulls the readings in (`telemetry/remote.py`)."""
    from gpucluster.executors.ray import RayExecutor
    from gpucluster.telemetry.monitor import TelemetryMonitor
    from gpucluster.telemetry.remote import RemoteFeed

    monitor = TelemetryMonitor(service.head, [], interval_s=interval_s, flush_s=max(10.0, interval_s))
    service.telemetry = monitor
    if isinstance(service.head.executor, RayExecutor):
        service.head.executor.telemetry = RemoteFeed(monitor)
    return monitor, monitor.start()
