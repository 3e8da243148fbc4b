"""Planning figures that cannot flatter: waits after preemption, goodput of reserved time.

Real runs of the simulator (its engine, the scheduler core, metrics) on tiny specs, with the
expected figures worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.sim.metrics import comparison, run_metrics
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import cluster_yaml, native_csv, run

CKPT = "failures: {gpu_failures_per_day: 0}\ncheckpoints: {interval: 10m, cost: 10s, restart: 60s}\n"


def test_a_preempted_job_waits_after_its_first_start_and_goodput_counts_it(tmp_path: Path) -> None:
    # L (low, 2 GPUs, 2 h of work) starts at 0; H (high, 2 GPUs, 1 h) arrives at 30 min and
    # preempts it (L writes a 10 s checkpoint), runs 1810-5460; L restarts at 5460 (60 s load)
    # and ends at 11030. L's queueing delay is 0, but it spent 5460 - 1810 = 3650 s not running.
    c = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=2, extra=CKPT)
    t = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": "2h", "gpus": 2, "priority": "low"},
            {"submit_time": "30m", "duration": "1h", "gpus": 2, "priority": "high"},
        ],
    )
    r = run(c, t, "default")
    assert r.start == {1: 0.0, 2: 1810.0} and r.end == {1: 11030.0, 2: 5460.0}
    m = run_metrics(r.result, load_cluster_spec(c))
    assert m["queueing_delay_s"]["max"] == 10.0  # H waited for L's checkpoint; L never waited to start
    assert m["time_not_running_s"]["max"] == 3650.0  # L, queued again after the preemption
    assert m["preemptions"] == 1
    # useful = 3 h x 2 GPUs; reserved = 2 x 11030 s (L) + 2 x 3650 s (H): time L held nothing is lost
    g = m["goodput"]
    assert g["useful_gpu_hours"] == 6.0
    assert g["reserved_gpu_hours"] == pytest.approx(2 * (11030 + 3650) / 3600, abs=1e-3)
    assert g["of_reserved"] == pytest.approx(6 * 3600 / (2 * (11030 + 3650)), abs=1e-4)
    assert g["of_allocated"] > 0.97 > g["of_reserved"] + 0.2  # the held-time figure flatters
    row = comparison([m])[0]
    assert row["preemptions"] == 1 and row["goodput"] == g["of_reserved"]
    assert row["time_not_running_p99_s"] == 3650.0
    assert m["waits_by_size"]["2-8"]["time_not_running_s"]["max"] == 3650.0
    assert m["started_within_1h"] == 1.0
