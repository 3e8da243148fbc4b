"""10,000 open log follows against one head: does the API stay answerable? (issue 14)

Why: a follow used to sleep on a worker thread between polls, so ~40 quiet follows (a few
dashboard tabs) held every thread and whoami, submit and /v1/health all timed out. Now a follow
is a coroutine woken by one watcher per event loop (src/gpucluster/api/follow.py). This script
starts a head (`gpucluster up --virtual-gpus 8`), creates USERS users (each may hold the
default 100 follows), starts JOBS quiet jobs that wait for a gate file, opens FOLLOWS follows
over raw asyncio sockets (tests/e2e/followkit.py) spread over the jobs, then measures:

- how long opening them took, and the head's file descriptors and memory with them open;
- the head's CPU use while they are open and quiet (the watcher's cost);
- latency of /v1/health, /v1/whoami and a submission, sequentially, with all of them open;
- after the gate file appears (each job prints a line and ends): the time until every follow
  has its line and its end.

Run: `PYTHONPATH=src python bench/bench_follow.py [--follows 10000] [--record]`; --record
appends the result, with the machine and its load average, to bench/RESULTS.md. Both the head
and this client need FOLLOWS+ file descriptors: each raises its soft limit to the hard one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.e2e.followkit
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _head

from tests.e2e import followkit

import _head

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def raise_fd_limit(need: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < need:
        raise SystemExit(f"this client needs {need} open files and the hard limit is {hard}: raise it (ulimit -Hn)")
    return hard


def proc_stats(pid: int) -> tuple[int, float, float]:
    """(open descriptors, resident MiB, CPU seconds) of a process."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss = next(
        int(ln.split()[1]) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("VmRSS")
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return fds, rss / 1024, cpu


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def measure(head: _head.Head, follows: int, users: int, jobs: int, gate: Path) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    async with httpx.AsyncClient(base_url=head.url, headers=head.headers, timeout=60) as admin:
        tokens = []
        for n in range(users):
            r = await admin.post("/v1/admin/users", json={"name": f"u{n}", "teams": ["default"]})
            r.raise_for_status()
            tokens.append(r.json()["token"])
        job_ids = []
        for _ in range(jobs):
            cmd = ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.5; done; echo released"]
            r = await admin.post("/v1/jobs", json={"command": cmd, "gpus": 0.01})
            r.raise_for_status()
            job_ids.append(r.json()["id"])
        deadline = time.monotonic() + 120
        while True:
            states = [(await admin.get(f"/v1/jobs/{j}")).json()["state"] for j in job_ids]
            if all(s == "running" for s in states):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"jobs did not all start: {states}")
            await asyncio.sleep(0.5)

        streams: list[followkit.Stream] = []
        began = time.monotonic()
        step = 200  # opened 200 at a time: each user's 100 within its token's burst
        for start in range(0, follows, step):
            batch = [
                followkit.follow(head.url, job_ids[n % jobs], tokens[n % users], timeout=120)
                for n in range(start, min(follows, start + step))
            ]
            streams += await asyncio.gather(*batch)
        out["open_s"] = time.monotonic() - began
        bad = [s.status for s in streams if s.status != 200]
        if bad:
            raise SystemExit(f"{len(bad)} follows were refused: statuses {sorted(set(bad))}")
        await asyncio.sleep(2)  # let the watcher settle
        fds, rss, cpu0 = proc_stats(head.proc.pid)
        out["head_fds"], out["head_rss_mib"] = fds, rss
        t0 = time.monotonic()
        await asyncio.sleep(10)
        _, _, cpu1 = proc_stats(head.proc.pid)
        out["head_cpu_idle_pct"] = 100 * (cpu1 - cpu0) / (time.monotonic() - t0)

        for name, call in (
            ("health", lambda: admin.get("/v1/health")),
            ("whoami", lambda: admin.get("/v1/whoami")),
            ("submit", lambda: admin.post("/v1/jobs", json={"command": ["true"], "gpus": 0.01})),
        ):
            times = []
            for _ in range(50):
                t = time.monotonic()
                r = await call()
                r.raise_for_status()
                times.append(time.monotonic() - t)
            out[f"{name}_p50_ms"] = 1000 * statistics.median(times)
            out[f"{name}_p99_ms"] = 1000 * pct(times, 0.99)

        t = time.monotonic()
        gate.touch()
        bodies = await asyncio.gather(*(s.wait_closed_by_server(300) for s in streams))
        out["release_all_s"] = time.monotonic() - t
        got = sum(1 for b, s in zip(bodies, streams, strict=True) if b"released" in b and s.ended)
        out["streams_complete"] = f"{got}/{follows}"
        for s in streams:
            s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--follows", type=int, default=10_000)
    ap.add_argument("--users", type=int, default=0, help="[default: follows / 100, the per-user cap]")
    ap.add_argument("--jobs", type=int, default=50, help="quiet jobs the follows are spread over")
    ap.add_argument("--record", action="store_true", help="append the result to bench/RESULTS.md")
    args = ap.parse_args()
    users = args.users or max(1, -(-args.follows // 100))
    hard = raise_fd_limit(args.follows + 256)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
        root = Path(tmp)
        head = _head.start(8, root / "data", root / "head.log")
        try:
            result = asyncio.run(measure(head, args.follows, users, args.jobs, root / "go"))
        finally:
            problems = head.log_problems()
            head.stop()
    load_after = os.getloadavg()
    machine = (
        f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"open-files limit {hard}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    lines = [
        f"`PYTHONPATH=src python bench/bench_follow.py --follows {args.follows}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}): {args.follows} follows by {users} users over {args.jobs} quiet jobs.",
        f"Machine: {machine}.",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {k} | {v:.1f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in result.items()),
    ]
    if problems:
        lines += ["", "Head log problems:", *(f"    {p}" for p in problems)]
    text = "\n".join(lines)
    print(text)
    if args.record:
        with RESULTS.open("a") as f:
            f.write(f"\n## Open log follows (issue 14)\n\n{text}\n")


if __name__ == "__main__":
    main()
