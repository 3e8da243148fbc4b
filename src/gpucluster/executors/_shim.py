"""Job shim: the session leader of every job, started by the local executor.

Why it exists: a job must outlive a crash of the head, and its exit code must still be known when
the head comes back. The shim is the parent of the user's command, so it alone can reap it; it
writes the exit code to a file the head reads, whether or not the head is still its parent.

Run as a script with only the standard library (python -I -S), so it starts in milliseconds.
usage: _shim.py RUN_DIR WORKDIR [--die-with-parent] [--user NAME] [--log PATH --max-log-bytes N] -- ARGV
(options in this order)

With --log and --max-log-bytes the shim pumps the command's output into PATH itself, so the log
is capped even while no head runs: past N/2 bytes PATH becomes PATH.1 (the older PATH.1 is
dropped) and a new PATH starts, so at most about N bytes are kept, the newest. PATH.dropped holds
how many bytes were rotated away (what makes the API's offsets count from the attempt's first
byte), and a rotation holds an exclusive flock on PATH.lock, which readers take shared
(gpucluster/executors/logfile.py reads this layout; its append_log keeps the head's copy of a Ray
job's log in the same layout with this file's _CappedLog).

With --user (a root head running a job as its submitter) the shim stays root, so it can write
its records into the head's run dir, and starts the command as NAME: its uid, gid, groups,
HOME, USER and LOGNAME.

With --die-with-parent (the Ray executor's node agent) the shim kills its whole process group
when its parent dies: there the parent is the node's agent, which dies only with the node's Ray
(the head then requeues the job elsewhere), so the job must not run on unseen, holding GPUs.
"""

import contextlib
import fcntl
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time


def _write_atomic(path: str, data: dict) -> None:  # type: ignore[type-arg]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _die_with_parent() -> None:
    """Kill the process group when the parent (the agent) dies, or when this shim is killed.

    Two watchers, because Ray kills a dying worker's direct children (this shim) with SIGKILL:
    a thread here sees the agent go, and a forked watchdog in the group (a grandchild of the
    agent, so not killed with it) sees this shim go. Either kills the whole group; after a
    normal end that only reaches the job's leftover background processes, as a cleanup does.
    """
    shim = os.getpid()
    if os.fork() == 0:
        try:
            for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(stop, signal.SIG_IGN)
            while os.getppid() == shim:
                time.sleep(0.5)
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(0)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


class _CappedLog:
    """The command's output, written in segments of `cap // 2` bytes; see the module docstring."""

    def __init__(self, path: str, cap: int) -> None:
        self.path, self.segment = path, max(1, cap // 2)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size
        try:  # a log written before (the head's copy of a Ray job's log, appended to per chunk)
            with open(f"{path}.dropped") as f:
                self.dropped = int(f.read() or 0)
        except (FileNotFoundError, ValueError):
            self.dropped = 0
        os.close(os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644))  # before any rotation: readers lock

    def close(self) -> None:
        os.close(self.fd)

    def write(self, data: bytes) -> None:
        while data:
            if self.size >= self.segment:
                self._rotate()
            n = os.write(self.fd, data[: self.segment - self.size])
            self.size += n
            data = data[n:]

    def _rotate(self) -> None:
        """Under the readers' lock: PATH -> PATH.1, a new PATH, PATH.dropped updated.

        Safe to retry after a failure (a full disk): the dropped count is written before
        anything moves, and a PATH already moved by an earlier try is not counted again.
        """
        lock = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(self.path):  # not yet moved by an earlier, failed try
                older = f"{self.path}.1"
                dropped = self.dropped + (os.stat(older).st_size if os.path.exists(older) else 0)
                with open(f"{self.path}.dropped.tmp", "w") as f:
                    f.write(str(dropped))
                os.replace(self.path, older)
                os.replace(f"{self.path}.dropped.tmp", f"{self.path}.dropped")
                self.dropped = dropped
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        finally:
            os.close(lock)  # releases the flock
        os.close(self.fd)
        self.fd, self.size = fd, 0


def _pump(read_fd: int, log: _CappedLog) -> None:
    while True:
        try:
            data = os.read(read_fd, 1 << 16)
        except OSError:
            return
        if not data:
            return
        # A full disk must not stop the job (nor this pump, or the job would block on a full
        # pipe): its output is dropped until the log can be written again.
        with contextlib.suppress(OSError):
            log.write(data)


def main() -> int:
    # Stop signals go to the whole process group: the command must get them, the shim must
    # survive them to record how the command ended. A handler (unlike SIG_IGN) is reset by exec.
    # One that comes before the command exists is kept for it (below).
    stops: list[int] = []
    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(stop, lambda signum, _: stops.append(signum))
    run_dir, workdir, sep, *argv = sys.argv[1:]
    if sep == "--die-with-parent":
        _die_with_parent()
        sep, argv = argv[0], argv[1:]
    uid = gid = groups = None
    if sep == "--user":
        account = pwd.getpwnam(argv[0])
        sep, argv = argv[1], argv[2:]
        uid, gid = account.pw_uid, account.pw_gid
        groups = os.getgrouplist(account.pw_name, account.pw_gid)
        os.environ.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    log_path, cap = None, 0
    if sep == "--log":
        log_path, cap = argv[0], int(argv[2])  # --log PATH --max-log-bytes N
        sep, argv = argv[3], argv[4:]
    assert sep == "--"
    pid = os.getpid()
    _write_atomic(
        os.path.join(run_dir, "shim.json"),
        {"pid": pid, "pgid": os.getpgid(0), "start_ticks": _start_ticks(pid)},
    )
    sig: int | None
    pump = None
    out: int | None = None
    if log_path is not None and cap > 0:
        read_fd, out = os.pipe()
        pump = threading.Thread(target=_pump, args=(read_fd, _CappedLog(log_path, cap)), daemon=True)
        pump.start()
    try:
        proc = subprocess.Popen(argv, cwd=workdir, user=uid, group=gid, extra_groups=groups, stdout=out, stderr=out)
    except OSError as e:
        print(f"gpucluster: cannot start {argv[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
        code, sig = 127, None
    else:
        if out is not None:
            os.close(out)
            out = None
        if stops:
            # A stop (a preemption, a cancel) sent while the command was being started reached
            # only this shim, or the command before its exec: without this it would run on.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(stops[0])
        rc = proc.wait()
        code, sig = (rc, None) if rc >= 0 else (128 - rc, -rc)
    if out is not None:
        os.close(out)
    if pump is not None:
        # All of the command's output is in the log before its exit is recorded; background
        # children still holding the pipe do not hold the record up (the head kills them).
        pump.join(timeout=2)
    _write_atomic(os.path.join(run_dir, "exit.json"), {"exit_code": code, "signal": sig})
    return code


if __name__ == "__main__":
    sys.exit(main())
