"""Simulator benchmark (issue 5): the whole Philly trace, and a synthetic trace at 100,000 GPUs.

  .venv/bin/python bench/bench_sim.py [--policies fifo,priority,default] [--philly-jobs N]
      [--budget S] [--workers N] [--sample-every 10] [--sample-nodes 6] [--sample-budget S]
      [--synthetic-jobs 1000000] [--synthetic-gpus 100000] [--synthetic-policy default]
      [--synthetic-budget S] [--skip-philly] [--skip-synthetic] [--out results.json]

1. Philly: ../shared/traces/philly/philly-2017-09-to-11.csv (74,167 jobs; --philly-jobs takes a
   prefix) on examples/clusters/philly.yaml (64 x 8 GPUs), seed 1, each policy in turn: wall
   time, events/s, peak memory, mean and p99 JCT and queueing delay, and the ratio of FIFO's mean
   to each policy's (above 1: better than FIFO). Goal: under 60 s.
   Then every --sample-every'th job on --sample-nodes x 8 GPUs (default 1 in 10 on 48 GPUs: the
   same ~85% load with a tenth of the queue), which the policies can run to the end.
2. Synthetic: --synthetic-jobs jobs resampled from Philly's (GPUs, run time) pairs, Poisson
   arrivals at 80% load, 50 teams, on --synthetic-gpus GPUs (8 per node), --synthetic-policy
   (default: the full default policy), planning at every event or, with --synthetic-cycle,
   in fixed cycles (scheduler.cycle). Goal: 1,000,000
   jobs on 100,000 GPUs in under 15 minutes and 4 GiB. A run stopped by --synthetic-budget reports
   how far it got and extrapolates linearly in jobs done (say so when quoting it).
Wall and CPU seconds are both reported; decide() is timed in CPU seconds (its share is of the
run's CPU time), and --cpu-budget makes the budgets CPU seconds: on a machine other work loads,
wall time measures that work more than the simulator.
3. Where the time goes: the scheduler core's decide() per call, by the queue length it was given,
   from the runs above. The simulator calls decide() once per instant at which something changed;
   everything else it does is O(1) per event.

Runs use one process per policy in turn (--workers 1, the default) so wall times are not shared.
The figures are printed last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpucluster.sim.engine import RunResult  # noqa: E402
from gpucluster.sim.metrics import run_metrics  # noqa: E402
from gpucluster.sim.readers import read_trace  # noqa: E402
from gpucluster.sim.run import run_policies  # noqa: E402
from gpucluster.sim.scheduling import load_policy  # noqa: E402
from gpucluster.sim.spec import load_cluster_spec  # noqa: E402
from gpucluster.sim.synthetic import generate  # noqa: E402

PHILLY = ROOT.parent / "shared" / "traces" / "philly" / "philly-2017-09-to-11.csv"
PHILLY_SPEC = ROOT / "examples" / "clusters" / "philly.yaml"
SEED = 1


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def progress(name: str, done: int, total: int, t: float, _last: dict[str, float] = {}) -> None:  # noqa: B006
    if time.monotonic() - _last.get(name, 0.0) >= 30:
        _last[name] = time.monotonic()
        say(f"  {name}: {done:,}/{total:,} jobs, simulated day {t / 86400:.1f}")


def decide_profile(results: list[RunResult]) -> list[dict[str, Any]]:
    """decide() time per call by queue length, over all runs."""
    edges = [0, 1, 10, 100, 1000, 10_000, 100_000, 10**9]
    rows = []
    for lo, hi in itertools.pairwise(edges):
        times = sorted(t for r in results for t, q in zip(r.decide_times, r.decide_queues, strict=True) if lo <= q < hi)
        if times:
            rows.append(
                {
                    "queue": f"{lo}-{hi - 1}" if hi < 10**9 else f">={lo}",
                    "calls": len(times),
                    "median_ms": round(times[len(times) // 2] * 1e3, 3),
                    "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3, 3),
                    "total_s": round(math.fsum(times), 1),
                }
            )
    return rows


def philly(args: argparse.Namespace, every: int = 1, nodes: int = 64, budget: float | None = None) -> dict[str, Any]:
    """Philly on `nodes` x 8 GPUs; every `every`-th job (1: the whole trace)."""
    spec = load_cluster_spec(PHILLY_SPEC)
    if nodes != 64:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "philly.yaml"
            path.write_text(PHILLY_SPEC.read_text().replace("count: 64", f"count: {nodes}"))
            spec = load_cluster_spec(path)
    t0 = time.perf_counter()
    trace = read_trace(PHILLY, spec, SEED)
    read_s = time.perf_counter() - t0
    jobs = trace.jobs[: args.philly_jobs] if args.philly_jobs else trace.jobs
    if every > 1:
        jobs = [j._replace(job_id=i) for i, j in enumerate(jobs[::every], start=1)]
    policies = [load_policy(p) for p in args.policies.split(",")]
    say(
        f"philly 1/{every} on {nodes * 8} GPUs: {len(jobs):,} jobs (read in {read_s:.1f} s); simulating {args.policies}"
    )
    results = run_policies(spec, jobs, policies, SEED, args.workers, progress, **_budget(args, budget))
    per = {}
    for res in results:
        m = run_metrics(res, spec)
        done = len(res.end)
        per[res.policy.name] = {
            "jobs": len(jobs),
            "jobs_done": done,
            "truncated_at_day": round(res.truncated_at / 86400, 2) if res.truncated else None,
            "wall_s": round(res.wall_s, 2),
            "cpu_s": round(res.cpu_s, 2),
            "events": res.events,
            "events_per_s": round(res.events / res.wall_s) if res.wall_s else None,
            "decide_calls": res.decide_calls,
            "decide_share": round(res.decide_s / res.cpu_s, 3) if res.cpu_s else None,
            "queue_at_decide_mean": round(res.decide_queue_sum / max(1, res.decide_calls), 1),
            "queue_at_decide_max": res.decide_queue_max,
            "skipped": m["jobs"]["skipped"],
            "jct_mean_h": _h(m["jct_s"].get("mean")),
            "jct_p99_h": _h(m["jct_s"].get("p99")),
            "wait_mean_h": _h(m["queueing_delay_s"].get("mean")),
            "wait_p99_h": _h(m["queueing_delay_s"].get("p99")),
            "utilisation": m["utilisation"]["mean"],
            "jain": m["fairness"]["jain_mean_contended"],
            "preemptions": m["preemptions"],
            "node_failures": m["failures"]["node_failures"],
        }
    base = per.get("fifo")
    for row in per.values():
        if base is None or base["truncated_at_day"] is not None or row["truncated_at_day"] is not None:
            continue  # a comparison needs both runs complete
        if base["jct_mean_h"] and row["jct_mean_h"]:
            row["jct_vs_fifo"] = round(base["jct_mean_h"] / row["jct_mean_h"], 2)
            row["wait_vs_fifo"] = round(base["wait_mean_h"] / row["wait_mean_h"], 2) if row["wait_mean_h"] else None
    return {
        "every": every,
        "gpus": nodes * 8,
        "read_s": round(read_s, 2),
        "peak_rss_mib": round(peak_mib()),
        "policies": per,
        "decide_by_queue": decide_profile(results),
    }


def synthetic(args: argparse.Namespace) -> dict[str, Any]:
    n, gpus = args.synthetic_jobs, args.synthetic_gpus
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as d:
        cluster = Path(d) / "cluster.yaml"
        cluster.write_text(
            f"name: synthetic-{gpus}\n"
            f"node_groups:\n  - {{name: n, count: {gpus // 8}, gpus_per_node: 8, gpu_model: H100-80GB, "
            "price_per_gpu_hour: 2.5, power_idle_w: 70, power_busy_w: 700}\n"
            + (f"scheduler: {{cycle: {args.synthetic_cycle}}}\n" if args.synthetic_cycle else "")
        )
        spec = load_cluster_spec(cluster)
        shape = read_trace(PHILLY, spec, SEED).jobs if PHILLY.is_file() else None
        t0 = time.perf_counter()
        path = generate(Path(d) / "trace.csv", jobs=n, gpus=gpus, load=0.8, seed=SEED, shape=shape)
        gen_s = time.perf_counter() - t0
        del shape
        say(f"synthetic: {n:,} jobs written in {gen_s:.1f} s ({path.stat().st_size / 2**20:.0f} MiB); reading")
        t0 = time.perf_counter()
        trace = read_trace(path, spec, SEED)
        read_s = time.perf_counter() - t0
        loaded = rss_mib()
        say(f"synthetic: read in {read_s:.1f} s, RSS {loaded:.0f} MiB")
        policy = load_policy(args.synthetic_policy)
        say(f"synthetic: simulating {policy.name}")
        (res,) = run_policies(spec, trace.jobs, [policy], SEED, 1, progress, **_budget(args, args.synthetic_budget))
    done = len(res.end) + sum(res.skipped.values())
    per_job = res.wall_s / max(1, done)
    return {
        "policy": args.synthetic_policy,
        "cycle": args.synthetic_cycle,
        "jobs": n,
        "gpus": gpus,
        "generate_s": round(gen_s, 1),
        "read_s": round(read_s, 1),
        "rss_after_read_mib": round(loaded),
        "peak_rss_mib": round(peak_mib()),
        "sim_wall_s": round(res.wall_s, 1),
        "sim_cpu_s": round(res.cpu_s, 1),
        "jobs_done": done,
        "sim_days_reached": round((res.truncated_at if res.truncated else res.last_end) / 86400, 2),
        "truncated": res.truncated,
        "events": res.events,
        "events_per_s": round(res.events / res.wall_s) if res.wall_s else None,
        "decide_calls": res.decide_calls,
        "decide_share": round(res.decide_s / res.cpu_s, 3) if res.cpu_s else None,
        "queue_at_decide_mean": round(res.decide_queue_sum / max(1, res.decide_calls), 1),
        "running_at_decide_max": res.decide_running_max,
        "decide_median_ms": round(sorted(res.decide_times)[len(res.decide_times) // 2] * 1e3, 2)
        if res.decide_times
        else None,
        "extrapolated_total_s": round(gen_s + read_s + per_job * n) if res.truncated else None,
        "extrapolated_sim_cpu_s": round(res.cpu_s / max(1, done) * n) if res.truncated else None,
        "decide_by_queue": decide_profile([res]),
    }


def _budget(args: argparse.Namespace, seconds: float | None) -> dict[str, float | None]:
    """A run's budget, in wall seconds or with --cpu-budget in CPU seconds (on a machine others
    load, wall time measures them more than the simulator)."""
    return {"cpu_budget_s": seconds} if args.cpu_budget else {"wall_budget_s": seconds}


def _h(seconds: float | None) -> float | None:
    return round(seconds / 3600, 2) if seconds is not None else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="fifo,priority,default")
    ap.add_argument("--philly-jobs", type=int, default=None, help="only the first N jobs of Philly")
    ap.add_argument("--budget", type=float, default=None, help="stop each Philly run after S seconds")
    ap.add_argument("--workers", type=int, default=1, help="policies simulated at once")
    ap.add_argument("--synthetic-jobs", type=int, default=1_000_000)
    ap.add_argument("--synthetic-gpus", type=int, default=100_000)
    ap.add_argument("--synthetic-policy", default="default")
    ap.add_argument(
        "--synthetic-cycle", default=None, help="plan at most every this long, e.g. 60s (default: per event)"
    )
    ap.add_argument("--synthetic-budget", type=float, default=900.0, help="stop the synthetic run after S seconds")
    ap.add_argument("--sample-every", type=int, default=10, help="also every N-th Philly job (0: no) ...")
    ap.add_argument("--sample-nodes", type=int, default=6, help="... on this many 8-GPU nodes (same load)")
    ap.add_argument("--sample-budget", type=float, default=None, help="stop each sample run after S seconds")
    ap.add_argument("--cpu-budget", action="store_true", help="budgets are CPU seconds, not wall seconds")
    ap.add_argument("--skip-philly", action="store_true")
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    if not args.skip_philly:
        out["philly"] = philly(args, budget=args.budget)
    if args.sample_every:
        out["philly_sample"] = philly(args, every=args.sample_every, nodes=args.sample_nodes, budget=args.sample_budget)
    if not args.skip_synthetic:
        out["synthetic"] = synthetic(args)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print_figures(out)


def print_figures(out: dict[str, Any]) -> None:
    for key in ("philly", "philly_sample"):
        if key in out:
            _print_philly(out[key])
    s = out.get("synthetic")
    if s:
        cycle = f", scheduling cycle {s['cycle']}" if s["cycle"] else ", planning at every event"
        print(f"\n== Synthetic: {s['jobs']:,} jobs on {s['gpus']:,} GPUs, policy {s['policy']}{cycle}")
        print(
            f"generate {s['generate_s']} s, read {s['read_s']} s (RSS {s['rss_after_read_mib']} MiB), "
            f"simulate {s['sim_wall_s']} s ({s['sim_cpu_s']} s CPU): {s['jobs_done']:,} jobs done, "
            f"simulated day {s['sim_days_reached']}, "
            f"{s['events_per_s']:,} events/s, {s['decide_calls']:,} decide calls "
            f"({(s['decide_share'] or 0) * 100:.0f}% "
            f"of the time, median {s['decide_median_ms']} ms, queue {s['queue_at_decide_mean']:,.0f} on average, "
            f"up to {s['running_at_decide_max']:,} running); peak RSS {s['peak_rss_mib']} MiB"
        )
        if s["truncated"]:
            total = s["extrapolated_total_s"]
            print(
                f"stopped by the budget; linear extrapolation to all {s['jobs']:,} jobs: {total:,} s "
                f"(simulation alone: {s['extrapolated_sim_cpu_s']:,} CPU s)"
            )
        _print_decide(s["decide_by_queue"])


def _print_philly(p: dict[str, Any]) -> None:
    what = "the whole trace" if p["every"] == 1 else f"every {p['every']}th job"
    print(f"\n== Philly, {what}, on {p['gpus']} GPUs (trace read in {p['read_s']} s; peak RSS {p['peak_rss_mib']} MiB)")

    head = (
        f"{'policy':<10}{'jobs done':>12}{'wall s':>9}{'CPU s':>8}{'events/s':>10}{'in decide':>10}{'queue':>8}"
        f"{'JCT mean h':>11}{'JCT p99 h':>10}{'wait mean h':>12}{'wait p99 h':>11}{'vs FIFO':>8}"
    )
    print(head)
    for name, r in p["policies"].items():
        cut = f" (stopped at day {r['truncated_at_day']})" if r["truncated_at_day"] is not None else ""
        print(
            f"{name:<10}{r['jobs_done']:>12,}{r['wall_s']:>9.1f}{r['cpu_s']:>8.1f}{r['events_per_s'] or 0:>10,}"
            f"{(r['decide_share'] or 0) * 100:>9.0f}%{r['queue_at_decide_mean']:>8,.0f}"
            f"{_f(r['jct_mean_h']):>11}{_f(r['jct_p99_h']):>10}{_f(r['wait_mean_h']):>12}{_f(r['wait_p99_h']):>11}"
            f"{_f(r.get('jct_vs_fifo')):>8}{cut}"
        )
    _print_decide(p["decide_by_queue"])


def _print_decide(rows: list[dict[str, Any]]) -> None:
    print(
        "decide() per call by queue length:  "
        + "; ".join(
            f"{r['queue']}: {r['calls']:,} calls, median {r['median_ms']} ms, p99 {r['p99_ms']} ms, {r['total_s']} s"
            for r in rows
        )
    )


def _f(x: float | None) -> str:
    return f"{x:,.2f}" if isinstance(x, int | float) else "-"


if __name__ == "__main__":
    main()
