"""A dry run at scale, piece by piece (`gpucluster submit --dry-run`, `why --what-if`; issue 15):

  python bench/bench_dry_run.py [--nodes 10000] [--jobs 100000] [--reps 3]

bench_scheduler.py's snapshot (10,000 nodes x 8 GPUs ~90% full, 100,000 queued). What
head/dry_run.py pays, CPU seconds, medians of `--reps`, collector paused:
- `capacity`: `Capacity(nodes, running)`, the free capacity a dry run builds afresh (it never
  touches the loop's kept index): the first build in the process (the nodes' inventory built
  too, as a head's first cycle after a start builds it), then again (the inventory kept,
  core/inventory.py), and on the same nodes with nothing running.
- `dry run`: per policy, `decide` on the snapshot with an 8-GPU probe job added, `capacity=None`
  and `queue_index=None` as head/dry_run.py makes it (after one cycle through a capacity index,
  as the loop's), then the estimate replay for the probe: the whole queue's (`estimate_starts`)
  and the dry run's, which stops at the probe (`dry_run.through`), with the probe's place in line.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_las_cycle import _timed  # CPU-s with the collector paused, as the head pauses it
from bench_scheduler import build
from gpucluster.core.attained import Ordering
from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.estimate import DEFAULT_LIMIT, estimate_starts
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Priority
from gpucluster.head.dry_run import PROBE_ID, through


def _median(call: Callable[[], object], reps: int) -> float:
    return statistics.median(_timed(call)[0] for _ in range(reps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    snap, default = build(a.nodes, a.jobs)
    print(f"{a.nodes} nodes x 8 GPUs, {len(snap.running)} running, {len(snap.queued)} queued")
    first, _ = _timed(lambda: Capacity(snap.nodes, snap.running))
    again = _median(lambda: Capacity(snap.nodes, snap.running), a.reps)
    empty = _median(lambda: Capacity(snap.nodes, ()), a.reps)
    print(f"capacity  first {first:.3f}  again {again:.3f}  nothing running {empty:.3f} CPU-s")
    rng = random.Random(11)
    attained = {q.job_id: rng.uniform(0, 20 * 3600.0) for q in snap.queued if rng.random() < 1 / 3}
    las = replace(default, ordering=Ordering(mode="las", preempt=True))
    for name, policy, base in (("default", default, snap), ("las", las, replace(snap, attained=attained))):
        decide(replace(base, capacity=CapacityIndex()), policy, 0.0)  # the loop's cycle
        _dry_run(name, policy, base, a.reps)


def _dry_run(name: str, policy: Policy, base: Snapshot, reps: int) -> None:
    """One policy's `dry run` row (see the module docstring)."""
    job = JobRequest(PROBE_ID, 8.0, team="team07", priority=Priority.NORMAL, submitted_at=0.0)
    probe = replace(base, queued=(*base.queued, job), capacity=None, queue_index=None)
    plan = decide(probe, policy, 0.0)
    plan_s = _median(lambda: decide(probe, policy, 0.0), reps)
    runs = {PROBE_ID: 3600.0}
    whole = _median(lambda: estimate_starts(probe, policy, 0.0, plan, DEFAULT_LIMIT, runs=runs), reps)
    cut = through(plan, PROBE_ID)
    short = _median(lambda: estimate_starts(probe, policy, 0.0, cut, DEFAULT_LIMIT, runs=runs), reps)
    place = list(plan.waiting).index(PROBE_ID) + 1 if PROBE_ID in plan.waiting else None
    print(
        f"dry run {name:<8} decide {plan_s:.3f}  estimate: whole queue {whole:.3f}, to the probe {short:.3f} CPU-s"
        f"  (the probe {'starts' if place is None else f'waits, place {place:,} in line'})"
    )


if __name__ == "__main__":
    main()
