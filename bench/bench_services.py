"""Services (issue 23): what the head's gateway adds to a request, and how fast load adds a replica.

Side by side in one run, against the same replica process:
  - latency: sequential GETs on one keep-alive connection, directly to a replica's port and
    through the gateway (/serve/NAME/), interleaved; p50/p99 of each and what the gateway adds;
  - throughput: `--concurrency` clients for `--seconds`, directly vs through the gateway (2
    replicas behind it), requests/s and their ratio;
  - scale-up: a service at 1 replica (1..3, 2 in flight per replica) gets `--concurrency` clients
    of 0.2 s requests; the time from that load step to a second replica answering requests.

    PYTHONPATH=src python bench/bench_services.py [--requests 2000] [--record]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _head
import _head

RESULTS = Path(__file__).with_name("RESULTS.md")
APP = [sys.executable, str(Path(__file__).resolve().parent.parent / "tests" / "e2e" / "serviceapp.py")]


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def wait_ready(c: httpx.Client, name: str, count: int, timeout: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        svc = c.get(f"/v1/services/{name}").json()
        if sum(r["phase"] == "ready" for r in svc["replicas"]) >= count:
            return dict(svc)
        time.sleep(0.1)
    raise RuntimeError(f"{name}: {count} replicas not ready in {timeout} s")


def latency(direct: str, gateway: str, headers: dict[str, str], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"direct": [], "gateway": []}
    with httpx.Client(timeout=30) as d, httpx.Client(timeout=30, headers=headers) as g:
        for _ in range(50):  # warm both connections
            d.get(direct)
            g.get(gateway)
        for _ in range(n):
            for key, client, url in (("direct", d, direct), ("gateway", g, gateway)):
                t = time.perf_counter()
                r = client.get(url)
                out[key].append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
    return out


async def throughput(url: str, headers: dict[str, str], concurrency: int, seconds: float) -> tuple[float, int]:
    done = errors = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, headers=headers, limits=limits) as c:

        async def worker() -> None:
            nonlocal done, errors
            while time.perf_counter() < stop:
                r = await c.get(url)
                done += 1
                errors += r.status_code != 200

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t), errors


async def scale_step(url: str, headers: dict[str, str], concurrency: int, first_port: int) -> float:
    """Seconds from the load step to the first answer from another replica than `first_port`."""
    t0 = time.perf_counter()
    found: asyncio.Event = asyncio.Event()
    took = 0.0
    async with httpx.AsyncClient(timeout=120, headers=headers) as c:

        async def worker() -> None:
            nonlocal took
            while not found.is_set():
                r = await c.get(url)
                if r.status_code == 200 and r.json()["port"] != first_port and not found.is_set():
                    took = time.perf_counter() - t0
                    found.set()

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), 300)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="sequential requests per path for latency")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=3, help="load steps (scale-up trials)")
    ap.add_argument("--record", action="store_true", help="append the result to bench/RESULTS.md")
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-services-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o711)
        head = _head.start(8, root / "data", root / "head.log")
        try:
            with httpx.Client(base_url=head.url, headers=head.headers, timeout=30) as api:
                body = {"name": "b", "command": APP, "gpus": 0.25, "readiness": "/health", "workdir": "/"}
                api.post("/v1/services", json={**body, "min_replicas": 2, "max_replicas": 2}).raise_for_status()
                svc = wait_ready(api, "b", 2)
                port = next(r["port"] for r in svc["replicas"])  # type: ignore[index]
                direct, gateway = f"http://127.0.0.1:{port}/", f"{head.url}/serve/b/"
                lat = latency(direct, gateway, head.headers, args.requests)
                rps_direct, err_d = asyncio.run(throughput(direct, {}, args.concurrency, args.seconds))
                rps_gateway, err_g = asyncio.run(throughput(gateway, head.headers, args.concurrency, args.seconds))
                api.delete("/v1/services/b").raise_for_status()
                steps = []
                for i in range(args.steps):
                    name = f"s{i}"
                    spec = {**body, "name": name, "min_replicas": 1, "max_replicas": 3, "target_concurrency": 2}
                    api.post("/v1/services", json=spec).raise_for_status()
                    svc = wait_ready(api, name, 1)
                    first = next(r["port"] for r in svc["replicas"])  # type: ignore[index]
                    url = f"{head.url}/serve/{name}/slow?s=0.2"
                    steps.append(asyncio.run(scale_step(url, head.headers, args.concurrency, first)))
                    api.delete(f"/v1/services/{name}").raise_for_status()
        finally:
            problems = head.log_problems()
            head.stop()
    load_after = os.getloadavg()
    p = {k: (quantile(v, 0.5) * 1000, quantile(v, 0.99) * 1000) for k, v in lat.items()}
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"`PYTHONPATH=src python bench/bench_services.py --requests {args.requests} --concurrency "
        f"{args.concurrency} --seconds {args.seconds:g} --steps {args.steps}` ({time.strftime('%Y-%m-%d %H:%M')})",
        f"Machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (`uptime` after: {uptime}).",
        "Replica: tests/e2e/serviceapp.py (stdlib ThreadingHTTPServer), 2 replicas of 0.25 virtual GPU.",
        "",
        "| figure | direct to a replica | through the gateway | gateway adds / ratio |",
        "|---|---|---|---|",
        f"| latency p50, sequential, keep-alive | {p['direct'][0]:.2f} ms | {p['gateway'][0]:.2f} ms "
        f"| +{p['gateway'][0] - p['direct'][0]:.2f} ms |",
        f"| latency p99 | {p['direct'][1]:.2f} ms | {p['gateway'][1]:.2f} ms "
        f"| +{p['gateway'][1] - p['direct'][1]:.2f} ms |",
        f"| requests/s, {args.concurrency} clients | {rps_direct:.0f} (1 replica, {err_d} errors) "
        f"| {rps_gateway:.0f} (2 replicas, {err_g} errors) | {rps_gateway / rps_direct:.2f}x |",
        f"| load step to a 2nd replica answering (median of {len(steps)}) | | "
        f"{statistics.median(steps):.2f} s ({', '.join(f'{s:.2f}' for s in steps)}) | |",
    ]
    if problems:
        lines += ["", "Head log problems:", *(f"    {x}" for x in problems)]
    text = "\n".join(lines)
    print(text)
    if args.record:
        with RESULTS.open("a") as f:
            f.write(f"\n## Services: the gateway's cost and scale-up time (issue 23)\n\n{text}\n")


if __name__ == "__main__":
    main()
