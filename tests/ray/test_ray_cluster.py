"""The cluster on Ray, end to end: a real `gpucluster up --ray` head, real raylets, real jobs.

One head serves the module (tests run in order, each leaving the cluster as it found it: two
worker nodes of 2 GPUs, no job running). Measured here on 2 loaded cores: ~25 s to start the
Ray cluster, ~10 s the head, then each test 10-40 s.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpucluster.client import Client
from gpucluster.models import Job
from tests.e2e.headproc import wait_for
from tests.ray.conftest import RayCluster, RayHead

ALLREDUCE = Path(__file__).with_name("allreduce.py")

# A job that checkpoints, then runs until stopped; its next attempt finds the checkpoint and ends.
RESUMABLE = (
    'if [ -f "$GPUCLUSTER_CHECKPOINT_DIR/step" ]; then echo "resumed on $GPUCLUSTER_NODE attempt $GPUCLUSTER_ATTEMPT"; '
    'exit 0; fi; echo 1 > "$GPUCLUSTER_CHECKPOINT_DIR/step"; echo "started on $GPUCLUSTER_NODE"; sleep 300'
)


def _state(c: Client, job_id: int, *states: str, timeout: float = 60) -> Job:
    return wait_for(
        lambda: (j := c.job(job_id)).state.value in states and j,
        timeout=timeout,
        interval=0.2,
        what=f"job {job_id} in {states}",
    )


def _attempt_pids(data_dir: Path, job_id: int, attempt: int) -> list[int]:
    """Processes of this job's attempt on this machine (any node), found by their environment."""
    ckpt = f"GPUCLUSTER_CHECKPOINT_DIR={data_dir.resolve()}/jobs/{job_id}/checkpoints"
    wanted = (ckpt.encode(), f"GPUCLUSTER_ATTEMPT={attempt}".encode())
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if all(w in env for w in wanted):
                found.append(int(entry.name))
    return found


def _nodes_up(c: Client) -> dict[str, bool]:
    return {n.name: n.up for n in c.nodes()}


def _cancel_all(c: Client) -> None:
    for j in c.jobs(state=["queued", "running"]):
        c.cancel(j.id)
    wait_for(lambda: not c.jobs(state=["running"]), timeout=30, what="no running job")


def test_nodes_come_from_ray(ray_head: RayHead, ray_cluster: RayCluster) -> None:
    with ray_head.client() as c:
        nodes = {n.name: n for n in c.nodes()}
    workers = sorted(ray_cluster.workers)
    assert sorted(nodes) == workers  # the Ray head declares no GPU: not a gpucluster node
    for ip in workers:
        n = nodes[ip]
        assert n.up and n.address == ip and n.virtual
        assert [(g.index, g.model, g.memory_mb) for g in n.gpus] == [(i, "H100-80GB", 80 * 1024) for i in (0, 1)]


def test_ray_nodes_gpus_are_sampled_by_their_agents(ray_head: RayHead, tmp_path: Path) -> None:
    """Each node's agent samples its (virtual, so synthetic) GPUs; the head's monitor gets them."""
    with ray_head.client() as c:
        job = c.submit(["sleep", "300"], gpus=1, workdir=str(tmp_path), name="busy")
        try:
            slot = _state(c, job.id, "running").allocation[0]
            node, held = slot.node, slot.gpu_indices[0]
            r = httpx.post(
                f"{ray_head.url}/v1/jobs/{job.id}/progress", json={"gpu_utilization": 40}, headers=ray_head.headers
            )
            assert r.status_code == 204, r.text

            def readings() -> dict[tuple[str, int], tuple[float | None, float | None]] | None:
                out = {(n.name, g.index): (g.utilization, g.power_w) for n in c.nodes() for g in n.gpus}
                return out if out.get((node, held), (None,))[0] == 40 else None

            seen = wait_for(readings, timeout=30, interval=0.5, what="the job's load in its node's readings")
            # Synthetic readings: utilisation x share; power 60 W idle to 700 W at full load.
            assert seen[(node, held)] == (40, 60 + 640 * 0.4)
            assert all(u == 0 and p == 60 for k, (u, p) in seen.items() if k != (node, held)), seen
            text = httpx.get(f"{ray_head.url}/metrics", timeout=10).text
            util = {
                (s.labels["node"], s.labels["gpu"]): s.value
                for f in text_string_to_metric_families(text)
                if f.name == "gpucluster_gpu_utilization_ratio"
                for s in f.samples
            }
            assert util[(node, str(held))] == 0.4
            assert {n for n, _ in util} == {n.name for n in c.nodes()}
        finally:
            c.cancel(job.id)
            _state(c, job.id, "cancelled")


