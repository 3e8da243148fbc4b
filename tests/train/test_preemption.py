"""Preemption: SIGTERM becomes a flag, a callback and a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")  # gpucluster.train needs it

from gpucluster.launch.ranks import REQUEUE_EXIT_CODE
from gpucluster.train import grace_period_s
from gpucluster.train.preemption import Preemption


def test_sigterm_sets_the_flag_and_runs_callbacks() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[int] = []
    p = Preemption(grace_period_s=30).install()
    try:
        p.on_preempt(seen.append)
        assert not p.requested and not p.should_stop()
        assert p.remaining_s() == 30
        os.kill(os.getpid(), signal.SIGTERM)
        assert p.requested and p.should_stop()
        assert seen == [signal.SIGTERM]
        assert 0 < p.remaining_s() <= 30
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal changes nothing
        assert seen == [signal.SIGTERM]
    finally:
        p.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_grace_period_comes_from_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLUSTER_GRACE_PERIOD_S", "12.5")
    assert grace_period_s() == 12.5
    assert Preemption().grace_period_s == 12.5
    monkeypatch.delenv("GPUCLUSTER_GRACE_PERIOD_S")
    assert grace_period_s() == 30.0


REQUEUE_SCRIPT = """
import atexit, sys, threading, time
from gpucluster.train import exit_for_requeue
done = []
def late():
    time.sleep(0.3)
    done.append("thread")
threading.Thread(target=late).start()
atexit.register(lambda: print("atexit after", done, flush=True))
sys.stdout.write("buffered, no newline")
def deep():
    exit_for_requeue()
    print("never")
deep()
"""


def test_exit_for_requeue_finishes_threads_and_atexit_then_exits_with_the_requeue_code() -> None:
    """What `sys.exit` gave a script, without the interpreter teardown where gloo threads raced."""
    r = subprocess.run([sys.executable, "-c", REQUEUE_SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == REQUEUE_EXIT_CODE, r.stderr
    assert r.stdout == "buffered, no newlineatexit after ['thread']\n", r.stdout
    assert r.stderr == ""
