"""What running a job in a container costs at its start (issue 22): the same job bare and in a
container image already in the node's store, side by side.

Why: a container job's start adds `podman image exists` (the pull check) and `podman run` (a
runtime, conmon, an init, mounts) to the shim's start; that is on every container job's critical
path, and a GPU scheduler's users notice seconds, not milliseconds. Both modes go through the
same LocalExecutor, cgroup included, as the head runs them:

- bare:      `sh -c 'touch STARTED'` (the host's sh);
- container: the same command in the test image (tests/e2e/containerkit.py: a static busybox),
             rootful podman in a private store with the config a cgroup v1/v2 host needs.

Per job: from `launch` to the command's first effect (the file it touches: the start overhead),
and to the recorded exit (start and end). Rounds interleave the modes, so a load change hits both.
p50 of each and the container/bare ratio are printed.

Run (as root, podman installed): `PYTHONPATH=src python bench/bench_containers.py [--jobs 20] [--record]`;
--record appends the result, with the machine and its load average, to bench/RESULTS.md.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.e2e.containerkit

from tests.e2e.containerkit import IMAGE, Podman

from gpucluster.executors.base import Exited, LaunchSpec, Running
from gpucluster.executors.cgroups import detect
from gpucluster.executors.local import LocalExecutor
from gpucluster.executors.podman import ContainerNode, ContainerSpec


def one_job(executor: LocalExecutor, i: int, root: Path, container: ContainerSpec | None) -> tuple[float, float]:
    """(seconds to the command's start, seconds to its recorded exit)."""
    started = root / f"started-{i}"
    spec = LaunchSpec(
        job_id=i, attempt=1, argv=["sh", "-c", f"touch {started}"], env={"PATH": "/usr/bin:/bin"},
        workdir=str(root), run_dir=root / "run" / str(i), log_path=root / "jobs" / str(i) / "output.log",
        container=container,
    )  # fmt: skip
    t0 = time.perf_counter()
    handle = executor.launch(spec)
    to_start = None
    while True:
        if to_start is None and started.exists():
            to_start = time.perf_counter() - t0
        status = executor.poll(handle)
        if not isinstance(status, Running):
            break
        time.sleep(0.001)
    to_exit = time.perf_counter() - t0
    executor.cleanup(handle)
    if not isinstance(status, Exited) or status.exit_code != 0 or to_start is None:
        log = spec.log_path.read_text() if spec.log_path.exists() else ""
        raise SystemExit(f"job {i} ({'container' if container else 'bare'}) did not run: {status} {log}")
    return to_start, to_exit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the container mode uses rootful podman in a private store")
    support = detect()
    with tempfile.TemporaryDirectory(prefix="bench-ctr-") as tmp:
        work = Path(tmp)
        podman = Podman(work / "podman")
        made = podman.import_test_image(work)
        if made.returncode != 0:
            raise SystemExit(f"podman cannot import the image: {made.stderr}")
        version = subprocess.run(["podman", "--version"], capture_output=True, text=True, check=False).stdout.strip()
        executor = LocalExecutor(
            cgroup_support=support,
            instance=f"bench-{os.getpid()}",
            container_node=ContainerNode.from_config_dir(podman.config),
        )
        modes: dict[str, ContainerSpec | None] = {"bare": None, "container": ContainerSpec(IMAGE)}
        start: dict[str, list[float]] = {m: [] for m in modes}
        total: dict[str, list[float]] = {m: [] for m in modes}
        load_before = os.getloadavg()
        try:
            for i in range(args.jobs):
                for name, container in modes.items():
                    root = work / name
                    root.mkdir(exist_ok=True)
                    s, t = one_job(executor, i, root, container)
                    start[name].append(s)
                    total[name].append(t)
        finally:
            podman("rm", "--all", "--force", "--time", "0")
        load_after = os.getloadavg()
    bare_start, bare_total = statistics.median(start["bare"]), statistics.median(total["bare"])
    lines = [
        f"{platform.node()}: {os.cpu_count()} cores, {version}, {args.jobs} jobs per mode, image in the store; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; {support.describe()}",
        "| mode | launch to the command's start, p50 | launch to recorded exit, p50 | start vs bare | exit vs bare |",
        "|---|---|---|---|---|",
    ]
    for name in modes:
        s, t = statistics.median(start[name]), statistics.median(total[name])
        lines.append(
            f"| {name} | {s * 1000:.0f} ms | {t * 1000:.0f} ms | {s / bare_start:.1f}x | {t / bare_total:.1f}x |"
        )
    overhead = statistics.median(start["container"]) - bare_start
    lines.append(f"\nA container adds {overhead * 1000:.0f} ms (p50) to a job's start.")
    print("\n".join(lines))
    if args.record:
        with open(Path(__file__).with_name("RESULTS.md"), "a") as f:
            when = time.strftime("%Y-%m-%d %H:%M")
            f.write(f"\n## Container job start vs bare (bench/bench_containers.py, {when})\n\n")
            f.write("\n".join(lines) + "\n")
            f.write(f"\n`PYTHONPATH=src python bench/bench_containers.py --jobs {args.jobs} --record` (as root)\n")


if __name__ == "__main__":
    sys.exit(main())
