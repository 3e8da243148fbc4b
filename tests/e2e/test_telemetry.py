"""Telemetry end to end: a real `gpucluster up` that finds "NVIDIA GPUs" through a fake pynvml
(tests/fakenvml, first on its PYTHONPATH) whose readings the test scripts in a JSON file; real
job processes, real HTTP, the real CLI, the real SQLite file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpucluster.models import Job

from .headproc import HeadProcess, cli, wait_for

FAKE_NVML = Path(__file__).parent.parent / "fakenvml"
NODE = "node0"


class FakeGpus:
    """The fake NVML's readings, rewritten atomically (the head re-reads them at every sample)."""

    def __init__(self, path: Path, count: int = 2) -> None:
        self.path = path
        self.count = count
        self.set()

    def set(self, **per_gpu: dict[str, Any]) -> None:
        gpus = []
        for i in range(self.count):
            g: dict[str, Any] = {"util": 50, "temp": 45, "power_w": 300, "ecc": 0, "memory_used_mb": 1000}
            g.update(per_gpu.get(f"g{i}", {}))
            gpus.append(g)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpus": gpus}))
        os.replace(tmp, self.path)


@pytest.fixture(scope="module")
def gpus(tmp_path_factory: pytest.TempPathFactory) -> FakeGpus:
    return FakeGpus(tmp_path_factory.mktemp("nvml") / "state.json")


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory, gpus: FakeGpus) -> Iterator[HeadProcess]:
    base = tmp_path_factory.mktemp("telemetry")
    policy = base / "policy.yaml"
    policy.write_text("health: {max_temperature: 90, node_timeout: 30s}\n")
    h = HeadProcess(base / "data")
    # Real GPUs as far as the head can tell: no --virtual-gpus, NVML from the fake module.
    i = h.args.index("--virtual-gpus")
    del h.args[i : i + 4]  # --virtual-gpus N --gpu-type T
    h.args += ["--telemetry-interval", "0.2s", "--policy", str(policy)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]))
        mp.setenv("FAKE_NVML_STATE", str(gpus.path))
        h.start()
    try:
        yield h
    finally:
        h.stop()
        h.kill_jobs()


def job(head: HeadProcess, job_id: int) -> Job:
    with head.client() as c:
        return c.job(job_id)


def test_nodes_show_nvml_readings(head: HeadProcess, gpus: FakeGpus) -> None:
    with head.client() as c:
        nodes = wait_for(lambda: [n for n in c.nodes() if n.gpus[0].utilization is not None], what="readings")
    g = nodes[0].gpus[0]
    assert (g.model, g.utilization, g.temperature_c, g.power_w, g.healthy) == ("H100-80GB", 50, 45, 300, True)
    shown = cli(head, "nodes")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.strip().startswith(NODE))
    assert "50%" in row and "45 C" in row and "1.0 GiB" in row


def test_fractional_job_over_its_memory_share_is_stopped(head: HeadProcess, gpus: FakeGpus, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with head.client() as c:
        j = c.submit(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], gpu_memory="10GiB", workdir=str(tmp_path))
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the job's pid")
    pid = int(pidfile.read_text())
    gpu = job(head, j.id).allocation[0].gpu_indices[0]
    gpus.set(**{f"g{gpu}": {"processes": [{"pid": pid, "memory_mb": 8 * 1024}]}})
    with head.client() as c:  # within its share: it shows, and nothing happens
        wait_for(lambda: any(u.memory_mb == 8 * 1024 for u in c.job(j.id).gpu_usage), what="the job's memory")
    gpus.set(**{f"g{gpu}": {"processes": [{"pid": pid, "memory_mb": 12 * 1024}]}})
    ended = wait_for(lambda: (r := job(head, j.id)).state.value == "failed" and r, what="the job stopped")
    why = f"stopped: used 12.0 GiB of GPU memory on {NODE} GPU {gpu}, over its share of 10.0 GiB"
    assert ended.reason.startswith(why)
    gpus.set()


