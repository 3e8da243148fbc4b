"""The 80% start interval (core/start_interval.py): calibrated on how far recent estimates were
from the real starts (ratios of real to estimated waits)."""

from __future__ import annotations

import pytest

from gpucluster.core.start_interval import Interval, WaitCalibration


def test_no_interval_until_enough_history() -> None:
    c = WaitCalibration(min_samples=3)
    c.observe(0.0, 100.0, 100.0)
    c.observe(0.0, 100.0, 100.0)
    assert c.interval(0.0, 1000.0) is None
    c.observe(0.0, 100.0, 100.0)
    assert c.interval(0.0, 1000.0) == Interval(1000.0, 1000.0)  # every estimate was exact


def test_the_interval_scales_past_ratios_of_real_to_estimated_waits() -> None:
    c = WaitCalibration(min_samples=10)
    for ratio in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 2.0, 3.0):
        c.observe(1000.0, 1000.0 + 3600.0, 1000.0 + 3600.0 * ratio)  # estimated a 1 h wait
    got = c.interval(0.0, 7200.0)  # a 2 h wait estimated now
    assert got is not None
    assert got.low == pytest.approx(7200 * 0.6)
    assert got.high == pytest.approx(7200 * 2.0)
    # about 80% of the past ratios fall inside [q10, q90]
    inside = [r for r in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 2.0, 3.0) if 0.6 <= r <= 2.0]
    assert len(inside) == 9


def test_the_interval_always_holds_the_estimate_and_tiny_waits_count_as_a_minute() -> None:
    c = WaitCalibration(min_samples=2)
    c.observe(0.0, 1.0, 120.0)  # a 1 s wait estimated, 120 s real: ratio 2 over the minute
    c.observe(0.0, 1.0, 120.0)
    got = c.interval(0.0, 0.0)
    assert got is not None and got.low == 0.0 and got.high == pytest.approx(120.0)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="min_samples"):
        WaitCalibration(min_samples=1)
