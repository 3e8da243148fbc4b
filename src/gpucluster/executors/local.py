"""Runs jobs as local processes, each under a shim in its own session and process group.

Identity of a process across head restarts is (pid, kernel start time), so a recycled pid is
never mistaken for a job, and never signalled.

A multi-process attempt (ranks) runs one shim per process, each in a session of its own, under
`RUN_DIR/rank-R/`. Before the first one starts, `RUN_DIR/launch.json` records how many there
will be, so after a head crash `recover` can tell a complete launch from one cut short. The
handle lists every rank: {"ranks": [{"rank", "pid", "pgid", "start_ticks", "run_dir"}, ...],
"expected": N, "run_dir": RUN_DIR, "marker": "NAME=VALUE"}.
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

from gpucluster.executors.base import (
    Exited,
    Handle,
    LaunchError,
    LaunchSpec,
    Lost,
    ProcessSpec,
    Running,
    Status,
    combined,
    expected_processes,
)

SHIM = Path(__file__).with_name("_shim.py")
MANIFEST = "launch.json"


def rank_dir(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}"


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


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def marked_pids(marker: str) -> list[int]:
    """Processes (of this user) whose environment holds `marker` ("NAME=VALUE"), wherever their
    session: what finds the workers a launcher started in sessions of their own."""
    needle = b"\0" + marker.encode() + b"\0"
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or another user's
            continue
        if needle in b"\0" + environ:
            found.append(int(entry.name))
    return found


def give_checkpoints_to(user: str, checkpoint_dir: str | None) -> None:
    """A job run as `user` must write its checkpoints: hand it the job's checkpoint directory."""
    import pwd

    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise LaunchError(f"there is no Unix account {user!r} on this node to run the job as") from None
    if checkpoint_dir and os.path.isdir(checkpoint_dir):
        os.chown(checkpoint_dir, account.pw_uid, account.pw_gid)


class LocalExecutor:
    def __init__(self, die_with_parent: bool = False, max_log_bytes: int = 0) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # > 0: each process's shim writes its log, rotated past this size (_shim.py, logfile.py).
        self.max_log_bytes = max_log_bytes
        self._lock = threading.Lock()
        # Jobs die with this process (the Ray node agent), instead of outliving it (the head).
        self._shim_opts = ["--die-with-parent"] if die_with_parent else []

    def launch(self, spec: LaunchSpec) -> Handle:
        if not os.path.isdir(spec.workdir):
            raise LaunchError(f"workdir {spec.workdir} does not exist on this node")
        if spec.user is not None:
            give_checkpoints_to(spec.user, spec.env.get("GPUCLUSTER_CHECKPOINT_DIR"))
        if spec.processes:
            return self._launch_ranks(spec)
        return self._launch_one(ProcessSpec(spec.argv, spec.env, spec.run_dir, spec.log_path), spec.workdir, spec.user)

    def _launch_one(self, p: ProcessSpec, workdir: str, user: str | None = None) -> Handle:
        p.run_dir.mkdir(parents=True, exist_ok=True)
        p.log_path.parent.mkdir(parents=True, exist_ok=True)
        as_user = ["--user", user] if user is not None else []
        cap = ["--log", str(p.log_path), "--max-log-bytes", str(self.max_log_bytes)] if self.max_log_bytes > 0 else []
        shim = [sys.executable, "-I", "-S", str(SHIM), str(p.run_dir), workdir, *self._shim_opts, *as_user, *cap]
        with open(p.log_path, "ab") as log:
            proc = subprocess.Popen(
                [*shim, "--", *p.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=p.env,
                cwd=workdir,
                start_new_session=True,
                close_fds=True,
            )
        with self._lock:
            self._children[proc.pid] = proc
        ticks = start_ticks(proc.pid)
        return {"pid": proc.pid, "pgid": proc.pid, "start_ticks": ticks, "run_dir": str(p.run_dir)}

    def _launch_ranks(self, spec: LaunchSpec) -> Handle:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        # Durable before the first process exists: a head that dies halfway through this loop
        # leaves a manifest that says how many ranks `recover` should find.
        _write_json(spec.run_dir / MANIFEST, {"ranks": len(spec.processes), "marker": spec.marker})
        handle: Handle = {"ranks": [], "expected": len(spec.processes), "run_dir": str(spec.run_dir)}
        if spec.marker:
            handle["marker"] = spec.marker
        try:
            for rank, p in enumerate(spec.processes):
                handle["ranks"].append({"rank": rank, **self._launch_one(p, spec.workdir, spec.user)})
        except OSError as e:
            self.signal(handle, signal.SIGKILL)
            self.cleanup(handle)
            raise LaunchError(f"could not start rank {len(handle['ranks'])}: {e.strerror or e}") from e
        return handle

    def recover(self, run_dir: Path) -> Handle | None:
        manifest = _read_json(run_dir / MANIFEST)
        if manifest is None:
            shim = _read_json(run_dir / "shim.json")
            if shim is None:
                return None
            return {**shim, "run_dir": str(run_dir)}
        ranks = []
        for rank in range(int(manifest["ranks"])):
            shim = _read_json(rank_dir(run_dir, rank) / "shim.json")
            if shim is not None:
                ranks.append({"rank": rank, **shim, "run_dir": str(rank_dir(run_dir, rank))})
        if not ranks:
            return None
        handle: Handle = {"ranks": ranks, "expected": int(manifest["ranks"]), "run_dir": str(run_dir)}
        if manifest.get("marker"):
            handle["marker"] = manifest["marker"]
        return handle

    def _alive(self, handle: Handle) -> bool:
        pid = int(handle["pid"])
        with self._lock:
            child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        ticks = start_ticks(pid)
        return ticks is not None and (handle.get("start_ticks") in (None, ticks))

    def poll(self, handle: Handle) -> Status:
        if "ranks" in handle:
            return combined(self.poll_ranks(handle))
        return self._poll_one(handle)

    def poll_ranks(self, handle: Handle) -> list[Status]:
        if "ranks" not in handle:
            return [self._poll_one(handle)]
        out: list[Status] = [Lost("this rank was never started")] * expected_processes(handle)
        for r in handle["ranks"]:
            out[int(r["rank"])] = self._poll_one(r)
        return out

    def _poll_one(self, handle: Handle) -> Status:
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
        if "ranks" not in handle:
            self._signal_one(handle, signum)
            return
        for r in handle["ranks"]:
            self._signal_one(r, signum)
        if signum == signal.SIGKILL:
            self._kill_marked(handle)

    def _signal_one(self, handle: Handle, signum: int) -> None:
        if not self._alive(handle):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(handle["pgid"]), signum)

    def cleanup(self, handle: Handle) -> None:
        # The shim has exited, so no pid can be recycled into this group id while members remain.
        for r in handle.get("ranks", [handle]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(r["pgid"]), signal.SIGKILL)
        self._kill_marked(handle)

    def _kill_marked(self, handle: Handle) -> None:
        marker = handle.get("marker")
        if not marker:
            return
        for pid in marked_pids(str(marker)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
