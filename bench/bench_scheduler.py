"""One scheduling cycle at scale: `decide` on 10,000 nodes x 8 GPUs of four models.

The cluster is first filled to about 90% with running jobs, then 100,000 jobs wait, with GPU
counts drawn from the real Philly trace and spread over 50 teams with quotas and priorities.
Reports the first cycle (which builds the capacity index the head keeps across cycles), the
median and p99 cycle time and admissions per second (jobs started per second of scheduling),
and the cost of the estimate replay for every queued job; then repeats with 10x the nodes
and 10x the jobs to show how the cost grows.
Baseline, side by side: the FIFO policy (no fair share, quota, backfill or preemption) on the
same snapshot, for the ratio of the full policy's cost.

    .venv/bin/python bench/bench_scheduler.py [--cycles 5] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.estimate import DEFAULT_LIMIT, estimate_starts
from gpucluster.core.policy import Policy, Team, fifo_policy
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, Gpu, JobRequest, Node, NodeSlice, Priority, RunningJob

PHILLY = Path(__file__).resolve().parents[2] / "shared" / "traces" / "philly" / "philly-2017-09-to-11.csv"
MODELS = [("H100-80GB", 81920), ("A100-80GB", 81920), ("A100-40GB", 40960), ("V100-32GB", 32768)]


def philly_sizes() -> list[int]:
    """GPU counts of the real Philly jobs (fallback: its published mix, if the trace is absent,
    said on stderr: a tree copied without `../shared` measured another job mix unawares)."""
    if PHILLY.exists():
        with open(PHILLY) as f:
            return [int(float(r["num_gpus"])) for r in csv.DictReader(f)]
    print(f"note: {PHILLY} is absent; using Philly's published size mix instead of the trace's", file=sys.stderr)
    return [1] * 93 + [2] * 2 + [4] * 2 + [8] * 3


# With `host`: every node has 96 CPUs and 1 TiB, and every job (running or queued) asks for CPUs
# and host memory: 4 CPUs and 32 GiB per GPU (what a policy's `resources:` gives every job that
# does not say), or with `varied` a per-GPU amount drawn from these (Slurm sites' usual range),
# which makes 16 times as many distinct requests. Placement then checks all three resources.
HOST_CPUS, HOST_MEM_MB = 96.0, 1024 * 1024
CPUS_PER_GPU = (2.0, 4.0, 8.0, 12.0)
MEM_PER_GPU_MB = (16 * 1024, 32 * 1024, 64 * 1024, 120 * 1024)


def build(
    nodes_n: int, jobs_n: int, seed: int = 7, host: bool = False, varied: bool = False
) -> tuple[Snapshot, Policy]:
    rng = random.Random(seed)
    host_rng = random.Random(seed + 1)  # its own stream: the GPU side is the same with or without
    nodes = []
    for i in range(nodes_n):
        model, mem = MODELS[i % len(MODELS)]
        gpus = tuple(Gpu(g, model, mem, f"G-{i}-{g}", domain=f"nvl{g // 4}") for g in range(8))
        nodes.append(
            Node(f"n{i:06d}", gpus, cpus=HOST_CPUS, memory_mb=HOST_MEM_MB) if host else Node(f"n{i:06d}", gpus)
        )
    teams = [f"team{t:02d}" for t in range(50)]
    policy = Policy(
        teams={
            t: Team(t, weight=1 + (k % 3), quota={MODELS[k % 4][0]: nodes_n * 8 / 50 * 0.5})
            for k, t in enumerate(teams)
        }
    )
    sizes = [s for s in philly_sizes() if s <= 8] or [1]
    # Fill ~90% of every node with running jobs.
    running: list[RunningJob] = []
    jid = 1
    for node in nodes:
        used = 0
        while used < 7:
            n = min(rng.choice(sizes), 8 - used)
            if used + n > 7 and used > 0:
                break
            piece = NodeSlice(node.name, tuple(range(used, used + n)))
            if host:
                cpus, mem = (host_rng.choice(CPUS_PER_GPU), host_rng.choice(MEM_PER_GPU_MB)) if varied else (4.0, 32768)
                piece = replace(piece, cpus=n * cpus, host_memory_mb=n * mem)
            running.append(
                RunningJob(
                    jid,
                    Allocation((piece,)),
                    team=rng.choice(teams),
                    priority=Priority(rng.choice([0, 1, 1, 2])),
                    started_at=-rng.uniform(0, 7200),
                    time_limit_s=rng.choice([3600.0, 7200.0, 86400.0]),
                )
            )
            used += n
            jid += 1
    all_sizes = philly_sizes()
    queued = []
    for _ in range(jobs_n):
        model = rng.random() < 0.7
        request = JobRequest(
            jid,
            float(rng.choice(all_sizes)),
            gpu_types=(MODELS[rng.randrange(4)][0],) if model else (),
            priority=Priority(rng.choice([0, 1, 1, 1, 2])),
            submitted_at=-rng.uniform(0, 3600),
            team=rng.choice(teams),
            time_limit_s=rng.choice([None, 600.0, 3600.0]),
        )
        if host:
            cpus, mem = (host_rng.choice(CPUS_PER_GPU), host_rng.choice(MEM_PER_GPU_MB)) if varied else (4.0, 32768)
            request = replace(request, cpus=request.gpus * cpus, mem_mb=int(request.gpus) * mem)
        queued.append(request)
        jid += 1
    usage = {t: rng.uniform(0, 1e6) for t in teams}
    return Snapshot(tuple(nodes), tuple(running), tuple(queued), usage), policy


def measure(snap: Snapshot, policy: Policy, cycles: int) -> dict[str, float]:
    """Cycles as the head runs them: one capacity index kept across cycles (the first cycle
    builds it, the others apply the running jobs' changes: none here)."""
    snap = replace(snap, capacity=CapacityIndex())
    times, starts = [], 0
    for _ in range(cycles):
        t0 = time.perf_counter()
        plan = decide(snap, policy, 0.0)
        times.append(time.perf_counter() - t0)
        starts = len(plan.starts)
    first = times[0]
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return {
        "median_s": statistics.median(times),
        "p99_s": p99,
        "starts": starts,
        "preemptions": len(plan.preemptions),
        "admissions_per_s": starts / statistics.median(times),
        "first_s": first,
    }


def measure_estimates(snap: Snapshot, policy: Policy) -> dict[str, float]:
    """The estimate replay the head runs every few seconds: the first 10,000 in line exactly
    (its default), then every queued job."""
    plan = decide(snap, policy, 0.0)
    out: dict[str, float] = {"waiting": len(plan.waiting)}
    for name, limit in (("default", DEFAULT_LIMIT), ("all", len(plan.waiting))):
        t0 = time.perf_counter()
        est = estimate_starts(snap, policy, 0.0, plan, limit)
        out[f"{name}_s"] = time.perf_counter() - t0
        out[f"{name}_estimated"] = sum(1 for e in est.values() if e.start is not None)
    return out


def empty_cluster_admissions(nodes_n: int, jobs_n: int, policy: Policy) -> dict[str, float]:
    """An empty cluster and a full queue: how fast can one cycle admit jobs?"""
    snap, _ = build(nodes_n, jobs_n)
    snap = Snapshot(snap.nodes, (), snap.queued, snap.usage)
    t0 = time.perf_counter()
    plan = decide(snap, policy, 0.0)
    dt = time.perf_counter() - t0
    return {"cycle_s": dt, "starts": len(plan.starts), "admissions_per_s": len(plan.starts) / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=5, help="cycles per configuration (median, p99)")
    ap.add_argument("--quick", action="store_true", help="1/10 of every size, for a smoke run")
    args = ap.parse_args()
    k = 10 if args.quick else 1
    configs = [
        ("base", 10_000 // k, 100_000 // k),
        ("nodes x10", 100_000 // k, 100_000 // k),
        ("jobs x10", 10_000 // k, 1_000_000 // k),
    ]
    rows = []
    for name, nodes_n, jobs_n in configs:
        t0 = time.perf_counter()
        snap, policy = build(nodes_n, jobs_n)
        built = time.perf_counter() - t0
        cycles = args.cycles if name == "base" else max(1, args.cycles // 2)
        full = measure(snap, policy, cycles)
        fifo = measure(snap, fifo_policy(), cycles)
        rows.append((name, nodes_n, jobs_n, len(snap.running), full, fifo, built))
    empty = empty_cluster_admissions(configs[0][1], configs[0][2], Policy())
    base_snap, base_policy = build(configs[0][1], configs[0][2])
    est = measure_estimates(base_snap, base_policy)

    print(
        f"\n{'config':<10} {'nodes':>7} {'queued':>9} {'running':>8} {'first':>8} {'median':>8} {'p99':>8} "
        f"{'starts':>7} {'preempt':>7} {'adm/s':>8} {'fifo med':>9} {'full/fifo':>9}"
    )
    for name, nodes_n, jobs_n, running_n, full, fifo, _ in rows:
        print(
            f"{name:<10} {nodes_n:>7} {jobs_n:>9} {running_n:>8} {full['first_s']:>7.3f}s {full['median_s']:>7.3f}s "
            f"{full['p99_s']:>7.3f}s {full['starts']:>7.0f} {full['preemptions']:>7.0f} "
            f"{full['admissions_per_s']:>8.0f} {fifo['median_s']:>8.3f}s {full['median_s'] / fifo['median_s']:>9.2f}"
        )
    print(
        f"\nestimates, base config, {est['waiting']:.0f} waiting: first {DEFAULT_LIMIT:,} exactly "
        f"{est['default_s']:.3f}s; all exactly {est['all_s']:.3f}s ({est['all_estimated']:.0f} with a start)"
    )
    print(
        f"\nempty cluster, {configs[0][1]} nodes, {configs[0][2]} queued: one cycle {empty['cycle_s']:.3f}s, "
        f"{empty['starts']:.0f} jobs admitted = {empty['admissions_per_s']:.0f} admissions/s"
    )


if __name__ == "__main__":
    main()