def test_gang_job_all_reduces_across_two_nodes(ray_head: RayHead, tmp_path: Path) -> None:
    with ray_head.client() as c:
        job = c.submit(
            [sys.executable, str(ALLREDUCE)], gpus=2, nodes=2, per_gpu=True, workdir=str(tmp_path), name="allreduce"
        )
        done = _state(c, job.id, "succeeded", "failed", timeout=120)
        logs = [c.logs(job.id, rank=r) for r in (0, 1)]
    assert done.state.value == "succeeded", (done.reason, logs)
    nodes = [s.node for s in done.allocation]
    assert len(set(nodes)) == 2
    master = nodes[0]
    for rank, text in enumerate(logs):
        # 1 + 2: the ranks met across the nodes; MASTER_ADDR is rank 0's node's address.
        assert f"rank {rank} of 2 on {nodes[rank]} master {master} sum 3" in text


def test_node_death_requeues_onto_the_survivor_and_the_node_rejoins(
    ray_head: RayHead, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    with ray_head.client() as c:
        job = c.submit(["sh", "-c", RESUMABLE], gpus=2, workdir=str(tmp_path), name="resumable")
        running = _state(c, job.id, "running")
        victim = running.allocation[0].node
        # The remote output reaches the head while the job runs.
        wait_for(lambda: "started on" in c.logs(job.id), timeout=30, what="live log")
        assert c.job(job.id).state.value == "running"

        killed_at = time.monotonic()
        ray_cluster.kill_worker(victim)
        requeued = wait_for(lambda: c.job(job.id).attempt >= 2 or None, timeout=30, what="a second attempt")
        noticed_s = time.monotonic() - killed_at
        # Nothing of the first attempt survives its node, though this machine lives on.
        wait_for(
            lambda: not _attempt_pids(ray_head.data_dir, job.id, 1),
            timeout=10,
            what="the dead node's job processes gone",
        )
        done = _state(c, job.id, "succeeded", "failed", timeout=60)
        first = done.attempts[0]
        assert done.state.value == "succeeded", done.reason
        assert first.outcome == "preempted" and f"node {victim} is down" in first.reason
        assert done.restarts == 0  # a lost node is not the job's failure
        assert done.allocation[0].node != victim
        assert f"resumed on {done.allocation[0].node} attempt 2" in c.logs(job.id)
        assert noticed_s < 15, f"requeued {noticed_s:.1f}s after the node died"
        assert requeued

        down = next(n for n in c.nodes() if n.name == victim)
        assert not down.up and down.down_reason and down.down_since
        ray_cluster.add_worker(victim)  # the same machine rejoins, as a new Ray node
        wait_for(lambda: _nodes_up(c).get(victim), timeout=60, what=f"{victim} back up")


def test_a_joining_node_takes_a_waiting_job(ray_head: RayHead, ray_cluster: RayCluster, tmp_path: Path) -> None:
    before = set(ray_cluster.workers)
    with ray_head.client() as c:
        try:
            fillers = [c.submit(["sleep", "300"], gpus=2, workdir=str(tmp_path)).id for _ in before]
            for j in fillers:
                _state(c, j, "running")
            waiting = c.submit(["sh", "-c", "echo ran on $GPUCLUSTER_NODE"], gpus=2, workdir=str(tmp_path))
            time.sleep(1.0)
            assert c.job(waiting.id).state.value == "queued"
            new = ray_cluster.add_worker()
            done = _state(c, waiting.id, "succeeded", "failed", timeout=90)
            assert done.state.value == "succeeded", done.reason
            assert done.allocation[0].node == new
            assert f"ran on {new}" in c.logs(waiting.id)
        finally:
            _cancel_all(c)
            for ip in set(ray_cluster.workers) - before:  # back to two workers for the next test
                ray_cluster.kill_worker(ip)
        wait_for(lambda: _nodes_up(c).get(new) is False, timeout=30, what=f"{new} down")


def test_head_restart_reconnects_and_adopts_running_jobs(ray_head: RayHead, tmp_path: Path) -> None:
    marker = tmp_path / "go"
    script = f'echo "rank $RANK up"; while [ ! -f {marker} ]; do sleep 0.2; done; echo "rank $RANK done"'
    with ray_head.client() as c:
        job = c.submit(["sh", "-c", script], gpus=2, nodes=2, per_gpu=True, workdir=str(tmp_path))
        _state(c, job.id, "running")
        wait_for(lambda: "rank 1 up" in c.logs(job.id, rank=1), timeout=30, what="rank 1 running")
    ray_head.kill9()
    marker.touch()  # the job ends while no head watches it
    # The new head finds the cluster by itself (the address Ray recorded on this machine).
    ray_head.args[ray_head.args.index("--ray") + 1] = "auto"
    ray_head.start(timeout=120)
    with ray_head.client() as c:
        done = _state(c, job.id, "succeeded", "failed", timeout=60)
        assert done.state.value == "succeeded", done.reason
        assert done.attempt == 1  # adopted, never restarted
        assert [c.logs(job.id, rank=r).splitlines() for r in (0, 1)] == [
            ["rank 0 up", "rank 0 done"],
            ["rank 1 up", "rank 1 done"],
        ]


def test_a_ray_jobs_log_is_capped_on_its_node_and_on_the_head_and_serves_its_tail(
    ray_head: RayHead, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """The head runs with --max-log-size 256KiB (conftest): a job writing 1.5 MB keeps at most
    the cap on its node while it runs and in the head's copy, and the API serves the newest bytes
    at the offsets the job wrote them (rotated bytes counted)."""
    cap, line, n = 256 * 1024, 21, 70_000
    total = n * line
    write = f"import sys, time\nfor i in range({n}): sys.stdout.write(f'line {{i:09d}}......\\n')\n"
    write += "sys.stdout.flush(); time.sleep(3)\n"
    with ray_head.client() as c:
        job = c.submit([sys.executable, "-c", write], gpus=1, workdir=str(tmp_path), name="chatty")
        _state(c, job.id, "running")
        node_log = wait_for(
            lambda: next(iter(ray_cluster.tmp.glob(f"gpucluster-node/*/jobs/{job.id}/attempt-1/output.log")), None),
            timeout=30, what="the job's log on its node",
        )  # fmt: skip
        wait_for(lambda: c.logs(job.id, offset=total - line) != "", timeout=30, what="the last line at the head")
        on_node = [p.stat().st_size for p in node_log.parent.glob("output.log*") if p.suffix in (".log", ".1")]
        done = _state(c, job.id, "succeeded", "failed", timeout=60)
        assert done.state.value == "succeeded", done.reason
        tail = c.logs(job.id)
        last = c.logs(job.id, offset=total - line)
    assert sum(on_node) <= cap, on_node
    head_log = ray_head.data_dir / "jobs" / str(job.id) / "attempt-1" / "output.log"
    kept = sum(p.stat().st_size for p in (head_log, Path(f"{head_log}.1")) if p.exists())
    assert kept <= cap and int(Path(f"{head_log}.dropped").read_text()) + kept == total
    assert last == f"line {n - 1:09d}......\n"
    written = "".join(f"line {i:09d}......\n" for i in range(n))
    assert tail == written[-kept:]  # the newest bytes (segments are cut at byte counts, not lines)
