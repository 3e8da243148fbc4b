"""What modelling drains costs the simulator, and what the drains cost the cluster (issue 15).

  python bench/bench_sim_drains.py [--policies default] [--jobs N] [--windows 8] [--hours 12]

Whole Philly (or a prefix) on examples/clusters/philly.yaml, each policy twice in fresh
processes on this tree: the baseline without drains, then with a rolling maintenance: `--windows`
windows a week apart from day 3, each draining the next 8 of the 64 nodes for `--hours`, every
other one requeuing its running jobs (`running: requeue`). Prints the CPU seconds of each run
and their ratio (above 1: the drains cost the simulator that much more), and what the drains
did: drained and lost GPU-hours, jobs requeued, mean queueing delay before and after.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core_philly import PHILLY, ROOT, SPEC, child_json

CHILD = r"""
import json, sys, time
from dataclasses import replace
from pathlib import Path
from gpucluster.sim.engine import Engine
from gpucluster.sim.metrics import run_metrics
from gpucluster.sim.readers import read_trace
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import DrainWindow, load_cluster_spec
trace, spec_path, policy, jobs, windows, hours = sys.argv[1:7]
spec = load_cluster_spec(Path(spec_path))
names = [n.name for n, _ in spec.nodes()]
drains = tuple(
    DrainWindow(tuple(names[8 * k % len(names):][:8]), (3 + 7 * k) * 86400.0, float(hours) * 3600.0,
                "maintenance", requeue=k % 2 == 1)
    for k in range(int(windows))
)
spec = replace(spec, drains=drains)
workload = read_trace(Path(trace), spec, 1).jobs
if int(jobs):
    workload = workload[:int(jobs)]
t0 = time.process_time()
res = Engine(spec, workload, load_policy(policy), 1).run()
cpu = time.process_time() - t0
m = run_metrics(res, spec)
print(json.dumps({"cpu_s": cpu, "jobs": len(res.end), "delay_mean_s": m["queueing_delay_s"]["mean"],
                  "drains": m["drains"], "decide_calls": res.decide_calls}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default="default")
    ap.add_argument("--jobs", type=int, default=0, help="a prefix of the trace (0: all of it)")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--hours", type=float, default=12.0)
    ap.add_argument("--trace", type=Path, default=PHILLY)
    args = ap.parse_args()
    src = ROOT / "src"
    for policy in args.policies.split(","):
        runs = {}
        for label, windows in (("no drains", 0), ("drains", args.windows)):
            r = runs[label] = child_json(
                src,
                CHILD,
                str(args.trace),
                str(SPEC),
                policy,
                str(args.jobs),
                str(windows),
                str(args.hours),
                what=policy,
            )
            print(
                f"{policy:9s} {label:9s} cpu {r['cpu_s']:7.1f} s  jobs {r['jobs']}  calls {r['decide_calls']}"
                f"  mean delay {r['delay_mean_s']} s  drains {r['drains'] or '-'}",
                flush=True,
            )
        ratio = float(str(runs["drains"]["cpu_s"])) / float(str(runs["no drains"]["cpu_s"]))
        print(f"{policy:9s} drains/no drains CPU {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
