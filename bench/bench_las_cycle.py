"""One scheduling cycle at scale under default, las and las + gittins, side by side (issue 25).

  python bench/bench_las_cycle.py [--nodes 10000] [--jobs 100000] [--cycles 3] [--shapes 200]

What the head would pay per cycle if `las` or `las-gittins` were its policy: bench_scheduler.py's
snapshot (Philly's GPU counts, 50 teams with quotas, ~90% full), the same for every policy, with
a third of the queued jobs having run before (attained service drawn from 0-20 GPU-hours, the
share of requeued jobs on Philly under `las`) and, for `las-gittins`, every queued job given one
of `--shapes` learned distributions (a predictor fed 256 log-normal run times per shape, the
head's window), plus the head's own step of mapping each queued job to its shape's
distribution (RuntimePredictor.distribution once per shape, a dict lookup per job), timed
apart. Each policy's cycles run alternately in this one process, collector paused as the head
pauses it; CPU seconds (on a shared machine wall time mostly measures the others). Prints the
median of `--cycles` cycles per policy and its ratio to default's.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scheduler import build
from gpucluster.core.attained import Ordering
from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.policy import Policy
from gpucluster.core.runtime_predict import FinishedRun, JobShape, RunDistribution, RuntimePredictor
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot

H = 3600.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--shapes", type=int, default=200)
    a = ap.parse_args()
    rng = random.Random(11)
    snap, default = build(a.nodes, a.jobs)
    queued = snap.queued
    attained = {q.job_id: rng.uniform(0, 20 * H) for q in queued if rng.random() < 1 / 3}
    predictor = RuntimePredictor()
    shapes = [JobShape(f"u{i}", f"t{i % 50}", f"name:w{i}", 8, "H100", None) for i in range(a.shapes)]
    for shape in shapes:
        mu = rng.uniform(5, 11)  # medians from ~2.5 minutes to ~17 hours
        for _ in range(256):
            predictor.add(FinishedRun(shape, rng.lognormvariate(mu, 1.5)))
    shape_of = {q.job_id: shapes[rng.randrange(len(shapes))] for q in queued}

    def dists() -> dict[int, RunDistribution]:
        by_shape = {s: predictor.distribution(s) for s in shapes}
        return {q.job_id: d for q in queued if (d := by_shape[shape_of[q.job_id]]) is not None}

    t0 = time.process_time()
    runtime_dist = dists()
    mapping_s = time.process_time() - t0
    las = replace(default, ordering=Ordering(mode="las", preempt=True))
    gittins = replace(default, ordering=Ordering(mode="las", preempt=True, runtime_model="gittins"))
    snaps: dict[str, tuple[Snapshot, Policy]] = {
        "default": (replace(snap, capacity=CapacityIndex()), default),
        "las": (replace(snap, capacity=CapacityIndex(), attained=attained), las),
        "las-gittins": (replace(snap, capacity=CapacityIndex(), attained=attained, runtime_dist=runtime_dist), gittins),
    }
    times: dict[str, list[float]] = {k: [] for k in snaps}
    starts: dict[str, int] = {}
    for _ in range(a.cycles + 1):  # the first cycle of each builds its capacity index: not counted
        for name, (s, pol) in snaps.items():
            gc.disable()
            t0 = time.process_time()
            try:
                plan = decide(s, pol, 0.0)
            finally:
                gc.enable()
            times[name].append(time.process_time() - t0)
            starts[name] = len(plan.starts)
    print(f"{a.nodes} nodes x 8 GPUs, {len(queued)} queued, {len(attained)} ran before, {a.shapes} shapes")
    base = statistics.median(times["default"][1:])
    for name, ts in times.items():
        med = statistics.median(ts[1:])
        worst, ratio = max(ts[1:]), med / base
        print(f"{name:<12} median {med:.3f} CPU-s  max {worst:.3f}  {ratio:.2f}x default  starts {starts[name]}")
    print(f"las-gittins's per-cycle mapping of queued jobs to distributions: {mapping_s:.3f} CPU-s")


if __name__ == "__main__":
    main()