def test_hot_gpu_drains_the_node_until_it_cools_and_operators_drain_by_hand(
    head: HeadProcess, gpus: FakeGpus, tmp_path: Path
) -> None:
    with head.client() as c:
        before = c.submit(["sleep", "60"], gpus=1, workdir=str(tmp_path))
        wait_for(lambda: c.job(before.id).state.value == "running", what="the first job running")
        gpus.set(g1={"temp": 95})
        node = wait_for(lambda: next((n for n in c.nodes() if n.drained), None), what="the node drained")
        assert (node.drain_reason, node.drained_by) == ("GPU 1 at 95 C, over 90 C", "health")
        shown = cli(head, "nodes")
        assert f"node {NODE} is drained by health checks" in shown.stdout and "GPU 1 at 95 C" in shown.stdout
        after = c.submit(["sleep", "60"], gpus=1, workdir=str(tmp_path))
        wait_for(lambda: c.job(after.id).reason not in ("submitted", ""), what="a wait reason")
        assert c.job(after.id).state.value == "queued"  # nothing new on the drained node
        assert c.job(before.id).state.value == "running"  # and what ran goes on
        gpus.set()  # cooled down
        wait_for(lambda: c.job(after.id).state.value == "running", what="the queued job to start")

        drained = cli(head, "drain", NODE, "--reason", "new cables")
        assert drained.returncode == 0 and "drained: new cables" in drained.stdout
        assert next(n for n in c.nodes()).drain_reason == "new cables"
        undrained = cli(head, "undrain", NODE)
        assert undrained.returncode == 0 and "undrained" in undrained.stdout
        again = cli(head, "undrain", NODE)
        assert again.returncode == 1 and again.stderr.strip() == f"error: node {NODE} is not drained"
        missing = cli(head, "drain", "nosuch")
        assert missing.returncode == 1 and f"no node named 'nosuch'; nodes: {NODE}" in missing.stderr
        assert "Traceback" not in missing.stderr
        for j in (before, after):
            c.cancel(j.id)


def test_metrics_parse_and_have_the_expected_series(head: HeadProcess, tmp_path: Path) -> None:
    with head.client() as c:
        waiting = c.submit(["sleep", "60"], gpus=2, team="vision", priority="high", workdir=str(tmp_path))
        blocker = c.submit(["sleep", "60"], gpus=1, workdir=str(tmp_path))
        del blocker
    r = httpx.get(f"{head.url}/metrics", timeout=10)  # no token: public, like /v1/health
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in (
        "gpucluster_gpu_utilization_ratio",
        "gpucluster_gpu_memory_used_bytes",
        "gpucluster_gpu_temperature_celsius",
        "gpucluster_gpu_power_watts",
        "gpucluster_gpu_healthy",
        "gpucluster_node_drained",
        "gpucluster_queue_length",
        "gpucluster_queue_oldest_wait_seconds",
        "gpucluster_job_wait_seconds",
        "gpucluster_scheduling_cycle_seconds",
        "gpucluster_jobs",
    ):
        assert name in families, name
    util = {s.labels["gpu"]: s.value for s in families["gpucluster_gpu_utilization_ratio"].samples}
    assert util == {"0": 0.5, "1": 0.5}
    temp = families["gpucluster_gpu_temperature_celsius"].samples[0]
    assert temp.labels == {"node": NODE, "gpu": "0", "model": "H100-80GB"} and temp.value == 45
    jobs = {s.labels["state"]: s.value for s in families["gpucluster_jobs"].samples}
    assert jobs["failed"] >= 1 and set(jobs) >= {"queued", "running", "succeeded", "cancelled"}
    cycles = [s for s in families["gpucluster_scheduling_cycle_seconds"].samples if s.name.endswith("_count")]
    assert cycles[0].value > 0
    queued = {(s.labels["team"], s.labels["priority"]): s.value for s in families["gpucluster_queue_length"].samples}
    if job(head, waiting.id).state.value == "queued":
        assert queued[("vision", "high")] == 1
    with head.client() as c:
        for j in c.jobs(state=["queued", "running"]):
            c.cancel(j.id)


def test_api_refuses_bad_input_and_serves_stored_samples(head: HeadProcess) -> None:
    h = head.headers
    long = httpx.post(f"{head.url}/v1/nodes/{NODE}/drain", json={"reason": "x" * 501}, headers=h, timeout=10)
    assert long.status_code == 422 and long.json()["error"].startswith("reason:")
    extra = httpx.post(f"{head.url}/v1/nodes/{NODE}/drain", json={"why": "x"}, headers=h, timeout=10)
    assert extra.status_code == 422 and "why" in extra.json()["error"]
    backwards = httpx.get(f"{head.url}/v1/telemetry/samples", params={"since": 10, "until": 5}, headers=h, timeout=10)
    assert backwards.status_code == 422 and backwards.json()["error"] == "until: must not be before since"
    with head.client() as c:  # written in batches every 10 s
        samples = wait_for(lambda: c.gpu_samples(node=NODE, gpu=0), timeout=25, what="stored samples")
    assert all(s.seconds > 0 and s.level == 0 for s in samples)
    assert samples[-1].power_w == 300 and samples[-1].temperature_c == 45
