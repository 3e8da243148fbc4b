"""One part of the test suite on two trees, alternately: a baseline and this one.

The suite's time is mostly real processes waiting on each other (heads, job shims, torch ranks),
so a change to the tests' fixtures is measured by running the same pytest command on a copy of
the baseline (e.g. `git -C /work/main archive HEAD src tests examples pyproject.toml | tar -x -C
/tmp/base`) and on this tree, A B A B, so both see the same load. Per run it records pytest's
wall time, the CPU of pytest and every child it reaped (heads, CLI calls, job processes), and
the outcome line; it prints the medians and the ratios this/baseline.

Run: `.venv/bin/python bench/bench_test_parts.py --baseline /tmp/base --runs 2 -- tests/e2e/test_jobs.py`
(no PYTHONPATH needed: each run gets its own tree's src first on its path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run(tree: Path, tests: list[str], log: Path | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of pytest and its reaped children, pytest's last line) of one run; its
    whole output goes to `log` when given."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    t = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read() if proc.stdout is not None else b""
    _, _, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t
    if log is not None:
        log.write_bytes(out)
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    return wall, usage.ru_utime + usage.ru_stime, lines[-1] if lines else "(no output)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", type=Path, required=True, help="a tree with src/ and tests/ of the baseline")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--logs", type=Path, help="a directory for each run's pytest output")
    parser.add_argument("tests", nargs="+", help="pytest arguments (paths), the same for both trees")
    args = parser.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": HERE}
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"pytest -q -p no:cacheprovider {' '.join(args.tests)}")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for i in range(args.runs):
        for name, tree in trees.items():
            log = args.logs / f"run{i + 1}-{name}.log" if args.logs else None
            wall, cpu, last = run(tree, args.tests, log)
            results[name].append((wall, cpu))
            load = os.getloadavg()[0]
            print(f"run {i + 1} {name:8} wall {wall:7.1f} s  CPU {cpu:7.1f} s  load {load:5.2f}  {last}", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    wall = {n: statistics.median(w for w, _ in r) for n, r in results.items()}
    cpu = {n: statistics.median(c for _, c in r) for n, r in results.items()}
    print(f"{'':10}{'baseline':>10}{'this':>10}{'this/baseline':>15}")
    print(f"{'wall s':10}{wall['baseline']:10.1f}{wall['this']:10.1f}{wall['this'] / wall['baseline']:15.2f}")
    print(f"{'CPU s':10}{cpu['baseline']:10.1f}{cpu['this']:10.1f}{cpu['this'] / cpu['baseline']:15.2f}")


if __name__ == "__main__":
    main()
