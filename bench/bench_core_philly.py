"""Whole Philly per shipped policy, a baseline tree beside this one (issue 15).

  python bench/bench_core_philly.py [--baseline DIR] [--policies fifo,priority,default] [--jobs N]
      [--trace CSV]

For each tree (this checkout's src/, and --baseline's src/ when given, e.g. `git archive` of the
commit before a refactor) and each policy: CPU seconds of one Engine run in a fresh process, and
a digest of every job's (id, first start, end, outcome) plus the run's totals. Why a digest: a
refactor of the core must leave outcomes bit-identical, and comparing the digests says so
without keeping 74,167 rows per run. Prints a line per run and, per policy, the ratio
baseline CPU / this CPU (above 1: this tree is faster) and whether the digests match.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHILLY = ROOT.parent / "shared" / "traces" / "philly" / "philly-2017-09-to-11.csv"
SPEC = ROOT / "examples" / "clusters" / "philly.yaml"

CHILD = r"""
import hashlib, json, sys, time
from gpucluster.sim.engine import Engine
from gpucluster.sim.readers import read_trace
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import load_cluster_spec
from pathlib import Path
trace, spec_path, policy, jobs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spec = load_cluster_spec(Path(spec_path))
workload = read_trace(Path(trace), spec, 1).jobs
if jobs:
    workload = workload[:jobs]
t0 = time.process_time()
res = Engine(spec, workload, load_policy(policy), 1).run()
cpu = time.process_time() - t0
h = hashlib.sha256()
for row in zip(res.job_id, res.first_start, res.end, res.outcome, strict=True):
    h.update(repr(row).encode())
h.update(repr((res.busy_gpu_s, res.preemptions, res.restarts, res.interruptions, res.decide_calls)).encode())
print(json.dumps({"cpu_s": cpu, "digest": h.hexdigest()[:16], "jobs": len(res.end), "decide_calls": res.decide_calls}))
"""


def run(src: Path, policy: str, jobs: int, trace: Path = PHILLY) -> dict[str, object]:
    return child_json(src, CHILD, str(trace), str(SPEC), policy, str(jobs), what=policy)


def child_json(src: Path, code: str, *args: str, what: str) -> dict[str, object]:
    """`code` run with `args` in a fresh interpreter on the tree `src`; its last line, as JSON
    (a fresh process per run: one tree's modules never leak into the other's figures)."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"{what} in {src}: {out.stderr.strip()[-2000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, default=None, help="a tree with src/ to compare against")
    ap.add_argument("--policies", default="fifo,priority,default")
    ap.add_argument("--jobs", type=int, default=0, help="a prefix of the trace (0: all of it)")
    ap.add_argument("--trace", type=Path, default=PHILLY)
    args = ap.parse_args()
    for policy in args.policies.split(","):
        this = run(ROOT / "src", policy, args.jobs, args.trace)
        print(
            f"{policy:9s} this     cpu {this['cpu_s']:7.1f} s  jobs {this['jobs']}  digest {this['digest']}", flush=True
        )
        if args.baseline is not None:
            base = run(args.baseline / "src", policy, args.jobs, args.trace)
            print(f"{policy:9s} baseline cpu {base['cpu_s']:7.1f} s  jobs {base['jobs']}  digest {base['digest']}")
            ratio = float(str(base["cpu_s"])) / float(str(this["cpu_s"]))
            same = "identical" if base["digest"] == this["digest"] else "DIFFERENT"
            print(f"{policy:9s} baseline/this {ratio:.2f}x, outcomes {same}", flush=True)


if __name__ == "__main__":
    main()
