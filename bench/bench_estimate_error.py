"""How far estimated starts are from real ones on a real head: a queue of jobs stopped at their
time limit, one GPU, each job's first recorded estimate against its actual start.

Why this shape: every job ahead in line ends at its limit, so each start depends on how fast the
head notices the limit, stops the job and starts the next one (issue 16: starts ran late by
0.3-0.4 s per job ahead, as none of that was modelled). A warm-up batch first gives the head a
history to learn its latencies from (head/latency.py); the measured batch follows.

    PYTHONPATH=src:. python bench/bench_estimate_error.py [--jobs 8] [--warmup 4] [--limit 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from bench._head import start


def run_batch(c: httpx.Client, jobs: int, limit: float, timeout: float) -> list[tuple[int, float, float]]:
    """Submit `jobs` jobs, each stopped at `limit`; (position, first estimate, actual start) of
    each job that waited (position 2 on: the first starts at once)."""
    ids = []
    for _ in range(jobs):
        body = {"command": ["sleep", "1000"], "gpus": 1, "time_limit": limit}
        ids.append(c.post("/v1/jobs", json=body).raise_for_status().json()["id"])
    first: dict[int, float] = {}
    started: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(started) < len(ids) and time.monotonic() < deadline:
        for job_id in ids:
            if job_id in started:
                continue
            j = c.get(f"/v1/jobs/{job_id}").raise_for_status().json()
            if j["state"] == "queued" and j.get("estimated_start") and job_id not in first:
                first[job_id] = j["estimated_start"]
            if j.get("started_at") is not None:
                started[job_id] = j["started_at"]
        time.sleep(0.05)
    return [(n + 1, first[i], started[i]) for n, i in enumerate(ids) if i in first and i in started]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=8, help="jobs in the measured batch")
    p.add_argument("--warmup", type=int, default=4, help="jobs run first, for the head's history")
    p.add_argument("--limit", type=float, default=2.0, help="each job's time limit, seconds")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gc-est-") as tmp:
        head = start(1, Path(tmp) / "data", Path(tmp) / "head.log")
        try:
            with httpx.Client(base_url=head.url, headers=head.headers, timeout=30) as c:
                budget = (args.jobs + args.warmup) * (args.limit + 5) + 60
                if args.warmup:
                    run_batch(c, args.warmup, args.limit, budget)
                rows = run_batch(c, args.jobs, args.limit, budget)
        finally:
            head.stop()
    if not rows:
        raise SystemExit("no job got an estimate before it started")
    errors = [(pos, actual - est) for pos, est, actual in rows]
    print(f"{'position':>8} {'estimate error (actual - estimated), s':>40}")
    for pos, err in errors:
        print(f"{pos:>8} {err:>40.2f}")
    ahead = [(pos - 1, err) for pos, err in errors if pos > 1]
    slope = statistics.linear_regression([a for a, _ in ahead], [e for _, e in ahead]).slope if len(ahead) > 1 else 0.0
    print(f"mean error {statistics.mean(e for _, e in errors):+.2f} s, mean |error| "
          f"{statistics.mean(abs(e) for _, e in errors):.2f} s, per job ahead {slope:+.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
