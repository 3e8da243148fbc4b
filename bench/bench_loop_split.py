"""The head loop's CPU per trivial job, by function, this tree against a baseline tree, alternated.

  PYTHONPATH=src:bench .venv/bin/python bench/bench_loop_split.py --baseline /path/to/other/src

Why beside bench_head_drain.py: that harness gives the head process's whole CPU per job (the API
threads' included, and the executor's file work the loop does for each start), so a change to one
step of the loop's start or end is a few percent of it and drowns in a loaded machine's noise.
This runs the same drain (bench_jobcost.gc_drain on a fresh head per drain, trees alternated) with
the loop thread's CPU (`time.thread_time`) summed per step of the loop: each step's own figure,
not a profiler's, whose per-call overhead inflates small Python calls and SQLAlchemy's most.

How: each tree runs from a folder holding a link to its `gpucluster` package and a
`sitecustomize.py` (Python imports it at start-up) that wraps the loop's methods named in STEPS
with thread-CPU counters and writes their sums when the loop stops. A method a tree does not have
is left out of its figures. The figures are inclusive: `_start_all` holds `_commit_start`, which
holds `_launch_spec`, and so on; `tick` is the whole cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import bench_jobcost
import bench_submit
from bench_submit import Result, log

# (module, class, method): the loop's steps, and the caches and models it calls each cycle.
STEPS = [
    ("gpucluster.head.loop", "Head", m)
    for m in (
        "tick",
        "_schedule",
        "_start_all",
        "_read_in_batch",
        "_commit_start",
        "_launch_spec",
        "_launch",
        "_record_launch",
        "_reconcile",
        "_finish_all",
        "_finish",
        "_record_waits",
    )
] + [
    ("gpucluster.head.running_cache", "RunningCache", "refresh"),
    ("gpucluster.head.queue_cache", "QueueCache", "refresh"),
    ("gpucluster.head.estimates", "EstimateRefresher", "waits"),
    ("gpucluster.head.accounting", "Accountant", "step"),
]

SITECUSTOMIZE = """
import importlib, json, os, time
_out = os.environ.get("BENCH_LOOP_SPLIT")
if _out:
    _sums = {}
    def _wrap(cls, name, label):
        f = getattr(cls, name)
        def timed(*a, **k):
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                _sums[label] = _sums.get(label, 0.0) + time.thread_time() - t
        setattr(cls, name, timed)
    for module, cls_name, name in %r:
        cls = getattr(importlib.import_module(module), cls_name)
        if hasattr(cls, name):
            _wrap(cls, name, name if cls_name == "Head" else cls_name + "." + name)
    from gpucluster.head.loop import Head
    _run = Head.run
    def run(self, *a, **k):
        try:
            return _run(self, *a, **k)
        finally:
            with open(_out, "w") as f:
                json.dump(_sums, f)
    Head.run = run
"""


def wrapped_tree(src: Path, into: Path) -> Path:
    """A folder to run `src` from with the counters (see the module docstring)."""
    into.mkdir(parents=True)
    (into / "gpucluster").symlink_to((src / "gpucluster").resolve())
    (into / "sitecustomize.py").write_text(SITECUSTOMIZE % (STEPS,))
    return into


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="a baseline checkout's src dir")
    p.add_argument("--jobs", type=int, default=200, help="trivial jobs per drain")
    p.add_argument("--rounds", type=int, default=3, help="drains per tree")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--wait-timeout", type=float, default=600)
    args = p.parse_args()
    this_src = Path(__file__).resolve().parent.parent / "src"
    per_step: dict[str, dict[str, list[float]]] = {"this": {}, "baseline": {}}
    head_cpu: dict[str, list[float]] = {"this": [], "baseline": []}
    load_before = os.getloadavg()
    report: Result = {}
    with tempfile.TemporaryDirectory(prefix="bench-loop-split-") as tmp:
        trees = {
            "this": wrapped_tree(this_src, Path(tmp) / "tree-this"),
            "baseline": wrapped_tree(args.baseline, Path(tmp) / "tree-baseline"),
        }
        for r in range(args.rounds):
            for name, src in trees.items():
                out = Path(tmp) / f"split-{name}-{r}.json"
                os.environ["BENCH_LOOP_SPLIT"] = str(out)  # the head inherits it
                with bench_submit.Phase(Path(tmp), f"{name}-{r}", args.gpus, report, src=src) as head:
                    drain = bench_jobcost.gc_drain(head, args.jobs, args.wait_timeout)
                log(f"{name} round {r}: {drain}")
                head_cpu[name].append(float(drain["head_cpu_ms_per_job"]))
                for step, seconds in json.loads(out.read_text()).items():
                    per_step[name].setdefault(step, []).append(seconds * 1000 / args.jobs)
    load_after = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores; load average before {load_before}, after {load_after}")
    print(f"{args.jobs} trivial jobs per drain, {args.rounds} drains per tree, alternated; baseline {args.baseline}")
    print("loop thread CPU per job (ms), medians; the smoke job and idle cycles of the drain included")
    print(f"{'step':28s} {'this':>8s} {'baseline':>9s} {'this/baseline':>14s}")
    steps = sorted(set(per_step["this"]) | set(per_step["baseline"]), key=lambda s: -max(_med(per_step, s)))
    for step in steps:
        this, base = _med(per_step, step)
        ratio = f"{this / base:.2f}x" if this and base else "-"
        print(f"{step:28s} {this:8.3f} {base:9.3f} {ratio:>14s}")
    this, base = statistics.median(head_cpu["this"]), statistics.median(head_cpu["baseline"])
    print(f"{'head process (all threads)':28s} {this:8.3f} {base:9.3f} {this / base:13.2f}x")
    if report.get("head_problems"):
        print(f"head problems: {report['head_problems']}")
    return 0


def _med(per_step: dict[str, dict[str, list[float]]], step: str) -> tuple[float, float]:
    this, base = (statistics.median(per_step[t].get(step) or [0.0]) for t in ("this", "baseline"))
    return this, base


if __name__ == "__main__":
    raise SystemExit(main())
