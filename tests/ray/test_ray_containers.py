"""Container jobs on Ray nodes: the node agents run them through the same shim and podman as a
local head, with the head's --container-config (the same path on every node).

A 2-node gang job, one container per rank, all-reduces with gloo across the nodes (host
networking: each Ray node here is its own loopback address), and its logs come back to the head.
The image and the private podman are tests/e2e/containerkit.py's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.client import Client
from tests.e2e.containerkit import IMAGE, Podman
from tests.e2e.headproc import wait_for
from tests.ray.conftest import RayCluster, RayHead

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or shutil.which("busybox") is None or os.geteuid() != 0,
    reason="needs podman, runc and busybox (scripts/test.sh installs them as root) and root",
)

ALLREDUCE = Path(__file__).with_name("allreduce.py")
PY_ROOTS = tuple(dict.fromkeys(os.path.realpath(p) for p in ("/usr", sys.prefix, sys.base_prefix)))


@pytest.fixture(scope="module")
def container_head(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    root = tmp_path_factory.mktemp("raypodman")
    podman = Podman(root / "podman")
    made = podman.import_test_image(root)
    if made.returncode != 0:
        pytest.skip(f"podman cannot import an image here: {made.stderr.strip()}")
    policy = root / "policy.yaml"
    policy.write_text("containers:\n  mount_roots: [" + ", ".join(PY_ROOTS) + "]\n")
    head = RayHead(root / "data", ray_cluster.address)
    head.args += ["--container-config", str(podman.config), "--policy", str(policy)]
    try:
        head.start(timeout=120)
        yield head
    finally:
        head.stop()
        head.kill_jobs()
        podman("rm", "--all", "--force", "--time", "0")
        with contextlib.suppress(OSError):
            shutil.rmtree(root)


def test_a_gang_job_runs_one_container_per_rank_across_two_ray_nodes(container_head: RayHead, tmp_path: Path) -> None:
    shutil.copy(ALLREDUCE, tmp_path / "allreduce.py")
    mounts = [f"{r}:{r}:ro" for r in PY_ROOTS]
    with Client(container_head.url, token=container_head.token) as c:
        job_id = c.submit(
            [sys.executable, "allreduce.py"],
            gpus=2,
            nodes=2,
            per_gpu=True,
            workdir=str(tmp_path),
            image=IMAGE,
            mounts=mounts,
        ).id
        job = wait_for(
            lambda: (j := c.job(job_id)).state.terminal and j, timeout=180, interval=0.2, what="the gang job to end"
        )
        out = c.logs(job_id, all_ranks=True)
    assert job.state.value == "succeeded", (job.reason, out)
    nodes = {s.node for s in job.allocation}
    assert len(nodes) == 2, job.allocation
    for rank in (0, 1):
        assert f"rank {rank} of 2 on " in out and "sum 3" in out, out
