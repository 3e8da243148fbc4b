"""Whether a job's keeper process still runs, asked of a pidfd kept open instead of /proc.

The head asks this of every running job at every cycle (head/loop.py `_reconcile`), and a cycle
follows every burst of submissions. Asked through /proc/<pid>/stat it cost an open, an fstat, an
ioctl, a seek, a read and a close, and a Python file object, per job per cycle: with 8 jobs
running, 8 of each per submission from a lone client, about a tenth of the head's CPU per
submission (issue 18, `strace -c` on the head). A pidfd (Linux 5.3+) is opened once per process
and becomes readable when the process exits, so the question is then one `poll` of it, and a
reused pid can never answer for the process it replaced: the pidfd names that one process.

Where pidfds are missing (an older kernel, another OS) every question is asked of /proc, as before.
"""

from __future__ import annotations

import errno
import os
import select
import threading
from collections.abc import Callable

# The start time (clock ticks since boot) of a live, not-yet-exited process; None where gone.
StartTicks = Callable[[int], "int | None"]


def readable(fd: int, timeout_s: float = 0.0) -> bool:
    """Whether `fd` is readable (or closed) within `timeout_s`. poll, not select: a head holding
    thousands of connections has descriptors above select's 1,024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


class Liveness:
    """Open pidfds of the processes asked about, each checked against the start time the caller
    recorded when it started the process (so a pidfd opened after the pid was reused is refused).

    Thread-safe: the loop and API threads ask. The poll runs under the lock, since a pidfd
    closed by another thread could meanwhile be reused by an unrelated file, which a poll
    would call readable (a live job taken for ended)."""

    def __init__(self, start_ticks: StartTicks) -> None:
        self._start_ticks = start_ticks
        self._lock = threading.Lock()
        self._fds: dict[int, tuple[int | None, int]] = {}  # pid -> (its start ticks, its pidfd)
        self._usable = hasattr(os, "pidfd_open")

    def alive(self, pid: int, ticks: int | None) -> bool:
        """Whether process `pid`, started at `ticks` (None: any start), runs and has not exited."""
        if not self._usable:
            return self._by_proc(pid, ticks)
        with self._lock:
            kept = self._fds.get(pid)
            if kept is not None and kept[0] != ticks:  # asked of another start of this pid
                self._forget(pid)
                kept = None
            if kept is None:
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:
                    return False
                except OSError as e:  # no pidfd for it: asked of /proc (from now on, if none at all)
                    if e.errno == errno.ENOSYS:
                        self._usable = False
                    return self._by_proc(pid, ticks)
                # Opened first and checked after: a pid reused between a check and the open
                # would otherwise be watched in place of the process the caller started.
                if not self._by_proc(pid, ticks):
                    os.close(fd)
                    return False
                kept = self._fds[pid] = (ticks, fd)
            if readable(kept[1]):  # it exited (a zombie too): its pidfd is not needed any more
                self._forget(pid)
                return False
            return True

    def _by_proc(self, pid: int, ticks: int | None) -> bool:
        now = self._start_ticks(pid)
        return now is not None and (ticks is None or now == ticks)

    def _forget(self, pid: int) -> None:
        kept = self._fds.pop(pid, None)
        if kept is not None:
            os.close(kept[1])

    def close(self) -> None:
        """Close every pidfd kept (the executor is shut down)."""
        with self._lock:
            for pid in list(self._fds):
                self._forget(pid)
