"""executors/liveness.py: a keeper's liveness from a pidfd kept open, never a stale answer."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import Iterator

import pytest

from gpucluster.executors.liveness import Liveness
from gpucluster.executors.local import start_ticks


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_running_process_is_asked_of_proc_once_then_of_its_pidfd(sleeper: subprocess.Popen[bytes]) -> None:
    """The first question checks the start time in /proc; later ones never read /proc (the
    cost this module removes), and the exit is seen at once, with the pidfd then closed."""
    asked: list[int] = []

    def counted(pid: int) -> int | None:
        asked.append(pid)
        return start_ticks(pid)

    live = Liveness(counted)
    ticks = start_ticks(sleeper.pid)
    before = _open_fds()
    assert live.alive(sleeper.pid, ticks)
    assert all(live.alive(sleeper.pid, ticks) for _ in range(20))
    assert asked == [sleeper.pid]
    assert _open_fds() == before + 1
    sleeper.kill()
    sleeper.wait()
    assert not live.alive(sleeper.pid, ticks)
    assert _open_fds() == before  # its pidfd closed
    live.close()


def test_an_exited_process_not_yet_reaped_is_not_alive() -> None:
    """A zombie has exited; only its status waits for its parent (a keeper after a head crash)."""
    proc = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 120  # generous: a loaded machine; the wait is for an event
        while start_ticks(proc.pid) is not None:  # a zombie reads as None in /proc
            assert time.monotonic() < deadline
            time.sleep(0.01)
        live = Liveness(start_ticks)
        assert not live.alive(proc.pid, None)
        live.close()
    finally:
        proc.wait()


def test_another_start_of_the_pid_is_not_the_process_asked_about(sleeper: subprocess.Popen[bytes]) -> None:
    """A pid reused by another process (its start time differs) answers not alive, whether the
    pidfd was opened for that start or is asked of with another start's ticks later."""
    live = Liveness(start_ticks)
    ticks = start_ticks(sleeper.pid)
    assert ticks is not None
    before = _open_fds()
    assert not live.alive(sleeper.pid, ticks - 1)  # the recorded process started earlier
    assert _open_fds() == before  # nothing kept for it
    assert live.alive(sleeper.pid, ticks)
    assert not live.alive(sleeper.pid, ticks + 1)  # kept for one start, asked of another
    assert live.alive(sleeper.pid, None)  # no recorded start: any process with the pid
    live.close()
    assert _open_fds() == before


def test_without_pidfds_it_asks_proc(sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """An older kernel (pidfd_open fails with ENOSYS): the same answers, from /proc."""

    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    live = Liveness(start_ticks)
    ticks = start_ticks(sleeper.pid)
    assert live.alive(sleeper.pid, ticks) and not live.alive(sleeper.pid, (ticks or 0) + 1)
    sleeper.kill()
    sleeper.wait()
    assert not live.alive(sleeper.pid, ticks)


def test_a_pidfd_above_1024_is_asked_too(sleeper: subprocess.Popen[bytes]) -> None:
    """A head holds thousands of connections: its pidfds may number above select's 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open at most {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.dup(0 if not held else held[0]))
        live = Liveness(start_ticks)
        ticks = start_ticks(sleeper.pid)
        assert live.alive(sleeper.pid, ticks) and live._fds[sleeper.pid][1] > 1024
        sleeper.kill()
        sleeper.wait()
        assert not live.alive(sleeper.pid, ticks)
        live.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
