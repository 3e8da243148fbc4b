"""Start the example the two ways the cluster can: 4 processes with the environment from
`gpucluster.launch.ranks` (as the head's per-GPU launch will), or one plain torchrun.

Every process is started in a session of its own and remembered by PID, so `stop()` can end it
(and, for torchrun, the workers in its process group) even when a test fails halfway.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpucluster.core.types import NodeSlice
from gpucluster.launch.ranks import launcher_commands, per_gpu_envs, pick_free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_classifier" / "train.py"
STATED_ACCURACY = 0.97  # examples/ddp_classifier/README.md
WORLD = 4

Event = dict[str, Any]


def _base_env(checkpoint_dir: Path, extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "TORCHELASTIC_"))}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["GPUCLUSTER_CHECKPOINT_DIR"] = str(checkpoint_dir)
    env["GPUCLUSTER_RDZV_TIMEOUT_S"] = "20"
    env["GPUCLUSTER_COLLECTIVE_TIMEOUT_S"] = "20"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Run:
    """One attempt of the example: its processes, and rank 0's JSON events."""

    def __init__(self, procs: Sequence[subprocess.Popen[bytes]], out: Path, started: float) -> None:
        self.procs = list(procs)
        self.out = out
        self.started = started

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def events(self) -> list[Event]:
        found: list[Event] = []
        if not self.out.exists():
            return found
        for line in self.out.read_text(errors="replace").splitlines():
            if line.startswith('{"event"'):
                with contextlib.suppress(json.JSONDecodeError):  # a line being written
                    found.append(json.loads(line))
        return found

    def wait_for(self, pred: Callable[[Event], bool], timeout: float = 60.0) -> Event:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if pred(e):
                    return e
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.02)
        raise AssertionError(f"no matching event within {timeout}s; output:\n{self.log_tail()}")

    def wait(self, timeout: float = 60.0) -> list[int]:
        deadline = time.monotonic() + timeout
        codes: list[int] = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"processes still running after {timeout}s:\n{self.log_tail()}") from None
        return codes

    def signal(self, sig: int, ranks: Sequence[int] | None = None) -> None:
        for i, p in enumerate(self.procs):
            if (ranks is None or i in ranks) and p.poll() is None:
                os.kill(p.pid, sig)

    def done(self) -> Event:
        return next(e for e in self.events() if e["event"] == "done")

    def log_tail(self, n: int = 4000) -> str:
        parts = []
        for f in sorted(self.out.parent.glob(self.out.stem.rsplit("-", 1)[0] + "-*.log")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-n:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGKILL whatever still runs: each process's own group (it leads a session)."""
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class Launcher:
    """Starts attempts of the example and remembers them all for cleanup."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.checkpoint_dir = workdir / "checkpoints"
        self.runs: list[Run] = []
        self._n = 0

    def _log(self, rank: int | str) -> Path:
        return self.workdir / f"run{self._n}-{rank}.log"

    def per_gpu(
        self, attempt: int = 1, args: Sequence[str] = (), env: dict[str, str] | None = None, job_id: int = 1
    ) -> Run:
        """4 processes with the env the head will give them (`per_gpu_envs`), one per virtual GPU."""
        self._n += 1
        port = pick_free_port("127.0.0.1")
        slices = (NodeSlice("node0", (0, 1, 2, 3)),)
        base = _base_env(self.checkpoint_dir, env)
        base.update({"GPUCLUSTER_ATTEMPT": str(attempt), "GPUCLUSTER_JOB_ID": str(job_id)})
        started = time.monotonic()
        procs = []
        for pe in per_gpu_envs(slices, {"node0": "127.0.0.1"}, port, job_id=job_id, attempt=attempt):
            with open(self._log(pe.placement.rank), "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(EXAMPLE), *args],
                        env=pe.apply(base),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=self.workdir,
                        start_new_session=True,
                    )
                )
        run = Run(procs, self._log(0), started)
        self.runs.append(run)
        return run

    def torchrun(self, args: Sequence[str] = (), env: dict[str, str] | None = None) -> Run:
        """Plain torchrun on one node, as a user would start it by hand.

        The command line is the one `launcher_commands` builds for the cluster's launcher mode,
        so that mode's command is exercised for real; only the cluster's extra variables are left
        out.
        """
        self._n += 1
        port = pick_free_port("127.0.0.1")
        slices = (NodeSlice("node0", tuple(range(WORLD))),)
        (cmd,) = launcher_commands(
            slices, {"node0": "127.0.0.1"}, port, [sys.executable, str(EXAMPLE), *args], job_id=1, attempt=1
        )
        started = time.monotonic()
        with open(self._log(0), "wb") as log:
            proc = subprocess.Popen(
                list(cmd.argv),
                env=_base_env(self.checkpoint_dir, env),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        run = Run([proc], self._log(0), started)
        self.runs.append(run)
        return run

    def stop_all(self) -> None:
        for r in self.runs:
            r.stop()
