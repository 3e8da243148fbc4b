"""Preemption: SIGTERM becomes a flag, a callback and a deadline."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("torch")  # gpucluster.train needs it

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
