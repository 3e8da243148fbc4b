"""One real Ray cluster for the whole session: a head plus two worker nodes with virtual GPUs.

Built with ray.cluster_utils.Cluster (every node a real raylet, on this machine). Each node gets
its own loopback address (127.0.0.2, .3, ...): Ray rewrites 127.0.0.1 to the host's address.
Health checks are tightened (0.5 s x 3) so a killed node is declared dead within ~2 s, as the
README tells operators to do. The cluster and every process it started are stopped at the end,
even on failure; a job process left behind (its shim runs under the node's directory in
RAY_TMPDIR) is killed by PID.

Ray missing is a failure, not a skip: these tests are how the Ray engine is known to work.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.headproc import HeadProcess

WORKER_GPUS = 2
GPU_MODEL = "H100-80GB"
HEALTH = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_initial_delay_ms": 0,
}


class RayCluster:
    """The session's Ray cluster: add and kill worker nodes by address."""

    def __init__(self, tmp: Path) -> None:
        from ray.cluster_utils import Cluster

        self.tmp = tmp
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "node_ip_address": "127.0.0.2",
                "include_dashboard": False,
                "_system_config": HEALTH,
            },
        )
        self.address: str = self.cluster.address
        self.workers: dict[str, Any] = {}
        self._next = 3

    def add_worker(self, ip: str | None = None) -> str:
        if ip is None:
            ip = f"127.0.0.{self._next}"
            self._next += 1
        self.workers[ip] = self.cluster.add_node(
            num_cpus=1, num_gpus=WORKER_GPUS, resources={f"gpu_model:{GPU_MODEL}": WORKER_GPUS}, node_ip_address=ip
        )
        return ip

    def kill_worker(self, ip: str) -> None:
        """Kill every process of the node at once (SIGKILL), as when a machine dies."""
        self.cluster.remove_node(self.workers.pop(ip), allow_graceful=False)

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    try:
        import ray.cluster_utils  # noqa: F401
    except ImportError as e:
        pytest.fail(f"Ray is not installed ({e}): pip install -e '.[ray]' (scripts/test.sh does)", pytrace=False)
    # A short path: Ray's Unix sockets live under it.
    tmp = Path(tempfile.mkdtemp(prefix="gcray-", dir="/tmp"))
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(tmp)
    cluster = None
    try:
        cluster = RayCluster(tmp)
        cluster.add_worker()
        cluster.add_worker()
        yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        kill_shims_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved


def kill_shims_under(root: Path) -> None:
    """Job shims (and their process groups) whose run dir is under `root`: the node agents' jobs."""
    needle = str(root).encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"_shim.py" in cmdline and needle in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry.name), signal.SIGKILL)


class RayHead(HeadProcess):
    """`gpucluster up --ray ADDRESS`: its nodes and GPUs come from Ray, not from flags."""

    def __init__(self, data_dir: Path, address: str, grace: str = "1s") -> None:
        super().__init__(
            data_dir,
            grace=grace,
            # A small log cap: test_ray_cluster.py's log test writes past it (the others stay far below).
            extra_args=(
                *("--ray", address, "--restart-backoff", "0.2s", "--telemetry-interval", "1s"),
                *("--max-log-size", "256KiB"),
            ),
        )
        args: list[str] = []
        skip = False
        for a in self.args:
            if skip:
                skip = False
            elif a in ("--virtual-gpus", "--gpu-type", "--node-name"):
                skip = True
            else:
                args.append(a)
        self.args = args


@pytest.fixture(scope="module")
def ray_head(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    head = RayHead(tmp_path_factory.mktemp("rayhead") / "data", ray_cluster.address)
    try:
        head.start(timeout=120)
        yield head
    finally:
        head.stop()
        head.kill_jobs()
