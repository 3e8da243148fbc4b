"""The pure models: checkpoint intervals, attempt timelines, all-reduce slowdown."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucluster.sim.runtime import (
    checkpoint_interval,
    daly_interval,
    progress,
    timeline,
    young_interval,
)


def test_young_and_daly() -> None:
    assert young_interval(60, 86400) == pytest.approx(math.sqrt(2 * 60 * 86400))
    # Daly's refinement is a little longer than Young minus the cost, and M when C >= 2M.
    d = daly_interval(60, 86400)
    r = 60 / (2 * 86400)
    assert d == pytest.approx(math.sqrt(2 * 60 * 86400) * (1 + math.sqrt(r) / 3 + r / 9) - 60)
    assert daly_interval(300, 100) == 100


def test_interval_from_the_failure_rate_shrinks_with_job_size() -> None:
    one = checkpoint_interval("young", 1, 4.7e-4, 60)
    many = checkpoint_interval("young", 16384, 4.7e-4, 60)
    assert one is not None and many is not None
    assert one / many == pytest.approx(math.sqrt(16384))
    # Llama-3 scale: 16,384 GPUs fail every ~3.1 h; Young's optimum for a 1-minute checkpoint.
    mtbf = 86400 / (4.7e-4 * 16384)
    assert mtbf / 3600 == pytest.approx(3.1, abs=0.1)
    assert many == pytest.approx(math.sqrt(2 * 60 * mtbf))
    assert checkpoint_interval(None, 8, 4.7e-4, 60) is None
    assert checkpoint_interval(600.0, 8, 4.7e-4, 60) == 600.0
    assert checkpoint_interval("daly", 8, 0.0, 60) is None  # nothing fails: never checkpoint


def test_timeline_has_no_checkpoint_at_the_very_end() -> None:
    assert timeline(100, 10, 1, 0) == (109, 9)
    assert timeline(100, None, 1, 5) == (105, 0)
    assert timeline(95, 10, 1, 2) == (2 + 95 + 9, 9)
    assert timeline(10, 10, 1, 0) == (10, 0)


def test_progress_at_an_interruption() -> None:
    plan = timeline(100, 10, 1, 2)  # startup 2, then [10 + 1] x 9, then 10
    p = progress(2 + 11 * 4 + 6, plan, 10, 1, 2)  # 4 checkpoints done, 6 s into the next segment
    assert (p.startup_s, p.computed_s, p.saved_s, p.checkpoint_s, p.partial_write_s) == (2, 46, 40, 4, 0)
    p = progress(2 + 11 * 4 + 10.5, plan, 10, 1, 2)  # writing the 5th checkpoint
    assert (p.computed_s, p.saved_s, p.partial_write_s) == (50, 40, 0.5)
    p = progress(1, plan, 10, 1, 2)  # still restarting
    assert (p.startup_s, p.computed_s) == (1, 0)


@given(
    work=st.floats(1, 1e6),
    interval=st.one_of(st.none(), st.floats(1, 1e5)),
    cost=st.floats(0, 600),
    startup=st.floats(0, 600),
    frac=st.floats(0, 1),
)
def test_progress_parts_add_up_to_the_elapsed_time(
    work: float, interval: float | None, cost: float, startup: float, frac: float
) -> None:
    plan = timeline(work, interval, cost, startup)
    elapsed = frac * plan.total_s
    p = progress(elapsed, plan, interval, cost, startup)
    parts = p.startup_s + p.computed_s + p.checkpoint_s + p.partial_write_s
    assert parts == pytest.approx(elapsed, rel=1e-9, abs=1e-6)
    assert 0 <= p.saved_s <= p.computed_s <= work * (1 + 1e-9) + 1e-6
    end = progress(plan.total_s, plan, interval, cost, startup)
    assert end.computed_s == pytest.approx(work, rel=1e-9)
