"""What isolating a job costs at its start and end: the shim (keeper + job side) and its cgroup,
against a bare process (issue 14).

Why: every job now starts under a two-process shim that reads its spec from the head's run dir,
forks a job side that joins a cgroup and drops privileges, and at the end kills the cgroup and
records the exit; the head then removes the cgroup. That is work on every job's critical path
(issue 18 counts per-job CPU against Slurm), so it is measured here, side by side in one run:

- bare:   subprocess.Popen(["true"]) and wait (the baseline: what no job system can beat);
- shim:   LocalExecutor.launch of `true`, poll until it ended, cleanup; no cgroup;
- cgroup: the same with a cgroup per job (skipped where the node has none usable).

Each mode runs N jobs one after another (interleaved by round, so a load change hits all modes);
per job it reports wall time from launch to the recorded exit and the CPU of this process and its
children. Medians and the ratio to bare are printed.

Run: `PYTHONPATH=src python bench/bench_shim.py [--jobs 40] [--record]`; --record appends the
result, with the machine and its load average, to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpucluster.executors.base import LaunchSpec, Running
from gpucluster.executors.cgroups import detect
from gpucluster.executors.local import LocalExecutor


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def bare(_: int, __: Path) -> None:
    subprocess.Popen(["true"]).wait()


def through(executor: LocalExecutor):  # type: ignore[no-untyped-def]
    def run(i: int, root: Path) -> None:
        spec = LaunchSpec(
            job_id=i, attempt=1, argv=["true"], env={"PATH": "/usr/bin:/bin"}, workdir=str(root),
            run_dir=root / "run" / str(i), log_path=root / "jobs" / str(i) / "output.log",
        )  # fmt: skip
        handle = executor.launch(spec)
        while isinstance(executor.poll(handle), Running):
            time.sleep(0.001)
        executor.cleanup(handle)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    support = detect()
    modes = {"bare": bare, "shim": through(LocalExecutor())}
    if support.usable:
        modes["cgroup"] = through(LocalExecutor(cgroup_support=support, instance=f"bench-{os.getpid()}"))
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.jobs):
            for name, run in modes.items():
                root = Path(tmp) / name
                root.mkdir(exist_ok=True)
                c0, t0 = _cpu(), time.perf_counter()
                run(i, root)
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(_cpu() - c0)
    load_after = os.getloadavg()
    base_wall, base_cpu = statistics.median(wall["bare"]), statistics.median(cpu["bare"])
    lines = [
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, {args.jobs} jobs per mode; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; {support.describe()}",
        "| mode | wall per job, median | CPU per job, median | wall vs bare | CPU vs bare |",
        "|---|---|---|---|---|",
    ]
    for name in modes:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        lines.append(f"| {name} | {w * 1000:.1f} ms | {c * 1000:.1f} ms | {w / base_wall:.1f}x | {c / base_cpu:.1f}x |")
    print("\n".join(lines))
    if args.record:
        with open(Path(__file__).with_name("RESULTS.md"), "a") as f:
            f.write(f"\n## Job isolation at start and end (bench/bench_shim.py, {time.strftime('%Y-%m-%d')})\n\n")
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
