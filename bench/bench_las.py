"""Least attained service against FIFO, FIFO + backfill, default and the oracle (issue 25).

  python bench/bench_las.py [--days 7] [--start-day 20] [--nodes 20] [--policies fifo,...]
      [--workers 1] [--trace CSV ...] [--format philly|pollux|tiresias] [--gpus-per-node 8]
      [--checkpoint 1h]

Replays a window of the shared Philly trace (`--days` from `--start-day` days after its first
submission) through `gpucluster simulate`'s own code (sim.run.simulate) on `--nodes` x 8 GPUs,
with the issue's settings: no failures, every job normal priority, no time limits (the oracle
alone gets perfect ones), jobs checkpointing every `--checkpoint` (LAS preempts only jobs that
checkpoint). Why a window and fewer nodes: the whole trace takes minutes per policy on this
shared machine; a window on a cluster sized for the same contention (~60-70% busy) keeps the
figures comparable. Prints per policy: utilisation, mean / p99 wait to first start, mean time not running (every
wait, those after a preemption too), mean JCT,
Jain's index (mean over contended samples), preemptions and CPU seconds of each policy's run.
`--days 0` replays the whole trace.

Other workloads (`--format pollux|tiresias`, `--trace` one or more files, e.g. the Pollux paper's
eight 160-job workloads or Tiresias's 60-job one): each file is replayed whole (no window, no
64-GPU cut) on `--nodes` x `--gpus-per-node` GPUs, one table per file, then the mean of each
figure over the files (with several). Pollux records no run time: the simulator fills one per
job from its application, seeded (`--seed`).
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from gpucluster.sim.run import SimulateOptions, simulate

ROOT = Path(__file__).resolve().parent.parent
PHILLY = ROOT.parent / "shared" / "traces" / "philly" / "philly-2017-09-to-11.csv"

SPEC = """name: philly-window
node_groups:
  - {{name: philly, count: {nodes}, gpus_per_node: {gpus}, gpu_model: P100-12GB, gpu_memory: 12GiB}}
failures: {{gpu_failures_per_day: 0}}
checkpoints: {{interval: {checkpoint}, cost: 1m, restart: 2m}}
trace_fill: {{priority: normal, gpu_type: any, time_limit: none}}
"""


def window(src: Path, dst: Path, start_day: float, days: float) -> int:
    """The rows of `src` submitted in [first + start_day, first + start_day + days), to `dst`."""
    with src.open(newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    at = [datetime.fromisoformat(r[0]) for r in body]
    lo = min(at) + timedelta(days=start_day)
    hi = lo + timedelta(days=days)
    kept = [r for r, t in zip(body, at, strict=True) if lo <= t < hi and int(r[2]) <= 64]
    with dst.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(kept)
    return len(kept)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, nargs="+", default=[PHILLY])
    ap.add_argument("--format", default="philly", choices=("philly", "pollux", "tiresias"))
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--unit", default="h", choices=("h", "min"), help="of the wait and JCT columns")
    ap.add_argument("--start-day", type=float, default=20.0)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--checkpoint", default="1h")
    ap.add_argument("--policies", default="fifo,fifo-backfill,age,default,las-gittins,oracle-sjf")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.unit == "min":
        COLS[1:5] = [(h.replace(" h", " min"), w + 2, ".1f") for h, w, _ in COLS[1:5]]
    sums: dict[str, list[float]] = {}
    for path in a.trace:
        for name, values in run_one(a, path).items():
            sums.setdefault(name, [0.0] * len(values))
            sums[name] = [x + y for x, y in zip(sums[name], values, strict=True)]
    if len(a.trace) > 1:
        print(f"mean over the {len(a.trace)} files")
        _header()
        for name, total in sums.items():
            _row(name, [x / len(a.trace) for x in total])


COLS = [
    ("busy", 6, ".2f"),
    ("mean wait h", 13, ".2f"),
    ("p99 wait h", 12, ".1f"),
    ("not running h", 15, ".2f"),
    ("mean JCT h", 12, ".2f"),
    ("Jain", 7, ".4f"),
    ("preempt", 9, ".0f"),
    ("CPU s", 7, ".0f"),
]


def _header() -> None:
    print(f"{'policy':<14}" + "".join(f"{h:>{w}}" for h, w, _ in COLS))


def _row(name: str, values: list[float]) -> None:
    print(f"{name:<14}" + "".join(f"{v:>{w}{f}}" for v, (_, w, f) in zip(values, COLS, strict=True)))


def run_one(a: argparse.Namespace, path: Path) -> dict[str, list[float]]:
    """One trace file through every policy: prints its table, returns policy -> its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        trace, spec = Path(tmp) / "window.csv", Path(tmp) / "cluster.yaml"
        if a.format != "philly":
            trace, n = path, sum(1 for _ in path.open()) - 1
        elif a.days > 0:
            n = window(path, trace, a.start_day, a.days)
        else:
            n = window(path, trace, -1.0, 3650.0)
        spec.write_text(SPEC.format(nodes=a.nodes, gpus=a.gpus_per_node, checkpoint=a.checkpoint))
        opts = SimulateOptions(
            cluster=spec, trace=trace, out=None, policies=tuple(a.policies.split(",")), fmt=a.format, seed=a.seed
        )
        t0, w0 = os.times(), time.perf_counter()
        out = simulate(opts, write=False, workers=a.workers)
        t1 = os.times()  # the policies run in forked children with --workers > 1: count theirs too
        cpu = sum(t1[:4]) - sum(t0[:4])
        wall = time.perf_counter() - w0
    if a.format != "philly":
        span = f"{path.name} ({a.format}), whole"
    else:
        span = f"days {a.start_day:g}-{a.start_day + a.days:g} of the trace" if a.days > 0 else "the whole trace"
    print(f"{n} jobs, {span}, {a.nodes} nodes x {a.gpus_per_node} GPUs, {cpu:.0f} CPU-s, {wall:.0f} s wall")
    _header()
    got: dict[str, list[float]] = {}
    for name, m in out.metrics["policies"].items():
        d, jct, unit = m["queueing_delay_s"], m["jct_s"], 3600 if a.unit == "h" else 60
        jain = m["fairness"]["jain_mean_contended"]
        res = next(r for r in out.results if r.policy.name == name)
        # Every wait of a job, after a preemption too (wait is to its first start only).
        not_running = m["time_not_running_s"]["mean"] / unit
        got[name] = [
            m["utilisation"]["mean"],
            d["mean"] / unit,
            d["p99"] / unit,
            not_running,
            jct["mean"] / unit,
            jain if jain is not None else float("nan"),
            float(res.preemptions),
            res.cpu_s,
        ]
        _row(name, got[name])
    return got


if __name__ == "__main__":
    main()
