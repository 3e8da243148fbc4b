"""The Ray executor against the local executor, side by side, and how fast a dead node's jobs return.

  .venv/bin/python bench/bench_ray.py [--latency-jobs 30] [--burst 40] [--deaths 3] [--out r.json]

Two heads run at once on this machine, each with 8 virtual GPUs: the baseline `gpucluster up
--virtual-gpus 8` (local executor) and `gpucluster up --ray ADDRESS` on a real Ray cluster
(ray.cluster_utils: a head and two worker raylets of 4 GPUs each, on 127.0.0.2-4, health checks
at 0.5 s x 3 as the README advises). Measured, alternating between the two heads so load from
other processes hits both alike:

1. submit -> running latency: a 1-GPU job running `true`, one at a time; from time.time() just
   before the POST to the job's started_at (set by the head; same clock).
   Also until the process itself runs (it prints its clock) and until the API shows it done
   (the Ray side copies its output to the head first).
2. jobs/s: a burst of N 1-GPU `true` jobs submitted at once, until all have succeeded.
3. Ray only: a 4-GPU `sleep` job fills one worker; the worker is killed (every process SIGKILLed,
   as when a machine dies); the time until the job is back in the queue (attempt ended, state
   queued or running attempt 2) and until it runs again on the survivor. The node is added back
   between rounds.

Figures are for this machine only, with the load the output reports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import _head
from gpucluster import userconfig

HEALTH = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_initial_delay_ms": 0,
}


def load() -> float:
    return os.getloadavg()[0]


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def submit(self, command: list[str], gpus: int = 1) -> int:
        r = self.http.post("/v1/jobs", json={"command": command, "gpus": gpus, "workdir": "/tmp"})
        r.raise_for_status()
        return int(r.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.http.get(f"/v1/jobs/{job_id}")
        r.raise_for_status()
        return dict(r.json())

    def wait(self, job_id: int, pred: Any, timeout: float = 120, every: float = 0.02) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            j = self.job(job_id)
            if pred(j):
                return j
            time.sleep(every)
        raise TimeoutError(f"job {job_id}: {self.job(job_id)}")


def start_ray_head(address: str, data_dir: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], Api]:
    port = _head.free_port()
    config = data_dir.parent / "gpucluster-config.yaml"
    env = {**os.environ, userconfig.ENV_PATH: str(config)}
    argv = [str(_head.GPUCLUSTER), "up", "--ray", address, "--port", str(port), "--data-dir", str(data_dir)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray head exited:\n{_head.tail(log_path)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                return proc, Api(url, userconfig.load(config).token_for(url) or "")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"ray head not healthy:\n{_head.tail(log_path)}")


def latency(api: Api) -> tuple[float, float, float]:
    """Submit -> placed (the head's started_at), -> the process runs (its own clock), -> seen done."""
    t = time.time()
    job_id = api.submit(["sh", "-c", "date +%s.%N"])
    j = api.wait(job_id, lambda j: j["state"] in ("succeeded", "failed"), every=0.005)
    done = time.time()
    ran = float(api.http.get(f"/v1/jobs/{job_id}/logs").text.split()[0])
    return float(j["started_at"]) - t, ran - t, done - t


def burst(api: Api, n: int) -> float:
    t = time.monotonic()
    ids = [api.submit(["true"]) for _ in range(n)]
    for i in ids:
        j = api.wait(i, lambda j: j["state"] in ("succeeded", "failed"), every=0.05)
        assert j["state"] == "succeeded", j
    return n / (time.monotonic() - t)


def node_death(api: Api, cluster: Any, workers: dict[str, Any]) -> tuple[float, float]:
    job_id = api.submit(["sleep", "300"], gpus=4)
    j = api.wait(job_id, lambda j: j["state"] == "running")
    victim = j["allocation"][0]["node"]
    killed = time.monotonic()
    cluster.remove_node(workers.pop(victim), allow_graceful=False)
    api.wait(job_id, lambda j: j["state"] == "queued" or j["attempt"] >= 2, every=0.01)
    requeued = time.monotonic() - killed
    api.wait(job_id, lambda j: j["state"] == "running" and j["attempt"] >= 2, every=0.01)
    running = time.monotonic() - killed
    api.http.post(f"/v1/jobs/{job_id}/cancel").raise_for_status()
    api.wait(job_id, lambda j: j["state"] == "cancelled")
    workers[victim] = add_worker(cluster, victim)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # back in the head's inventory
        nodes = api.http.get("/v1/nodes").json()["nodes"]
        if any(n["name"] == victim and n.get("up", True) for n in nodes):
            break
        time.sleep(0.2)
    return requeued, running


def add_worker(cluster: Any, ip: str) -> Any:
    return cluster.add_node(num_cpus=1, num_gpus=4, resources={"gpu_model:H100-80GB": 4}, node_ip_address=ip)


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"n": len(xs), "median": statistics.median(xs), "p90": xs[int(0.9 * (len(xs) - 1))], "max": xs[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency-jobs", type=int, default=30)
    ap.add_argument("--burst", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2, help="burst rounds per head")
    ap.add_argument("--deaths", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gcbray-", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(tmp)
    from ray.cluster_utils import Cluster

    loads = [load()]
    cluster = local = ray_proc = None
    results: dict[str, Any] = {}
    try:
        t = time.monotonic()
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.2", "include_dashboard": False,
                            "_system_config": HEALTH},
        )  # fmt: skip
        workers = {ip: add_worker(cluster, ip) for ip in ("127.0.0.3", "127.0.0.4")}
        results["ray_cluster_start_s"] = time.monotonic() - t
        local = _head.start(8, tmp / "local" / "data", tmp / "local.log")
        (tmp / "rayhead").mkdir(exist_ok=True)
        ray_proc, ray_api = start_ray_head(cluster.address, tmp / "rayhead" / "data", tmp / "rayhead.log")
        local_api = Api(local.url, local.token)
        for api in (local_api, ray_api):  # warm up (the Ray side: first jobs on each agent)
            for _ in range(3):
                latency(api)
        lat: dict[str, list[tuple[float, float, float]]] = {"local": [], "ray": []}
        for _ in range(args.latency_jobs):
            lat["local"].append(latency(local_api))
            lat["ray"].append(latency(ray_api))
            loads.append(load())
        rate: dict[str, list[float]] = {"local": [], "ray": []}
        for _ in range(args.rounds):
            rate["local"].append(burst(local_api, args.burst))
            rate["ray"].append(burst(ray_api, args.burst))
            loads.append(load())
        deaths = [node_death(ray_api, cluster, workers) for _ in range(args.deaths)]
        loads.append(load())
        results.update(
            latency_s={
                f"{k} {what}": stats([x[i] for x in v])
                for k, v in lat.items()
                for i, what in enumerate(("placed", "process runs", "seen done"))
            },
            jobs_per_s={k: statistics.median(v) for k, v in rate.items()},
            node_death_to_requeued_s=stats([d[0] for d in deaths]),
            node_death_to_running_again_s=stats([d[1] for d in deaths]),
            load_average={"min": min(loads), "max": max(loads)},
        )
    finally:
        if ray_proc is not None:
            ray_proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                ray_proc.wait(15)
            if ray_proc.poll() is None:
                ray_proc.kill()
        if local is not None:
            local.stop()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    report(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def report(r: dict[str, Any]) -> None:
    lat, rate = r["latency_s"], r["jobs_per_s"]
    print(f"Ray cluster (head + 2 workers) started in {r['ray_cluster_start_s']:.1f} s")
    print(f"load average during the run: {r['load_average']['min']:.1f} .. {r['load_average']['max']:.1f} (2 cores)")
    print(f"{'':34} {'local (baseline)':>18} {'ray':>10} {'ray/local':>10}")
    for what in ("placed", "process runs", "seen done"):
        for q in ("median", "p90"):
            a, b = lat[f"local {what}"][q] * 1000, lat[f"ray {what}"][q] * 1000
            print(f"{'submit->' + what + ' ' + q + ' (ms)':34} {a:18.0f} {b:10.0f} {b / a:10.2f}")
    a, b = rate["local"], rate["ray"]
    print(f"{'jobs/s (burst, until all done)':34} {a:18.1f} {b:10.1f} {b / a:10.2f}")
    d, g = r["node_death_to_requeued_s"], r["node_death_to_running_again_s"]
    print(f"node death -> job requeued: median {d['median']:.2f} s, max {d['max']:.2f} s (n={d['n']})")
    print(f"node death -> job running on the survivor: median {g['median']:.2f} s, max {g['max']:.2f} s")


if __name__ == "__main__":
    main()
