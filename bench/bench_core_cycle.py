"""One cycle at 10,000 nodes x 8 GPUs with 100,000 queued, a baseline tree beside this one (issue 15).

  python bench/bench_core_cycle.py --baseline DIR [--nodes 10000] [--jobs 100000] [--cycles 5]

issue 15 moved the garbage collector's pause out of `decide` (the caller's choice: the head's
API threads share the process-wide collector; the head's loop and the simulator pause it around
their own call) and the capacity fork's undo into an explicit trial scope. This measures a cycle
with a kept capacity index, the collector left on and paused by the caller, each in a fresh
process, against the baseline tree's `decide` (which paused the collector itself),
on bench_scheduler.py's snapshot (Philly's GPU counts, 50 teams with quotas, ~90% full).
Prints the first cycle, the median and the slowest of the others (CPU seconds: on a machine
others load, wall time mostly measures them), and baseline / this.

With CPUs and memory (issue 16: `--cpus`/`--mem` beside GPUs) the last rows run this tree on the
same snapshot with every node holding 96 CPUs and 1 TiB and every job, running or queued, asking
4 CPUs and 32 GiB per GPU (a policy's `resources:` default), then 2-12 CPUs and 16-120 GiB per
GPU drawn per job (16x the distinct requests, so fewer jobs are answered from an equal one's
wait): placement then checks all three resources on every node it considers. The GPU side of
the snapshot is the same. `--host-baseline` runs those two rows on the baseline tree too, each
beside its own (for a change to how CPUs and memory are planned). `--no-preemption` turns the
policy's preemption off: the first job in line per model then takes a backfill reservation
(with preemption on it preempts, so no cycle of this snapshot reserves anything).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, statistics, sys, time
from dataclasses import replace
sys.path.insert(0, sys.argv[1])
from bench_scheduler import build
from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core import scheduler
nodes, jobs, cycles, pause = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "paused"
host = sys.argv[6]
snap, policy = build(nodes, jobs, host=True, varied=host == "varied") if host != "gpus" else build(nodes, jobs)
if sys.argv[7] == "no-preemption":
    from gpucluster.core.policy import Preemption
    policy = replace(policy, preemption=Preemption(enabled=False))
snap = replace(snap, capacity=CapacityIndex())
times = []
for _ in range(cycles + 1):
    t0 = time.process_time()
    if pause:
        gc.disable()
    try:
        plan = scheduler.decide(snap, policy, 0.0)
    finally:
        gc.enable()
    times.append(time.process_time() - t0)
rest = sorted(times[1:])
got = {"first_s": times[0], "median_s": statistics.median(rest), "max_s": rest[-1], "starts": len(plan.starts)}
print(json.dumps(got))
"""


def run(
    src: Path, nodes: int, jobs: int, cycles: int, mode: str, host: str = "gpus", preempt: str = "preemption"
) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT / "bench"), str(nodes), str(jobs), str(cycles), mode, host, preempt],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"{src} ({mode}): {out.stderr.strip()[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, required=True, help="a tree with src/ (decide pausing the collector)")
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--only-paused", action="store_true", help="skip the rows with the collector left on")
    ap.add_argument(
        "--host-baseline",
        action="store_true",
        help="also run the baseline tree with CPUs and memory in every request (each such row is then "
        "compared with the baseline row of the same requests)",
    )
    ap.add_argument(
        "--no-preemption",
        action="store_true",
        help="preemption off: each model's first job in line takes a backfill reservation (with it "
        "on, it preempts and no reservation is made)",
    )
    args = ap.parse_args()
    rows = [
        ("baseline, gc paused", args.baseline / "src", "paused", "gpus"),
        ("this, gc left on", ROOT / "src", "on", "gpus"),
        ("this, gc paused (head's, sim's choice)", ROOT / "src", "paused", "gpus"),
        ("this, paused, CPUs+memory per GPU, all jobs", ROOT / "src", "paused", "host"),
        ("this, paused, varied CPUs+memory, all jobs", ROOT / "src", "paused", "varied"),
    ]
    if args.host_baseline:
        rows[3:3] = [("baseline, paused, CPUs+memory per GPU, all jobs", args.baseline / "src", "paused", "host")]
        rows[5:5] = [("baseline, paused, varied CPUs+memory, all jobs", args.baseline / "src", "paused", "varied")]
    if args.only_paused:
        rows = [r for r in rows if r[2] == "paused"]
    bases: dict[str, float] = {}
    for name, src, mode, host in rows:
        got = run(src, args.nodes, args.jobs, args.cycles, mode, host, "no-preemption" if args.no_preemption else "")
        base = bases.setdefault(host if args.host_baseline else "gpus", got["median_s"])
        print(
            f"{name:50s} first {got['first_s']:.3f} s  median {got['median_s']:.3f} s  max {got['max_s']:.3f} s"
            f"  starts {got['starts']:.0f}  baseline/this {base / got['median_s']:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
