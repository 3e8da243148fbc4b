"""GPU-sharing replay cost (issue 26): 10,000 jobs on GPU fractions through the simulator.

  .venv/bin/python bench/bench_sim_sharing.py [--jobs 10000] [--nodes 160] [--policy default]
      [--baseline-jobs 10000] [--seed 0]

Why: Alibaba-style GPU-sharing workloads (most pods on a quarter or half GPU, thousands running
at once) took 140-418 CPU-s for ~10,000 pods: fraction placement scans every partly used GPU
and the scheduler's expected ends are re-added for every sharing job each cycle. Goal: 10,000
sharing jobs in under 10 s of CPU.

The workload is synthetic and seeded (no public trace here has fractions in the native format):
68% of jobs on 0.25 GPU, 20% on 0.5, 10% on 1 whole GPU, 2% on 8 (a node: what backfill has to
reserve for); run times log-normal (median 30 min, p99 ~12 h); Poisson arrivals offering 110% of
the GPUs' capacity (--load), so thousands of shares run at once and a queue builds behind them,
as in a GPU-sharing cluster allocated at ~96%. The baseline, run in the same script on the same
machine, is the same number of whole-GPU jobs (the sharing ones on 1 GPU; the same run times,
8-GPU jobs and offered load): what replaying that many jobs
costs without sharing. Figures are CPU seconds (time.process_time), steadier than wall time on
a machine others load; the ratio sharing / whole-GPU is the number to compare across machines.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import tempfile
import time
from pathlib import Path

from gpucluster.sim.engine import Engine
from gpucluster.sim.readers import read_trace
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import load_cluster_spec


def sharing_trace(
    path: Path, jobs: int, gpus: int, seed: int, load: float, whole: bool = False, mixed: bool = False
) -> Path:
    """`jobs` jobs, 68/20/10/2% on 0.25/0.5/1/8 GPUs (the sharing ones on 1 with `whole`) at `load`."""
    rng = random.Random(f"{seed}/sharing")
    mu, sigma = math.log(1800.0), (math.log(12 * 3600.0) - math.log(1800.0)) / 2.326
    rows = []
    for _ in range(jobs):
        u = rng.random()
        if mixed:  # any share from 5% to 60% of a GPU, as pods asking for GPU memory do
            share = 8.0 if u >= 0.98 else 1.0 if whole else round(rng.uniform(0.05, 0.6), 2)
        else:
            share = 8.0 if u >= 0.98 else 1.0 if whole else (0.25 if u < 0.68 else 0.5 if u < 0.88 else 1.0)
        rows.append((share, max(10.0, round(rng.lognormvariate(mu, sigma)))))
    mean_gpu_s = math.fsum(s * d for s, d in rows) / jobs
    rate = load * gpus / mean_gpu_s
    t = 0.0
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submit_time", "duration", "gpus", "team"])
        for k, (share, duration) in enumerate(rows):
            t += rng.expovariate(rate)
            w.writerow([f"{t:.3f}", f"{duration:.0f}", f"{share:g}", f"team{k % 8}"])
    return path


def replay(cluster: Path, trace: Path, policy: str, seed: int) -> tuple[float, int, int, float]:
    """(CPU seconds, jobs, decide calls, most jobs running at once) of one replay."""
    spec = load_cluster_spec(cluster)
    jobs = read_trace(trace, spec, seed, None, False).jobs
    t0 = time.process_time()
    res = Engine(spec, jobs, load_policy(policy), seed).run()
    cpu = time.process_time() - t0
    return cpu, len(res.outcome), res.decide_calls, float(max(res.series.running_jobs or [0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=160, help="nodes of 8 GPUs")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; medians are reported")
    ap.add_argument("--mixed", action="store_true", help="sharing jobs on any share from 0.05 to 0.6 GPU")
    ap.add_argument("--load", type=float, default=1.1, help="offered GPU load (above 1: a queue builds)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cluster = Path(d) / "c.yaml"
        cluster.write_text(
            f"node_groups:\n  - {{name: n, count: {args.nodes}, gpus_per_node: 8, gpu_model: H100-80GB}}\n"
            "failures: {gpu_failures_per_day: 0}\ncheckpoints: {interval: none}\n"
        )
        gpus = args.nodes * 8
        shared = sharing_trace(Path(d) / "shared.csv", args.jobs, gpus, args.seed, args.load, mixed=args.mixed)
        whole = sharing_trace(Path(d) / "whole.csv", args.jobs, gpus, args.seed, args.load, whole=True)
        # medians of --repeat runs each, interleaved: CPU time on a loaded machine varies by ~50%
        bases, cpus = [], []
        for _ in range(args.repeat):
            bases.append(replay(cluster, whole, args.policy, args.seed))
            cpus.append(replay(cluster, shared, args.policy, args.seed))
        base = sorted(bases)[len(bases) // 2]
        cpu = sorted(cpus)[len(cpus) // 2]
    load = os.getloadavg()[0]
    kinds = "any share from 0.05 to 0.6 of a" if args.mixed else "0.25/0.5/1"
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f} (shared with other work)")
    print(
        f"baseline, {base[1]:,} whole-GPU jobs on {gpus:,} GPUs ({args.policy}): {base[0]:.2f} CPU-s, "
        f"{base[2]:,} decide calls, up to {base[3]:,.0f} running"
    )
    print(
        f"sharing, {cpu[1]:,} jobs on {kinds} GPU (2% on 8): {cpu[0]:.2f} CPU-s, {cpu[2]:,} decide calls, "
        f"up to {cpu[3]:,.0f} running"
    )
    print(f"ratio sharing / whole-GPU: {cpu[0] / base[0]:.2f}x; goal: under 10 CPU-s for 10,000 sharing jobs")


if __name__ == "__main__":
    main()
