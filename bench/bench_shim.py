"""What isolating a job costs at its start and end: the shim (keeper + job side) and its cgroup,
against a bare process (issue 14).

Why: every job now starts under a two-process shim that reads its spec from the head's run dir,
forks a job side that joins a cgroup and drops privileges, and at the end kills the cgroup and
records the exit; the head then removes the cgroup. That is work on every job's critical path
(issue 18 counts per-job CPU against Slurm), so it is measured here, side by side in one run:

- bare:   subprocess.Popen(["true"]) and wait (the baseline: what no job system can beat);
- shim:   LocalExecutor.launch of `true`, poll until it ended, cleanup; no cgroup; each keeper an
          exec'd `python -I -S _shim.py` (the path before issue 18, still the Ray agent's);
- forked: the same, each keeper forked by the node's fork server (`_shim.py --serve`, issue 18);
- cgroup, forked+cgroup: the two with a cgroup per job (skipped where the node has none usable).

Each mode runs N jobs one after another (interleaved by round, so a load change hits all modes);
per job it reports wall time from launch to the recorded exit (median) and the CPU it cost (mean
over the run): this process and its reaped children, plus, for the fork server, the server's own
CPU and that of the keepers it forked and reaped (with their jobs: /proc/SERVER/stat utime, stime,
cutime, cstime; a run ends when its keeper has been reaped, so each job's CPU is counted). The
ratios to bare and to shim (the named baseline) are printed.

With --baseline SRC (another checkout's src, e.g. /work/main/src), the forked modes also run
with that tree's executor and shim, each in a worker process of its own (`--worker MODE`, with
PYTHONPATH=SRC), interleaved with the rest: "forked@baseline" and "forked+cgroup@baseline",
with the ratio of this tree's forked modes to them.

Then, where the node has a v2 cgroup: the start of a process straight into its cgroup
(clone3 with CLONE_INTO_CGROUP, through ctypes) against fork + the `cgroup.procs` write the job
side does today, both then exec `true`: what the RCU wait of a migration costs a start.

Run: `PYTHONPATH=src python bench/bench_shim.py [--jobs 40] [--baseline /work/main/src] [--record]`;
--record appends the result, with the machine and its load average, to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpucluster.executors import cgroups
from gpucluster.executors.base import LaunchSpec, Running
from gpucluster.executors.cgroups import detect
from gpucluster.executors.local import LocalExecutor

CLONE_INTO_CGROUP = 0x200000000
SYS_CLONE3 = 435  # x86_64 and aarch64 alike
_libc = ctypes.CDLL(None, use_errno=True)
_servers: list[LocalExecutor] = []  # whose fork server's CPU counts


TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(pid: int) -> float:
    """A process's CPU and that of its reaped children (clock ticks: exact over a run, not per job)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) * TICK_S
    except (OSError, ValueError, IndexError):
        return 0.0


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    servers = sum(_tree_cpu_s(e.fork_server.pid) for e in _servers if e.fork_server and e.fork_server.pid)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + servers


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
        # A forked keeper's CPU (and its job's) is its server's once the server has reaped it.
        while executor.fork_server is not None and os.path.exists(f"/proc/{handle['pid']}"):
            time.sleep(0.001)

    return run


class _CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls",
        "set_tid", "set_tid_size", "cgroup",
    )]  # fmt: skip


