"""fsyncs the head makes per acknowledged submission, from one client (issue 18).

Why this figure: a lone client's submissions/s is bounded by the commits each submission waits
for, and on a shared 2-core machine the rate itself swings with the load (5x between runs at load
20), while the count of fsync/fdatasync calls does not. Each submission must cost one durable
commit (its own row); the loop's rewrite of the queued jobs' wait reasons after it cost a second.

For this tree and a baseline tree (`--baseline`, a checkout's `src`), one after the other: a fresh
head (8 virtual GPUs), `strace -f -c -e trace=fsync,fdatasync` attached to it, N held 1-GPU jobs
POSTed over one reused connection (held: nothing starts, so only the submit path is counted),
then the calls counted. The rate is printed too, under strace, for what it is worth.

Run: `PYTHONPATH=src:bench python bench/bench_submit_fsync.py --baseline /work/main/src [--jobs 200]`
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import _head


def measure(jobs: int) -> dict[str, float]:
    """In this process's gpucluster (PYTHONPATH): fsync calls per submission and the rate."""
    with tempfile.TemporaryDirectory(prefix="bench-fsync-") as tmp:
        head = _head.start(8, Path(tmp) / "data", Path(tmp) / "head.log")
        try:
            trace = subprocess.Popen(
                ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-p", str(head.proc.pid)],
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(2)  # strace attached to every thread
            with httpx.Client(base_url=head.url, headers=head.headers, timeout=60) as c:
                t0 = time.perf_counter()
                for _ in range(jobs):
                    r = c.post("/v1/jobs", json={"command": ["true"], "gpus": 1, "hold": True})
                    if r.status_code != 201:
                        raise SystemExit(f"submit refused: {r.status_code} {r.text}")
                rate = jobs / (time.perf_counter() - t0)
            time.sleep(1)  # the loop's cycle after the last submission
            trace.send_signal(signal.SIGINT)
            summary = trace.communicate(timeout=60)[1]
        finally:
            head.stop()
    calls = sum(
        int(f[3])
        for f in (ln.split() for ln in summary.splitlines())
        if len(f) >= 5 and f[-1] in ("fsync", "fdatasync")
    )
    return {"fsyncs": calls, "per_submission": calls / jobs, "rate": rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--baseline", type=Path, help="a checkout's src, measured the same way after this tree")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.jobs)))
        return
    trees = {"this tree": Path(__file__).resolve().parent.parent / "src"}
    if args.baseline:
        trees[f"baseline {args.baseline}"] = args.baseline.resolve()
    results = {}
    for name, src in trees.items():
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).resolve().parent}"}
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--jobs", str(args.jobs)], env=env, capture_output=True, text=True
        )
        if out.returncode != 0:
            raise SystemExit(f"{name}: {out.stderr.strip()}")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} cores; load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.jobs} held jobs"
    )
    for name, r in results.items():
        print(
            f"{name:<40} fsyncs {r['fsyncs']:>5.0f}  per submission {r['per_submission']:.2f}  rate {r['rate']:.0f}/s"
        )
    if args.baseline:
        this, base = results["this tree"], results[f"baseline {args.baseline}"]
        print(f"per submission, this / baseline: {this['per_submission'] / base['per_submission']:.2f}x")


if __name__ == "__main__":
    main()
