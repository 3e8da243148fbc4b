"""The SDK's client against httpx's: submissions/s and the caller's CPU per call, one head.

  PYTHONPATH=src:bench .venv/bin/python bench/bench_client.py [--rounds 3] [--jobs 800]

Why: a script that submits a sweep pays its client's CPU per call, and on a shared machine that
CPU is taken from the head (issue 18). The baseline is what the SDK was built on until this
round: an `httpx.Client` with a kept connection posting the same body. Both run against one
fresh head (8 virtual GPUs, `sleep 1000` jobs, so nothing ends), alternated round by round, each
at 1 client and at 8 (threads, a client each), and report medians: submissions/s, the caller's
CPU per call (this process's CPU over the run / calls) and the head's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx

import _head
import bench_submit
from bench_submit import log, sdk_submitter
from gpucluster import userconfig

BODY = {"command": ["sleep", "1000"], "gpus": 1}


def httpx_submitter(head: _head.Head, made: list[Callable[[], None]]) -> Callable[[], Callable[[], None]]:
    def make() -> Callable[[], None]:
        c = httpx.Client(base_url=head.url, timeout=60, headers=head.headers)
        made.append(c.close)

        def submit() -> None:
            r = c.post("/v1/jobs", json=BODY)
            if r.status_code != 201:
                raise _head.HeadError(f"{r.status_code}: {r.text[:200]}")

        return submit

    return make


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=800, help="submissions per run")
    p.add_argument("--clients", type=int, default=8, help="threads of the second run (default 8)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-client-"))
    head = _head.start(8, work / "data", work / "head.log")
    os.environ[userconfig.ENV_PATH] = str(work / "gpucluster-config.yaml")
    load0 = os.getloadavg()
    figures: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    try:
        for rnd in range(args.rounds):
            for clients in (1, args.clients):
                for name, submitter in (("httpx", httpx_submitter), ("sdk", sdk_submitter)):
                    made: list[Callable[[], None]] = []
                    try:
                        r = bench_submit.submit_rate(args.jobs, clients, submitter(head, made), head.proc.pid).result()
                    finally:
                        for close in made:
                            close()
                    rate = float(r["jobs_per_s"])
                    mine = float(r["client_cores_busy"]) / rate * 1000
                    theirs = float(r["server_cores_busy"] or 0) / rate * 1000
                    figures.setdefault((name, clients), []).append((rate, mine, theirs))
                    log(f"round {rnd} {name} x{clients}: {rate:.0f}/s, caller {mine:.3f}, head {theirs:.3f} ms a call")
    finally:
        head.stop()
    print(f"machine: {os.cpu_count()} cores; load average before {load0}, after {os.getloadavg()}")
    print(f"{args.jobs} submissions a run, {args.rounds} rounds alternated; medians")
    print(f"{'clients':>8} {'figure':<26} {'httpx':>10} {'sdk':>10} {'sdk/httpx':>10}")
    for clients in (1, args.clients):
        for i, what in enumerate(("submissions/s", "caller CPU ms per call", "head CPU ms per call")):
            base = statistics.median(f[i] for f in figures[("httpx", clients)])
            this = statistics.median(f[i] for f in figures[("sdk", clients)])
            print(f"{clients:>8} {what:<26} {base:>10.3f} {this:>10.3f} {this / base:>9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
