"""What one `gpucluster` command costs in CPU before and while it answers (issue 19).

Why: people run `gpucluster jobs` in loops and under `watch`, the way they run Slurm's `squeue`,
which answers in milliseconds; each of our commands cost ~0.9 s of CPU, most of it imports the
command never used. The goal is under 150 ms of CPU for a read command on this machine.

Measured side by side in one run, interleaved by round so a load change hits all of them:

- `python -c pass`: the baseline (the interpreter's own start, what no Python CLI can beat);
- `gpucluster --help`, `gpucluster jobs`, `gpucluster submit -- true` against a live head
  (`gpucluster up --virtual-gpus 8`, started here with its own data dir and config file), and two
  more read commands, `gpucluster show 1` (the job the first submit made) and `gpucluster nodes`.

Each command runs as the console script pip installs (a file named `gpucluster` that calls main());
its CPU is user + system time of the child (wait4), wall time alongside. Medians and the ratio
to the baseline are printed.

With `--before DIR` (a checkout's `src` of an earlier version, e.g. from `git archive REV src`;
repeatable, each labelled by the folder above it), the same commands also run with that
version's CLI, against the same head, in the same rounds.

Run: `PYTHONPATH=src python bench/bench_cli.py [--rounds 15] [--before /tmp/base/src ...]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _head
from gpucluster import userconfig

# What pip writes as the `gpucluster` console script (run here by path, so a worktree needs no install).
SCRIPT = "import sys\nfrom gpucluster.cli.main import main\nsys.exit(main())\n"


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of argv; a failing command stops the benchmark."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{argv[2:]} exited {proc.returncode}: {stderr.strip()}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--before", type=Path, action="append", default=[], help="an earlier version's src dir, measured side by side"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        script = base / "gpucluster"
        script.write_text(SCRIPT)
        cli = [sys.executable, str(script)]
        head = _head.start(8, base / "data", base / "head.log")
        try:
            env = {
                **os.environ,
                "GPUCLUSTER_URL": head.url,
                userconfig.ENV_PATH: str(base / "gpucluster-config.yaml"),
            }
            commands = {
                "--help": ["--help"],
                "jobs": ["jobs"],
                "submit -- true": ["submit", "--", "true"],
                "show 1": ["show", "1"],
                "nodes": ["nodes"],
            }
            cases: dict[str, tuple[list[str], dict[str, str]]] = {
                "python -c pass": ([sys.executable, "-c", "pass"], env)
            }
            for name, tail in commands.items():
                cases[f"gpucluster {name}"] = ([*cli, *tail], env)
            for before in args.before:
                old_env = {**env, "PYTHONPATH": str(before.resolve())}
                for name, tail in commands.items():
                    cases[f"{before.resolve().parent.name}: gpucluster {name}"] = ([*cli, *tail], old_env)
            cpu: dict[str, list[float]] = {k: [] for k in cases}
            wall: dict[str, list[float]] = {k: [] for k in cases}
            for _ in range(args.rounds):
                for name, (argv, case_env) in cases.items():
                    c, w = run_once(argv, case_env)
                    cpu[name].append(c)
                    wall[name].append(w)
        finally:
            head.stop()
    load = os.getloadavg()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"load average after the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.rounds} rounds")
    base_cpu = statistics.median(cpu["python -c pass"])
    print(f"{'command':<44} {'CPU median':>10} {'wall median':>11} {'CPU / python -c pass':>21}")
    for name in cases:
        c, w = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"{name:<44} {c * 1000:>8.0f}ms {w * 1000:>9.0f}ms {c / base_cpu:>20.1f}x")


if __name__ == "__main__":
    main()
