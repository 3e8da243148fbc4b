"""CPU of `las` (and any policy) on bench_las.py's settings, a baseline tree beside this one.

  python bench/bench_las_cost.py --baseline DIR [--policies default,las] [--rounds 2]
      [--days 0] [--start-day 20] [--nodes 80]

For each round, policy and tree (--baseline's src/, e.g. `git archive` of the commit before a
change, then this checkout's src/): one `sim.run.simulate` run of the policy in a fresh process,
on bench_las.py's cluster and trace window (this tree's, for both), timed with
time.process_time, with a digest of every job's (id, first start, end, outcome) and the run's
totals, as bench_core_philly.py digests. One policy runs at a time, the two trees alternately,
so both see the same load; the load average is printed beside each run. Then per policy the
median CPU seconds of each tree, baseline / this (above 1: this tree is faster), and whether
every digest matched (the same starts, ends and preemptions).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import bench_las  # noqa: E402  (this tree's window and cluster, for both trees)
from bench_core_philly import child_json  # noqa: E402

CHILD = r"""
import hashlib, json, sys, time
from pathlib import Path
from gpucluster.sim.run import SimulateOptions, simulate
spec, trace, policy = sys.argv[1], sys.argv[2], sys.argv[3]
opts = SimulateOptions(cluster=Path(spec), trace=Path(trace), out=None, policies=(policy,), fmt="philly", seed=1)
t0 = time.process_time()
out = simulate(opts, write=False, workers=1)
cpu = time.process_time() - t0
res = out.results[0]
h = hashlib.sha256()
for row in zip(res.job_id, res.first_start, res.end, res.outcome, strict=True):
    h.update(repr(row).encode())
h.update(repr((res.busy_gpu_s, res.preemptions, res.restarts, res.interruptions, res.decide_calls)).encode())
print(json.dumps({"cpu_s": cpu, "digest": h.hexdigest()[:16], "preemptions": res.preemptions}))
"""


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(src: Path, spec: Path, trace: Path, policy: str) -> dict[str, object]:
    return child_json(src, CHILD, str(spec), str(trace), policy, what=policy)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, required=True, help="a tree with src/")
    ap.add_argument("--policies", default="default,las")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--days", type=float, default=0.0)
    ap.add_argument("--start-day", type=float, default=20.0)
    ap.add_argument("--nodes", type=int, default=80)
    ap.add_argument("--trace", type=Path, default=bench_las.PHILLY)
    a = ap.parse_args()
    trees = {"baseline": a.baseline / "src", "this": ROOT / "src"}
    cpu: dict[tuple[str, str], list[float]] = {}
    digests: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace, spec = Path(tmp) / "window.csv", Path(tmp) / "cluster.yaml"
        if a.days > 0:
            n = bench_las.window(a.trace, trace, a.start_day, a.days)
        else:
            n = bench_las.window(a.trace, trace, -1.0, 3650.0)
        spec.write_text(bench_las.SPEC.format(nodes=a.nodes, gpus=8, checkpoint="1h"))
        print(f"{n} jobs, {a.nodes} nodes x 8 GPUs", flush=True)
        for r in range(1, a.rounds + 1):
            for policy in a.policies.split(","):
                for name, src in trees.items():
                    before = load()
                    got = run(src, spec, trace, policy)
                    cpu.setdefault((policy, name), []).append(float(str(got["cpu_s"])))
                    digests.setdefault(policy, set()).add(str(got["digest"]))
                    print(
                        f"round {r} {policy:<10} {name:<9} cpu {float(str(got['cpu_s'])):6.1f} s  "
                        f"preemptions {got['preemptions']}  digest {got['digest']}  load {before} -> {load()}",
                        flush=True,
                    )
    for policy in a.policies.split(","):
        base, this = statistics.median(cpu[(policy, "baseline")]), statistics.median(cpu[(policy, "this")])
        same = "identical" if len(digests[policy]) == 1 else "DIFFERENT"
        ratio = base / this
        print(f"{policy:<10} median baseline {base:6.1f} s  this {this:6.1f} s  baseline/this {ratio:.2f}x  {same}")


if __name__ == "__main__":
    main()
