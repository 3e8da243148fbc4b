"""What placement's image affinity costs a scheduling cycle, and what it buys (issue 22).

Why: the tie-breaker (core/image_affinity.py) runs inside best-fit placement, on the cycle's
critical path. Measured on bench_scheduler.py's snapshot (Philly's GPU counts, 50 teams with
quotas, ~90% full), half of the queued jobs given one of 40 images, each image on 2% of the nodes:
one `decide` with `Snapshot.images` empty (the baseline: no preference, the same jobs and images
otherwise) and one with it, interleaved, each a fresh capacity. Prints the median CPU seconds of
each (CPU: on a machine others load, wall time mostly measures them), the ratio, that both start
the same jobs at the same sizes, and how many image jobs started on a node with their image.

  PYTHONPATH=src python bench/bench_image_affinity.py [--nodes 2000] [--jobs 20000] [--cycles 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scheduler import build
from gpucluster.core import scheduler
from gpucluster.core.types import Plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--cycles", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(22)
    snap, policy = build(args.nodes, args.jobs)
    names = [n.name for n in snap.nodes]
    images = [f"reg.example/team{i}/train:v1" for i in range(40)]
    queued = tuple(replace(j, image=rng.choice(images)) if rng.random() < 0.5 else j for j in snap.queued)
    where = {i: frozenset(rng.sample(names, max(1, len(names) // 50))) for i in images}
    plain, preferring = replace(snap, queued=queued), replace(snap, queued=queued, images=where)
    times: dict[str, list[float]] = {"baseline (no images known)": [], "image affinity": []}
    plans: dict[str, Plan] = {}
    for _ in range(args.cycles):
        for label, s in zip(times, (plain, preferring), strict=True):
            gc.disable()
            t0 = time.process_time()
            plans[label] = scheduler.decide(s, policy, 0.0)
            times[label].append(time.process_time() - t0)
            gc.enable()
    base, pref = (statistics.median(t) for t in times.values())
    a, b = plans.values()
    same = sorted((s.job_id, s.allocation.gpu_count) for s in a.starts) == sorted(
        (s.job_id, s.allocation.gpu_count) for s in b.starts
    )
    by_id = {j.job_id: j for j in queued}

    def on_holder(plan: Plan) -> tuple[int, int]:
        imaged = [s for s in plan.starts if by_id[s.job_id].image is not None]
        hits = sum(1 for s in imaged if s.allocation.slices[0].node in where[by_id[s.job_id].image or ""])
        return hits, len(imaged)

    load = os.getloadavg()[0]
    print(f"{args.nodes} nodes, {args.jobs} queued, {len(a.starts)} starts; {platform.node()}, load {load:.2f}")
    for label, t in times.items():
        print(f"  {label:28s} median {statistics.median(t):.3f} s CPU  ({', '.join(f'{x:.3f}' for x in t)})")
    print(f"  ratio affinity/baseline: {pref / base:.2f}x; same starts and sizes: {same}")
    for label, plan in plans.items():
        hits, n = on_holder(plan)
        print(f"  {label:28s} image jobs started on a node with their image: {hits} of {n}")


if __name__ == "__main__":
    main()
