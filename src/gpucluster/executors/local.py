"""Runs jobs as local processes, each under a shim in its own session and process group.

Identity of a process across head restarts is (pid, kernel start time), so a recycled pid is
never mistaken for a job, and never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from gpucluster.executors.base import Exited, Handle, LaunchError, LaunchSpec, Lost, Running, Status

SHIM = Path(__file__).with_name("_shim.py")


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None if it is gone or a zombie.

    A zombie has exited: only its exit status waits for a parent to collect it. After a head
    crash the shim's new parent may take a while to reap it, and it must not look alive meanwhile.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (IndexError, ValueError):
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return None


class LocalExecutor:
    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def launch(self, spec: LaunchSpec) -> Handle:
        if not os.path.isdir(spec.workdir):
            raise LaunchError(f"workdir {spec.workdir} does not exist on this node")
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SHIM), str(spec.run_dir), spec.workdir, "--", *spec.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=spec.env,
                cwd=spec.workdir,
                start_new_session=True,
                close_fds=True,
            )
        with self._lock:
            self._children[proc.pid] = proc
        ticks = start_ticks(proc.pid)
        return {"pid": proc.pid, "pgid": proc.pid, "start_ticks": ticks, "run_dir": str(spec.run_dir)}

    def recover(self, run_dir: Path) -> Handle | None:
        shim = _read_json(run_dir / "shim.json")
        if shim is None:
            return None
        return {**shim, "run_dir": str(run_dir)}

    def _alive(self, handle: Handle) -> bool:
        pid = int(handle["pid"])
        with self._lock:
            child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        ticks = start_ticks(pid)
        return ticks is not None and (handle.get("start_ticks") in (None, ticks))

    def poll(self, handle: Handle) -> Status:
        if self._alive(handle):
            return Running()
        with self._lock:
            child = self._children.pop(int(handle["pid"]), None)
        record = _read_json(Path(handle["run_dir"]) / "exit.json")
        if record is not None:
            return Exited(int(record["exit_code"]), record.get("signal"))
        if child is not None and child.returncode is not None and child.returncode < 0:
            # The shim itself was killed (SIGKILL to the group): the command died with it.
            sig = -child.returncode
            return Exited(128 + sig, sig)
        return Lost("the job's process is gone and left no exit code")

    def signal(self, handle: Handle, signum: int) -> None:
        if not self._alive(handle):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(handle["pgid"]), signum)

    def cleanup(self, handle: Handle) -> None:
        # The shim has exited, so no pid can be recycled into this group id while members remain.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(handle["pgid"]), signal.SIGKILL)
