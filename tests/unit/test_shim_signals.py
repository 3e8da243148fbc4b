"""The job shim (executors/_shim.py) and stop signals that come while it starts the command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
    assert json.loads((tmp_path / "exit.json").read_text()) == {"exit_code": 143, "signal": signal.SIGTERM}
