"""The head's CPU per trivial job in a drain, this tree against a baseline tree, alternated.

  PYTHONPATH=src:bench .venv/bin/python bench/bench_head_drain.py --baseline /path/to/other/src

Why beside bench_jobcost.py: that harness measures every figure of issue 18 once per system, so
its "head CPU per job" is one drain per tree, and on a machine shared with other work one drain
moves by 20-30%. This runs only that drain (bench_jobcost.gc_drain: N `true` jobs from one
client, then until all ended; the head process's CPU from /proc), `--rounds` times per tree,
the trees alternated so that a change in the machine's load falls on both, and prints each
tree's median and the ratio. A fresh head (bench_submit.Phase) per drain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import bench_jobcost
import bench_submit
from bench_submit import Result, log


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="a baseline checkout's src dir")
    p.add_argument("--jobs", type=int, default=300, help="trivial jobs per drain")
    p.add_argument("--rounds", type=int, default=3, help="drains per tree")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--wait-timeout", type=float, default=600)
    args = p.parse_args()
    trees: dict[str, Path | None] = {"this": None, "baseline": args.baseline}
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    wall: dict[str, list[float]] = {name: [] for name in trees}
    load_before = os.getloadavg()
    report: Result = {}
    with tempfile.TemporaryDirectory(prefix="bench-head-drain-") as tmp:
        for r in range(args.rounds):
            for name, src in trees.items():
                with bench_submit.Phase(Path(tmp), f"{name}-{r}", args.gpus, report, src=src) as head:
                    drain = bench_jobcost.gc_drain(head, args.jobs, args.wait_timeout)
                log(f"{name} round {r}: {drain}")
                cpu[name].append(float(drain["head_cpu_ms_per_job"]))
                wall[name].append(float(drain["seconds"]))
    load_after = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores; load average before {load_before}, after {load_after}")
    print(f"{args.jobs} trivial jobs per drain, {args.rounds} drains per tree, alternated; baseline {args.baseline}")
    for name in trees:
        print(
            f"{name:9s} head CPU per job (ms): median {statistics.median(cpu[name]):.2f} of {cpu[name]};"
            f" drain wall (s): median {statistics.median(wall[name]):.2f}"
        )
    ratio = statistics.median(cpu["this"]) / statistics.median(cpu["baseline"])
    print(f"this/baseline, head CPU per job: {ratio:.2f}x")
    if report.get("head_problems"):
        print(f"head problems: {report['head_problems']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
