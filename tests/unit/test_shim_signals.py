"""The job shim (executors/_shim.py) and stop signals that come while it starts the command."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    real_spawn = _shim._spawn_command

    def spawn_after_a_sigterm(*args: Any) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # the head's killpg, before the command exists
        return real_spawn(*args)

    monkeypatch.setattr(_shim, "_spawn_command", spawn_after_a_sigterm)
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
    real_wait = _shim._wait_for

    def stopped_after_the_end(pid: int, stops: list[int]) -> tuple[int, bool]:
        ended = real_wait(pid, stops)  # the command's wait has returned: the stop comes now
        os.kill(os.getpid(), signal.SIGTERM)  # the head's killpg, into a group the command left
        return ended

    monkeypatch.setattr(_shim, "_wait_for", stopped_after_the_end)
    write_shim_spec(
        tmp_path, argv=["true"], env={"PATH": "/usr/bin:/bin"}, workdir=str(tmp_path), log=tmp_path / "out.log"
    )
    monkeypatch.setattr(sys, "argv", ["_shim.py", str(tmp_path)])
    assert _shim.main() == 0
    assert json.loads((tmp_path / "exit.json").read_text()) == {"exit_code": 0, "signal": None, "stopped": False}


def test_a_command_stopped_while_it_runs_is_reported_as_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_handlers: None
) -> None:
    real_spawn = _shim._spawn_command

    def stopped_while_running(*args: Any) -> int:
        pid = real_spawn(*args)
        os.kill(os.getpid(), signal.SIGTERM)  # the head's killpg: the job side, and ...
        os.kill(pid, signal.SIGTERM)  # ... the command in the same group
        return pid

    monkeypatch.setattr(_shim, "_spawn_command", stopped_while_running)
    write_shim_spec(
        tmp_path, argv=["sleep", "30"], env={"PATH": "/usr/bin:/bin"}, workdir=str(tmp_path), log=tmp_path / "out.log"
    )
    monkeypatch.setattr(sys, "argv", ["_shim.py", str(tmp_path)])
    assert _shim.main() == 128 + signal.SIGTERM
    record = json.loads((tmp_path / "exit.json").read_text())
    assert record == {"exit_code": 143, "signal": signal.SIGTERM, "stopped": True}
