"""The job shim (executors/_shim.py) and stop signals that come while it starts the command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.executors import _shim
from gpucluster.executors.local import write_shim_spec


@pytest.fixture
def restore_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_sigterm_that_reaches_the_shim_before_the_command_starts_stops_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_handlers: None
) -> None:
    """Found by tests/e2e/test_crash_consistency.py: a preemption's SIGTERM sent in this window
    was swallowed by the shim, and the job ran on to its end (then ran again, requeued)."""
    real_popen = subprocess.Popen

    def popen_after_a_sigterm(*args: object, **kw: object) -> subprocess.Popen[bytes]:
        os.kill(os.getpid(), signal.SIGTERM)  # the head's killpg, before the command exists
        return real_popen(*args, **kw)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(_shim.subprocess, "Popen", popen_after_a_sigterm)
    write_shim_spec(
        tmp_path, argv=["sleep", "30"], env={"PATH": "/usr/bin:/bin"}, workdir=str(tmp_path), log=tmp_path / "out.log"
    )
    monkeypatch.setattr(sys, "argv", ["_shim.py", str(tmp_path)])
    assert _shim.main() == 128 + signal.SIGTERM
    record = json.loads((tmp_path / "exit.json").read_text())
    assert record == {"exit_code": 143, "signal": signal.SIGTERM, "stopped": True}


def test_a_sigterm_that_comes_after_the_command_ended_by_itself_is_reported_as_not_stopping_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_handlers: None
) -> None:
    """Found by tests/e2e/test_crash_consistency.py: a preemption's SIGTERM sent just as the
    command exited 0 by itself (the head still saw it running) reached only the shim, and the
    head requeued a job that had finished. The record says the stop came too late."""
    real_thread = threading.Thread

    class StoppedAfterTheEnd(real_thread):
        """The log pump, joined once the command's wait has returned: the stop comes then."""

        def join(self, timeout: float | None = None) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the head's killpg, into a group the command left
            super().join(timeout)

    monkeypatch.setattr(_shim.threading, "Thread", StoppedAfterTheEnd)
    write_shim_spec(
        tmp_path, argv=["true"], env={"PATH": "/usr/bin:/bin"}, workdir=str(tmp_path), log=tmp_path / "out.log"
    )
    monkeypatch.setattr(sys, "argv", ["_shim.py", str(tmp_path)])
    assert _shim.main() == 0
    assert json.loads((tmp_path / "exit.json").read_text()) == {"exit_code": 0, "signal": None, "stopped": False}


def test_a_command_stopped_while_it_runs_is_reported_as_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_handlers: None
) -> None:
    real_popen = subprocess.Popen

    class StoppedWhileRunning(real_popen):  # type: ignore[valid-type, misc]
        def wait(self, timeout: float | None = None) -> int:
            os.kill(os.getpid(), signal.SIGTERM)  # the head's killpg: the job side, and ...
            self.send_signal(signal.SIGTERM)  # ... the command in the same group
            return int(super().wait(timeout))

    monkeypatch.setattr(_shim.subprocess, "Popen", StoppedWhileRunning)
    write_shim_spec(
        tmp_path, argv=["sleep", "30"], env={"PATH": "/usr/bin:/bin"}, workdir=str(tmp_path), log=tmp_path / "out.log"
    )
    monkeypatch.setattr(sys, "argv", ["_shim.py", str(tmp_path)])
    assert _shim.main() == 128 + signal.SIGTERM
    record = json.loads((tmp_path / "exit.json").read_text())
    assert record == {"exit_code": 143, "signal": signal.SIGTERM, "stopped": True}
