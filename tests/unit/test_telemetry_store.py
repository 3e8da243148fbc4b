"""Telemetry in the store: downsampling keeps integrals exact, holders stay apart, retention."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.store import Store
from gpucluster.store.telemetry import HOUR, MINUTE, RAW, GpuSample, TelemetryStore

DAY = 86400.0


STORE_BACKENDS = ("sqlite", "postgresql")  # tests/unit/conftest.py


@pytest.fixture
def ts(store_target: Path | str) -> Iterator[TelemetryStore]:
    store = Store(store_target)
    yield TelemetryStore(store)
    store.close()


def raw(at: float, power: float, util: float, jobs: tuple[int, ...] = (), gpu: int = 0) -> GpuSample:
    return GpuSample("n1", gpu, at, 5.0, jobs, utilization=util, power_w=power, temperature_c=40 + util / 10)


def energy(samples: list[GpuSample]) -> float:
    return sum(s.energy_j for s in samples)


def test_downsampling_keeps_energy_and_mean_utilisation_and_holders_apart(ts: TelemetryStore) -> None:
    t0 = 10 * DAY  # a whole hour
    # Two hours of 5 s samples; job 7 held the GPU for the first 30 minutes, then nobody.
    rows = [raw(t0 + k * 5, 100 + k % 7, float(k % 3 * 50), (7,) if k < 360 else ()) for k in range(1440)]
    ts.add_samples(rows)
    exact = energy(rows)
    job_energy = energy([r for r in rows if r.jobs])
    ts.downsample(now=t0 + 2 * 3600 + 3600 + 1)  # raw kept 1 h: everything is older
    merged = ts.samples()
    assert {s.level for s in merged} == {MINUTE}
    assert len(merged) == 120  # one row per minute (each minute has one holder)
    assert energy(merged) == pytest.approx(exact)
    assert energy(ts.samples(job_id=7)) == pytest.approx(job_energy)
    assert {s.jobs for s in ts.samples(job_id=7)} == {(7,)}
    mean = sum(r.utilization or 0 for r in rows) / len(rows)
    assert sum((s.utilization or 0) * s.seconds for s in merged) / sum(s.seconds for s in merged) == pytest.approx(mean)
    ts.downsample(now=t0 + 2 * 3600 + DAY + 1)  # minute rows kept a day: into hour means
    hours = ts.samples()
    assert [s.level for s in hours] == [HOUR, HOUR, HOUR]  # hour 1 split by holder, hour 2
    assert energy(hours) == pytest.approx(exact)
    assert energy(ts.samples(job_id=7)) == pytest.approx(job_energy)
    ts.downsample(now=t0 + 31 * DAY)  # past retention (30 days)
    assert ts.samples() == []


def test_only_whole_buckets_are_merged_and_recent_rows_stay_raw(ts: TelemetryStore) -> None:
    t0 = 10 * DAY
    ts.add_samples([raw(t0 + k * 5, 200, 10) for k in range(36)])  # 3 minutes
    ts.downsample(now=t0 + 3600 + 90)  # cutoff at t0 + 60: the first minute only
    counts = ts.count_samples()
    assert counts == {MINUTE: 1, RAW: 24}
    assert energy(ts.samples()) == pytest.approx(36 * 5 * 200)
    # [95, 100) ends where the window starts: out; [105, 110) is in
    assert [s.at for s in ts.samples(since=t0 + 100, until=t0 + 110)] == [t0 + 100, t0 + 105]


def test_a_drain_with_a_planned_end_is_kept_and_ends_by_itself(ts: TelemetryStore) -> None:
    assert ts.set_drained("n1", True, "firmware", "user", 100.0, until=500.0)
    assert ts.drains()["n1"].until == 500.0 and ts.node_states()["n1"].until == 500.0
    assert ts.set_drained("n1", True, "firmware", "user", 200.0, until=900.0)  # a new end is a change
    assert ts.node_states()["n1"].since == 100.0
    assert ts.end_drains_due(899.0) == [] and ts.drains().keys() == {"n1"}
    assert ts.end_drains_due(900.0) == ["n1"] and ts.drains() == {}
    assert ts.node_states()["n1"].until is None