def _true_into(v2_path: str, clone3: bool) -> None:
    """One `true` started inside the v2 cgroup at v2_path and waited for."""
    if clone3:
        fd = os.open(v2_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            args = _CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=fd)
            pid = _libc.syscall(SYS_CLONE3, ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
            if pid == 0:  # the child: a copy of this process, without Python's fork bookkeeping
                os.execv("/bin/true", ["true"])
            if pid < 0:
                raise OSError(ctypes.get_errno(), "clone3")
        finally:
            os.close(fd)
    else:
        pid = os.fork()
        if pid == 0:
            try:
                with open(os.path.join(v2_path, "cgroup.procs"), "w") as f:
                    f.write("0")
                os.execv("/bin/true", ["true"])
            finally:
                os._exit(127)
    os.waitpid(pid, 0)


def clone3_lines(support: cgroups.CgroupSupport, jobs: int) -> list[str]:
    """fork + cgroup.procs write vs clone3(CLONE_INTO_CGROUP), wall and CPU per start, medians."""
    if not support.usable or cgroups.V2 not in support.bases:
        return ["(no v2 cgroup here: clone3(CLONE_INTO_CGROUP) not measured)"]
    instance = f"bench-clone3-{os.getpid()}"
    group = cgroups.create(support, instance, "clone3")
    v2 = group.paths[cgroups.V2]
    wall: dict[str, list[float]] = {"fork + cgroup.procs write": [], "clone3(CLONE_INTO_CGROUP)": []}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    try:
        for _ in range(jobs):
            for name in wall:
                c0, t0 = _cpu(), time.perf_counter()
                _true_into(v2, clone3=name.startswith("clone3"))
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(_cpu() - c0)
    except OSError as e:
        return [f"(clone3(CLONE_INTO_CGROUP) failed here: {e})"]
    finally:
        group.kill()
        group.remove()
        cgroups.remove_parent(support, instance)
    lines = ["| start of `true` in a v2 cgroup | wall, median | CPU, median |", "|---|---|---|"]
    for name in wall:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        lines.append(f"| {name} | {w * 1000:.2f} ms | {c * 1000:.2f} ms |")
    return lines


def _executor(mode: str, support: cgroups.CgroupSupport) -> LocalExecutor:
    forked, cgroup = mode.startswith("forked"), mode.endswith("cgroup")
    if not cgroup:
        return LocalExecutor(fork_server=forked)
    return LocalExecutor(cgroup_support=support, instance=f"bench-{mode[0]}-{os.getpid()}", fork_server=forked)


def worker(mode: str) -> None:
    """`--worker MODE`: one executor of the tree on PYTHONPATH; runs a job per line "I ROOT" read on
    stdin and answers "WALL_S CPU_S" (its CPU as `_cpu` counts it: its own, its children's, and its
    fork server's tree)."""
    support = detect()
    executor = _executor(mode, support)
    _servers.append(executor)
    run = through(executor)
    for line in sys.stdin:
        i, root = line.split(maxsplit=1)
        c0, t0 = _cpu(), time.perf_counter()
        run(int(i), Path(root.strip()))
        print(f"{time.perf_counter() - t0} {_cpu() - c0}", flush=True)
    executor.close()
    if executor.cgroup_support is not None:
        cgroups.remove_parent(support, executor.instance)


class Remote:
    """A mode run by a worker process on another tree (--baseline): `run(i, root)` as the local
    modes, with the wall and CPU the worker measured."""

    def __init__(self, mode: str, src: str) -> None:
        env = {**os.environ, "PYTHONPATH": src}
        argv = [sys.executable, __file__, "--worker", mode]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.last = (0.0, 0.0)

    def __call__(self, i: int, root: Path) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{i} {root}\n")
        self.proc.stdin.flush()
        wall, cpu = self.proc.stdout.readline().split()
        self.last = (float(wall), float(cpu))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--baseline", help="another tree's src: its forked modes run side by side")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    support = detect()
    names = ["shim", "forked", *(["cgroup", "forked+cgroup"] if support.usable else [])]
    executors = {name: _executor(name, support) for name in names}
    _servers.extend(e for e in executors.values() if e.fork_server is not None)
    modes = {"bare": bare, **{name: through(e) for name, e in executors.items()}}
    remotes = {f"{m}@baseline": Remote(m, args.baseline) for m in executors if args.baseline and m.startswith("forked")}
    modes.update(remotes)
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
                spent = (time.perf_counter() - t0, _cpu() - c0)
                if isinstance(run, Remote):  # measured there: this process only waited
                    spent = run.last
                wall[name].append(spent[0])
                cpu[name].append(spent[1])
    for remote in remotes.values():
        remote.close()
    for executor in executors.values():
        executor.close()
        if executor.cgroup_support is not None:
            cgroups.remove_parent(support, executor.instance)
    clone3 = clone3_lines(support, args.jobs)
    load_after = os.getloadavg()
    base_wall, base_cpu = statistics.median(wall["bare"]), statistics.mean(cpu["bare"])
    shim_wall, shim_cpu = statistics.median(wall["shim"]), statistics.mean(cpu["shim"])
    lines = [
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, {args.jobs} jobs per mode; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; {support.describe()}",
        "",
        "| mode | wall per job, median | CPU per job, mean | wall vs bare | CPU vs bare | wall vs shim | CPU vs shim |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in modes:
        w, c = statistics.median(wall[name]), statistics.mean(cpu[name])
        lines.append(
            f"| {name} | {w * 1000:.1f} ms | {c * 1000:.1f} ms | {w / base_wall:.1f}x | {c / base_cpu:.1f}x "
            f"| {w / shim_wall:.2f}x | {c / shim_cpu:.2f}x |"
        )
    lines += [""] if remotes else []
    for name in remotes:
        here = name.removesuffix("@baseline")
        w = statistics.median(wall[here]) / statistics.median(wall[name])
        c = statistics.mean(cpu[here]) / statistics.mean(cpu[name])
        lines.append(f"- {here}, this tree vs {args.baseline}: wall {w:.2f}x, CPU {c:.2f}x")
    lines += ["", *clone3]
    print("\n".join(lines))
    if args.record:
        with open(Path(__file__).with_name("RESULTS.md"), "a") as f:
            f.write(f"\n## Job isolation at start and end (bench/bench_shim.py, {time.strftime('%Y-%m-%d')})\n\n")
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
