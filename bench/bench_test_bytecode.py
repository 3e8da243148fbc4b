"""What precompiled bytecode saves each interpreter the test suite starts (tests/conftest.py).

The tests start hundreds of fresh interpreters that import gpucluster: heads, CLI calls, job
ranks. Where bytecode is not written (PYTHONDONTWRITEBYTECODE, as on this project's CI machine)
and the clone is fresh, each compiled the package from source. This copies the package twice
into a temp dir, compiles one copy (as the test session now does first) and leaves the other
bare, then starts the same two commands alternately on each, side by side:
  head imports: what `gpucluster up` imports before it serves;
  CLI call: `gpucluster why 1` against a closed port (start, parse, fail to connect).
It prints the median CPU (user + sys, of the child) and wall time of each, and the ratio
bare / compiled. Run: `PYTHONPATH=src .venv/bin/python bench/bench_test_bytecode.py [--runs 7]`.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpucluster

HEAD_IMPORTS = "import gpucluster.cli.main, gpucluster.head.server, gpucluster.api.app, gpucluster.executors.local"
COMMANDS = {
    "head imports": ["-c", HEAD_IMPORTS],
    "CLI call": ["-m", "gpucluster.cli.main", "why", "1", "--url", "http://127.0.0.1:1"],
}


def run(src: Path, argv: list[str]) -> tuple[float, float]:
    """(CPU s, wall s) of one interpreter running argv with src first on its path."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    t = time.monotonic()
    proc = subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_utime + usage.ru_stime, time.monotonic() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    package = Path(gpucluster.__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix="bench-bytecode-") as tmp:
        trees = {name: Path(tmp) / name for name in ("bare", "compiled")}
        for tree in trees.values():
            shutil.copytree(package, tree / "gpucluster", ignore=shutil.ignore_patterns("__pycache__"))
        t = time.process_time()
        compileall.compile_dir(trees["compiled"] / "gpucluster", quiet=1)
        print(f"compiling the package once: {time.process_time() - t:.2f} s CPU")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
        heads = ("bare CPU s", "compiled CPU s", "bare/compiled", "bare wall s", "compiled wall s")
        print(f"{'command':14} " + " ".join(f"{h:>{len(h) + 1}}" for h in heads))
        for label, argv in COMMANDS.items():
            got: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
            for _ in range(args.runs):
                for name, tree in trees.items():
                    got[name].append(run(tree, argv))
            cpu = {n: statistics.median(c for c, _ in v) for n, v in got.items()}
            wall = {n: statistics.median(w for _, w in v) for n, v in got.items()}
            print(
                f"{label:14} {cpu['bare']:11.3f} {cpu['compiled']:15.3f} {cpu['bare'] / cpu['compiled']:13.2f}x"
                f" {wall['bare']:12.3f} {wall['compiled']:16.3f}"
            )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
