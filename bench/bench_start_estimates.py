"""Issue 24's measurement: how far the start estimate a live head would show at each submit is
from the real start, on the shared Philly trace, with time limits only (the baseline: every
estimate before issue 24) and with run times learned from the jobs finished so far.

Time limits are filled by the seeded rule `trace_fill.time_limit: 2x..8x` (sim/fill.py: per job
a factor drawn log-uniformly in [2, 8], the limit rounded up to 15m, 30m, 1h, ..., 14d, weeks),
on examples/clusters/philly.yaml otherwise unchanged. Prints both median absolute errors and
their ratio (the goal: at most 0.5), and the simulator's CPU time with and without measuring,
the same trace and policy in the same process (the cost of `--estimates`).

    PYTHONPATH=src:. python bench/bench_start_estimates.py [--jobs N] [--policy default] [--seed 1] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from gpucluster.sim.run import SimulateOptions, simulate

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "philly" / "philly-2017-09-to-11.csv"
LIMITS = "  time_limit: 2x..8x   # issue 24: seeded, padded and rounded as people write limits\n"


def inputs(tmp: Path, jobs: int | None) -> tuple[Path, Path]:
    spec = (ROOT / "examples" / "clusters" / "philly.yaml").read_text()
    assert "trace_fill:\n" in spec and "time_limit" not in spec.split("trace_fill:")[1]
    cluster = tmp / "philly-limits.yaml"
    cluster.write_text(spec.rstrip("\n") + "\n" + LIMITS)
    trace = TRACE
    if jobs is not None:
        lines = TRACE.read_text().splitlines(keepends=True)
        trace = tmp / "philly-head.csv"
        trace.write_text("".join(lines[: jobs + 1]))
    return cluster, trace


def run(
    cluster: Path, trace: Path, policy: str, seed: int, estimates: bool, every: int = 1
) -> tuple[dict[str, object], float]:
    t0 = time.process_time()
    opts = SimulateOptions(
        cluster=cluster,
        trace=trace,
        out=None,
        policies=(policy,),
        seed=seed,
        estimates=estimates,
        estimate_every=every,
    )
    out = simulate(opts, write=False, workers=1)
    return out.metrics["policies"][policy], time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=None, help="only the first N jobs of the trace")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--every", type=int, default=10, help="measure every Nth submit (--estimate-every)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cluster, trace = inputs(Path(d), args.jobs)
        plain, plain_cpu = run(cluster, trace, args.policy, args.seed, estimates=False)
        measured, measured_cpu = run(cluster, trace, args.policy, args.seed, estimates=True, every=args.every)
    same = {k: v for k, v in measured.items() if k != "start_estimates"} == plain
    m = measured["start_estimates"]
    assert isinstance(m, dict)
    print(
        f"trace {TRACE.name}{'' if args.jobs is None else f' (first {args.jobs} jobs)'},"
        f" policy {args.policy}, seed {args.seed}, every {args.every}th submit measured"
    )
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(json.dumps(m, indent=1))
    base, pred = m["time_limit_only"]["median_abs_error_h"], m["predicted"]["median_abs_error_h"]
    print(f"median |error|: time limits only {base:.3f} h, predicted {pred:.3f} h, ratio {m['median_abs_error_ratio']}")
    print(f"80% interval: coverage {m['interval_coverage']}, median width {m['interval_median_width_h']} h")
    print(
        f"simulator CPU: {plain_cpu:.1f} s without --estimates, {measured_cpu:.1f} s with "
        f"(x{measured_cpu / plain_cpu:.2f}); the run's other metrics identical: {same}"
    )


if __name__ == "__main__":
    main()
