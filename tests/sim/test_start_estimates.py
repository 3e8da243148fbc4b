"""The simulator measures the start estimates a live head would show (issue 24): at each submit
the head's own replay, with time limits only and with run times learned from the jobs finished
so far; metrics.json and the report carry both errors side by side."""

from __future__ import annotations

import json
from pathlib import Path

from gpucluster.sim.fill import LIMIT_STEPS
from gpucluster.sim.readers import read_trace
from gpucluster.sim.run import SimulateOptions, simulate
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import NO_FAILURES, cluster_yaml, native_csv

HOUR = 3600.0


def _inputs(tmp: Path) -> tuple[Path, Path]:
    cluster = cluster_yaml(tmp / "c.yaml", nodes=1, gpus=2, extra=f"failures: {NO_FAILURES['failures']}\n")
    # One user's 2-GPU `train` job, 10 minutes each, with an 8 h limit, submitted in bursts of
    # four: each burst queues behind itself; later bursts have history to learn from.
    rows = [
        {"submit_time": burst * 4 * HOUR + k, "duration": "10m", "gpus": 2, "name": "train", "time_limit": "8h"}
        | {"user": "alice", "team": "vision"}
        for burst in range(6)
        for k in range(4)
    ]
    return cluster, native_csv(tmp / "t.csv", rows)


def test_metrics_json_and_the_report_carry_both_errors(tmp_path: Path) -> None:
    cluster, trace = _inputs(tmp_path)
    out = tmp_path / "out"
    opts = SimulateOptions(cluster=cluster, trace=trace, out=out, policies=("fifo",), estimates=True)
    simulate(opts, workers=1)
    m = json.loads((out / "metrics.json").read_text())["policies"]["fifo"]["start_estimates"]
    assert m["started_at_once"] == 6  # the first of each burst: never shown an estimate
    assert m["jobs_estimated"] == 18 and m["not_estimated"] == 0
    assert m["with_learned_run_time"] == 15  # from the second burst on (3 runs needed)
    base, pred = m["time_limit_only"], m["predicted"]
    # Time limits only: the job ahead is expected to run 8 h, not 10 m: hours late.
    assert base["median_abs_error_h"] > 7
    assert base["median_error_h"] > 7  # late, not early
    assert pred["median_abs_error_h"] < 0.01  # learned: 10 minutes, as they run
    assert m["median_abs_error_ratio"] < 0.01
    assert m["interval_coverage"] is None  # 18 starts: fewer than the calibration needs (20)
    assert "Start estimates (what a live head would have shown at each submit)" in (out / "report.html").read_text()


def test_without_the_flag_nothing_is_measured(tmp_path: Path) -> None:
    cluster, trace = _inputs(tmp_path)
    opts = SimulateOptions(cluster=cluster, trace=trace, out=None, policies=("fifo",))
    assert "start_estimates" not in simulate(opts, write=False, workers=1).metrics["policies"]["fifo"]


def test_a_seeded_limit_range_pads_and_rounds_limits(tmp_path: Path) -> None:
    cluster = cluster_yaml(
        tmp_path / "c.yaml", nodes=1, gpus=2, extra="trace_fill:\n  time_limit: 2x..8x\n" + "failures: {}\n"
    )
    rows = [{"submit_time": i, "duration": 100 * (i + 1), "gpus": 1} for i in range(200)]
    trace = native_csv(tmp_path / "t.csv", rows)
    spec = load_cluster_spec(cluster)
    jobs = read_trace(trace, spec, seed=3).jobs
    assert all(j.time_limit in LIMIT_STEPS and j.time_limit >= 2 * j.duration for j in jobs)
    ratios = {round(j.time_limit / j.duration, 1) for j in jobs if j.time_limit}
    assert len(ratios) > 20  # not one factor: limits are not proportional to run times
    assert [j.time_limit for j in read_trace(trace, spec, seed=3).jobs] == [j.time_limit for j in jobs]
    bad = cluster_yaml(tmp_path / "bad.yaml", extra="trace_fill:\n  time_limit: 8x..2x\n")
    try:
        load_cluster_spec(bad)
    except ValueError as e:
        assert "time_limit" in str(e) and "2x..8x" in str(e)
    else:
        raise AssertionError("8x..2x was accepted")
