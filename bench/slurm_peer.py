"""Drive the real Slurm peer (/work/shared/peers/slurm) that bench_submit.py compares against.

Why a separate module: the Slurm side is plain subprocess plumbing around start.sh/stop.sh,
sbatch and two log files, and keeping it apart keeps bench_submit.py about the measurement.

Two sources of start times, because they differ in resolution:
- the jobcomp log ($DIR/log/jobcomp.txt) that start.sh configures: one line per finished job,
  with StartTime/EndTime in *whole seconds* (local time, no fraction);
- slurmctld.log, whose lines are stamped to the millisecond; the scheduler logs
  "sched: Allocate JobId=N" (main scheduler) or "Started JobId=N" (backfill) at the moment
  it starts the job, which is the same instant Slurm records as StartTime.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

PEER_DIR = Path("/work/shared/peers/slurm")
_ALLOC = re.compile(r"^\[(\S+)\] .*\b(?:Allocate|Started) JobId=(\d+)\b")
_DONE = re.compile(r"^\[(\S+)\] _job_complete: JobId=(\d+) done")


class SlurmError(RuntimeError):
    """Slurm could not be started, driven or read; the message says what to look at."""


@dataclass(frozen=True)
class JobComp:
    """One line of the jobcomp log. Times are unix seconds, truncated to whole seconds by Slurm."""

    job_id: int
    state: str
    start: float
    end: float
    submit: float


@dataclass
class SlurmPeer:
    """A running Slurm started by start.sh; `env` carries SLURM_CONF for every client call."""

    dir: Path
    nodes: int
    gpus_per_node: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def jobcomp_path(self) -> Path:
        return self.dir / "log" / "jobcomp.txt"

    @property
    def ctld_log_path(self) -> Path:
        return self.dir / "log" / "slurmctld.log"

    def version(self) -> str:
        return self._run("sbatch", "--version").strip()

    def ctld_pid(self) -> int | None:
        """slurmctld's pid (from its pid file), to read its CPU time."""
        try:
            return int((self.dir / "slurmctld.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _run(self, *argv: str, timeout: float = 60) -> str:
        try:
            proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError as e:
            raise SlurmError(f"{argv[0]} not found; is slurm-wlm installed?") from e
        except subprocess.TimeoutExpired as e:
            raise SlurmError(f"{' '.join(argv)} took more than {timeout:.0f}s") from e
        if proc.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def submit(self, wrap: str, gpus: int = 1) -> tuple[int, float]:
        """sbatch one job; returns (job id, wall clock taken just before calling sbatch).

        Output goes to /dev/null so thousands of jobs leave no slurm-N.out files in the cwd.
        """
        t = time.time()
        gres, out_opts = f"--gres=gpu:{gpus}", ("--output=/dev/null", "--error=/dev/null")
        out = self._run("sbatch", "--parsable", gres, *out_opts, f"--chdir={self.dir}", "--wrap", wrap)
        try:
            return int(out.strip().split(";")[0]), t
        except ValueError as e:
            raise SlurmError(f"sbatch printed {out!r}, expected a job id") from e

    def queue_len(self) -> int:
        """Jobs slurmctld still holds as pending/running/completing."""
        out = self._run("squeue", "-h", "-o", "%i", "-t", "PD,R,CG,CF,S")
        return len(out.split())

    def cancel_all(self, timeout: float = 120) -> None:
        """scancel every job and wait until the queue is empty, so the next phase starts clean."""
        self._run("scancel", "--user", "root")
        deadline = time.monotonic() + timeout
        while self.queue_len() > 0:
            if time.monotonic() > deadline:
                raise SlurmError(f"queue not empty {timeout:.0f}s after scancel")
            time.sleep(0.5)

    def read_jobcomp(self) -> dict[int, JobComp]:
        """Parse jobcomp.txt ("Key=Value ..." per line; times local, whole seconds)."""
        jobs: dict[int, JobComp] = {}
        if not self.jobcomp_path.exists():
            return jobs
        for line in self.jobcomp_path.read_text().splitlines():
            kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
            try:
                job = JobComp(
                    job_id=int(kv["JobId"]),
                    state=kv.get("JobState", "?"),
                    start=_local_ts(kv["StartTime"]),
                    end=_local_ts(kv["EndTime"]),
                    submit=_local_ts(kv["SubmitTime"]),
                )
            except (KeyError, ValueError):
                continue  # a half-written last line, or a job cancelled before it started
            jobs[job.job_id] = job
        return jobs

    def read_ctld_times(self) -> tuple[dict[int, float], dict[int, float]]:
        """Millisecond (start, end) times from slurmctld.log: "sched: Allocate JobId=N" (or
        backfill's "Started JobId=N") and "_job_complete: JobId=N done"."""
        starts: dict[int, float] = {}
        ends: dict[int, float] = {}
        if not self.ctld_log_path.exists():
            return starts, ends
        with self.ctld_log_path.open(errors="replace") as f:
            for line in f:
                if m := _ALLOC.match(line):
                    starts.setdefault(int(m.group(2)), _local_ts(m.group(1)))
                elif m := _DONE.match(line):
                    ends.setdefault(int(m.group(2)), _local_ts(m.group(1)))
        return starts, ends


def _local_ts(s: str) -> float:
    """Slurm writes local time without a zone ("2026-11-22T09:52:25[.534]"); make it unix time."""
    return datetime.fromisoformat(s).timestamp()


def start(
    dir: Path, nodes: int, gpus_per_node: int, fresh: bool = True, scheduler_parameters: str | None = None
) -> SlurmPeer:
    """Run start.sh and return a handle whose env has the SLURM_CONF it printed.

    fresh=True wipes the state dir and logs first: start.sh's slurmctld -i reloads saved jobs,
    and leftovers from an earlier run would sit in the queue being measured.
    """
    if os.geteuid() != 0:
        raise SlurmError("the Slurm peer needs root (start.sh runs slurmctld/slurmd as root)")
    script = PEER_DIR / "start.sh"
    if not script.exists():
        raise SlurmError(f"{script} is missing")
    running = [pid for pid in _pids(dir) if _alive(pid)]
    if running:
        raise SlurmError(
            f"Slurm already running from {dir} (pids {running}); stop it with DIR={dir} {PEER_DIR / 'stop.sh'}"
        )
    if fresh:
        for sub in ("state", "spool", "log"):
            shutil.rmtree(dir / sub, ignore_errors=True)
    env = {**os.environ, "DIR": str(dir), "NODES": str(nodes), "GPUS": str(gpus_per_node)}
    try:
        proc = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=900, check=False)
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"{script} did not finish in 900s (apt-get install?)") from e
    m = re.search(r"export SLURM_CONF=(\S+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise SlurmError(f"{script} failed ({proc.returncode}); see {dir}/log\n{proc.stdout}{proc.stderr}")
    peer = SlurmPeer(dir, nodes, gpus_per_node, env={**env, "SLURM_CONF": m.group(1)})
    if scheduler_parameters:
        tune(peer, scheduler_parameters)
    return peer


def tune(peer: SlurmPeer, scheduler_parameters: str) -> None:
    """Set slurm.conf's SchedulerParameters (e.g. "batch_sched_delay=0", the usual tuning for
    short jobs) on the running peer: start.sh takes no such option, so the line is appended and
    slurmctld re-reads its config (`scontrol reconfigure`); checked with `scontrol show config`."""
    conf = peer.dir / "slurm.conf"
    conf.write_text(conf.read_text() + f"SchedulerParameters={scheduler_parameters}\n")
    peer._run("scontrol", "reconfigure")
    shown = peer._run("scontrol", "show", "config")
    if scheduler_parameters not in shown:
        raise SlurmError(f"slurmctld did not take SchedulerParameters={scheduler_parameters}")


def stop(peer: SlurmPeer, timeout: float = 30) -> None:
    """Cancel whatever is queued, stop the daemons by the PIDs start.sh recorded, and wait
    for them to exit (stop.sh only signals), so a restart finds its ports free."""
    with contextlib.suppress(SlurmError):  # controller gone: stop.sh still kills by pid file
        peer.cancel_all(timeout=60)  # let slurmd reap the jobs' processes before it goes
    pids = _pids(peer.dir)
    subprocess.run([str(PEER_DIR / "stop.sh")], env=peer.env, capture_output=True, timeout=60, check=False)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            raise SlurmError(f"Slurm daemons {[p for p in pids if _alive(p)]} did not exit")
        time.sleep(0.2)


def _pids(dir: Path) -> list[int]:
    """PIDs from the pid files start.sh's slurm.conf names (slurmctld.pid, slurmd.<node>.pid)."""
    pids = []
    for f in [dir / "slurmctld.pid", *dir.glob("slurmd.*.pid")]:
        with contextlib.suppress(OSError, ValueError, IndexError):
            pids.append(int(f.read_text().split()[0]))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
