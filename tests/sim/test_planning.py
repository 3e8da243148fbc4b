"""Planning figures that cannot flatter: waits after preemption, goodput of reserved time.

Real runs of the simulator (its engine, the scheduler core, metrics) on tiny specs, with the
expected figures worked out by hand."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpucluster.sim.errors import SimInputError
from gpucluster.sim.metrics import comparison, run_metrics
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import cluster_yaml, low_then_high_trace, native_csv, run

CKPT = "failures: {gpu_failures_per_day: 0}\ncheckpoints: {interval: 10m, cost: 10s, restart: 60s}\n"


def test_a_preempted_job_waits_after_its_first_start_and_goodput_counts_it(tmp_path: Path) -> None:
    # L (low, 2 GPUs, 2 h of work) starts at 0; H (high, 2 GPUs, 1 h) arrives at 30 min and
    # preempts it (L writes a 10 s checkpoint), runs 1810-5460; L restarts at 5460 (60 s load)
    # and ends at 11030. L's queueing delay is 0, but it spent 5460 - 1810 = 3650 s not running.
    c = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=2, extra=CKPT)
    t = low_then_high_trace(tmp_path / "t.csv")
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


def _one_big_job(tmp_path: Path, spares: str, seed: int = 3, extra: str = "") -> dict[str, Any]:
    """A 5-day 6-GPU job on 3 x 2 GPUs (every node), a failure a day on average, 12 h repairs."""
    c = tmp_path / "c.yaml"
    c.write_text(
        "node_groups:\n  - {name: n, count: 3, gpus_per_node: 2, gpu_model: H100-80GB, price_per_gpu_hour: 2, "
        f"spares: {spares}}}\n"
        "failures: {gpu_failures_per_day: 0.1667, node_repair_time: 12h}\n"
        "checkpoints: {interval: 1h, cost: 60s, restart: 5m}\n" + extra
    )
    t = native_csv(tmp_path / "t.csv", [{"submit_time": 0, "duration": "5d", "gpus": 6, "max_restarts": 1000}])
    r = run(c, t, "fifo", seed=seed)
    return run_metrics(r.result, load_cluster_spec(c)) | {"end": r.end[1]}


def test_a_hot_spare_makes_a_failure_cost_less_than_a_cold_one_and_both_less_than_none(tmp_path: Path) -> None:
    none = _one_big_job(tmp_path, "{}")
    hot = _one_big_job(tmp_path, "{hot: 2}")
    cold = _one_big_job(tmp_path, "{cold: 2, cold_delay: 2h}")
    # without spares the job holds nothing for every 12 h repair: goodput of reserved time
    # collapses while the held-time figure still looks healthy
    assert none["spares"]["failures_without_spare"] == none["failures"]["node_failures"] > 0
    assert none["goodput"]["of_reserved"] < 0.65 < 0.9 < none["goodput"]["of_allocated"]
    assert none["spares"]["node_hours_missing"] == 12.0 * none["failures"]["node_failures"]
    # a hot spare takes the node's place at once: nothing missing, reserved == allocated
    assert hot["spares"]["replaced_by_hot"] == hot["failures"]["node_failures"] > 0
    assert hot["spares"]["node_hours_missing"] == 0.0
    assert hot["goodput"]["of_reserved"] == hot["goodput"]["of_allocated"]
    # a cold spare after 2 h: between the two
    assert cold["spares"]["replaced_by_cold"] == cold["failures"]["node_failures"] > 0
    assert cold["spares"]["node_hours_missing"] == 2.0 * cold["failures"]["node_failures"]
    assert none["goodput"]["of_reserved"] < cold["goodput"]["of_reserved"] < hot["goodput"]["of_reserved"]
    assert hot["end"] < cold["end"] < none["end"]
    # spares are bought: their GPU-hours are in the cost (2 nodes x 2 GPUs x $2 over the makespan)
    assert hot["cost"]["spares"] == pytest.approx(4 * 2.0 * hot["makespan_s"] / 3600, abs=0.01)
    assert hot["energy_kwh"]["spares"] > 0 == cold["energy_kwh"]["spares"]


def test_restart_backoff_and_repair_distribution_are_the_specs(tmp_path: Path) -> None:
    base = _one_big_job(tmp_path, "{hot: 2}")
    assert base == _one_big_job(tmp_path, "{hot: 2}")  # same seed, same spec: the same run
    # a long restart backoff (2 h, not the head's 1 s doubling) delays every restart
    c = tmp_path / "c.yaml"
    c.write_text(
        c.read_text().replace("node_repair_time: 12h}", "node_repair_time: 12h, restart_backoff: {first: 2h}}")
    )
    spec = load_cluster_spec(c)
    assert spec.failures.backoff_first_s == 7200.0 and spec.failures.backoff_max_s == 7200.0
    slow = run(c, tmp_path / "t.csv", "fifo", seed=3)
    assert slow.result.restarts >= 2 and slow.end[1] > base["end"] + 7200.0 * (base["failures"]["restarts"] - 1)
    # a repair-time distribution (no spares, so the repairs matter) changes the run; fixed 12 h
    # repairs leave exactly 12 h per failure missing, drawn ones do not
    none = _one_big_job(tmp_path, "{}")
    assert none["spares"]["node_hours_missing"] == 12.0 * none["failures"]["node_failures"]
    c.write_text(
        c.read_text()
        .replace(", restart_backoff: {first: 2h}", "")
        .replace("node_repair_time: 12h", "node_repair_time: {distribution: exponential, mean: 12h}")
    )
    assert load_cluster_spec(c).failures.repair.distribution == "exponential"
    m = run_metrics(run(c, tmp_path / "t.csv", "fifo", seed=3).result, load_cluster_spec(c))
    assert m["failures"]["node_failures"] > 0
    assert m["spares"]["node_hours_missing"] != 12.0 * m["failures"]["node_failures"]


def test_checkpoint_cost_from_size_and_bandwidth(tmp_path: Path) -> None:
    c = cluster_yaml(
        tmp_path / "c.yaml",
        extra="checkpoints: {interval: 1h, state_size_gb: 6000, write_gb_per_s: 100, read_gb_per_s: 200, "
        "relaunch: 2m}\n",
    )
    cp = load_cluster_spec(c).checkpoints
    assert (cp.cost_s, cp.restart_s, cp.state_size_gb) == (60.0, 150.0, 6000.0)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            "checkpoints: {cost: 1m, state_size_gb: 10, write_gb_per_s: 1, read_gb_per_s: 1}\n",
            "checkpoints.cost: give either cost and restart as times, or state_size_gb",
        ),
        ("checkpoints: {state_size_gb: 10, write_gb_per_s: 1}\n", "checkpoints.read_gb_per_s: is required"),
        ("failures: {node_repair_time: {distribution: weibull}}\n", "unknown distribution 'weibull'; use one of"),
        ("failures: {node_repair_time: {distribution: lognormal, median: 2h}}\n", "sigma: is required for a lognormal"),
        ("failures: {restart_backoff: {first: 10m, max: 1m}}\n", "restart_backoff.max: must be at least first"),
        ("failures: {max_restarts: lots}\n", "failures.max_restarts: must be a whole number or unlimited"),
    ],
)
def test_planning_knobs_refuse_bad_values_by_name(tmp_path: Path, extra: str, says: str) -> None:
    c = cluster_yaml(tmp_path / "c.yaml", extra=extra)
    with pytest.raises(SimInputError, match=re.escape(says)):
        load_cluster_spec(c)


def test_spares_refuse_bad_values_and_unlimited_restarts_reads(tmp_path: Path) -> None:
    c = cluster_yaml(
        tmp_path / "c.yaml",
        groups="node_groups:\n  - {name: n, count: 1, gpus_per_node: 2, gpu_model: A, spares: {hot: -1}}\n",
    )
    with pytest.raises(SimInputError, match=r"c.yaml:2: node_groups\[0\].spares.hot: must be between 0"):
        load_cluster_spec(c)
    c = cluster_yaml(tmp_path / "c.yaml", extra="failures: {max_restarts: unlimited}\n")
    assert load_cluster_spec(c).failures.max_restarts >= 10**9


def _rss_mib() -> float:
    """This process's resident memory now (VmRSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_the_report_answers_first_with_cost_per_useful_gpu_hour_in_the_specs_currency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpucluster.sim.report as report
    from gpucluster.sim.run import SimulateOptions, simulate

    # The peak memory reported must include plotting: the RSS seen while the plots are drawn
    # (made to hold 64 MiB more, touched) is a floor for it.
    during_plots: list[float] = []
    plot = report.write_plots

    def heavy_plots(*args: Any) -> list[Path]:
        files = plot(*args)
        held = bytearray(b"\x01") * (64 * 1024 * 1024)
        during_plots.append(_rss_mib())
        del held
        return files

    monkeypatch.setattr(report, "write_plots", heavy_plots)

    c = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=2, extra=CKPT + "currency: EUR\n")
    t = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": "2h", "gpus": 2, "priority": "low", "team": "a"},
            {"submit_time": "30m", "duration": "1h", "gpus": 2, "priority": "high", "team": "b"},
        ],
    )
    out = simulate(SimulateOptions(cluster=c, trace=t, out=tmp_path / "o", policies=("fifo", "default")), workers=1)
    m = out.metrics
    for name in ("fifo", "default"):
        cost = m["policies"][name]["cost"]
        useful = m["policies"][name]["gpu_hours"]["useful"]
        assert cost["currency"] == "EUR"
        assert cost["per_useful_gpu_hour"] == pytest.approx(cost["total"] / useful, rel=1e-3)
    # default preempts the low job: the same useful work, more GPU-time reserved for it
    assert m["winners"]["goodput"] == "fifo"
    rows = {r["policy"]: r for r in m["comparison"]}
    assert rows["default"]["preemptions"] == 1 and rows["fifo"]["preemptions"] == 0
    assert rows["default"]["energy_kwh"] > 0 and rows["fifo"]["currency"] == "EUR"
    html = (tmp_path / "o" / "report.html").read_text()
    assert html.index("<b>Answer: ") < html.index("<th>policy</th>")
    assert "fifo: highest goodput" in html and " EUR" in html
    assert (tmp_path / "o" / "shares.png").stat().st_size > 0
    perf = json.loads((tmp_path / "o" / "performance.json").read_text())
    assert during_plots and during_plots[0] >= 64
    # (less 1 MiB: the kernel's high-water mark lags per-thread RSS counters by up to 64 pages each,
    # and the figure is rounded to 0.1 MiB)
    assert perf["peak_rss_mib"] >= during_plots[0] - 1.0
    assert f"peak memory {perf['peak_rss_mib']:,.0f} MiB" in html
    # waits by job size, per policy: both jobs ask 2 GPUs; under default L (low) was preempted and
    # spent 3650 s not running (test above), H waited 10 s for L's checkpoint
    section = html[html.index("<h2>Policy default</h2>") :]
    section = section[: section.index("<h2>", 5)]
    assert "Waits by job size" in section
    head = "<th>GPUs</th><th>jobs started</th><th>wait mean</th><th>wait p50</th><th>wait p99</th>"
    assert head in section
    assert "<tr><td>2-8</td><td>2</td><td>0.00 h</td><td>0.00 h</td><td>0.00 h</td><td>2</td>" in section
    assert "<td>0.51 h</td><td>0.00 h</td><td>1.01 h</td></tr>" in section  # not running: mean, p50, p99
    fifo = html[html.index("<h2>Policy fifo</h2>") : html.index("<h2>Policy default</h2>")]
    assert "<tr><td>2-8</td><td>2</td><td>0.77 h</td><td>0.00 h</td><td>1.53 h</td>" in fifo  # H waited 5510 s


def test_jobs_csv_has_each_jobs_time_not_running_preemptions_and_restarts(tmp_path: Path) -> None:
    from gpucluster.sim.report import write_jobs

    c = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=2, extra=CKPT)
    t = low_then_high_trace(tmp_path / "t.csv")
    results = [run(c, t, "fifo").result, run(c, t, "default").result]
    with write_jobs(tmp_path / "jobs.csv", results).open() as f:
        rows = {(r["policy"], r["job_id"]): r for r in csv.DictReader(f)}
    got = {k: (r["gpus"], r["time_not_running_s"], r["preemptions"], r["restarts"]) for k, r in rows.items()}
    assert got == {
        ("fifo", "1"): ("2", "0.000", "0", "0"),
        ("fifo", "2"): ("2", "5510.000", "0", "0"),  # H waited for L: 2 h + 11 checkpoints of 10 s
        ("default", "1"): ("2", "3650.000", "1", "0"),  # L preempted once, queued again 3650 s
        ("default", "2"): ("2", "10.000", "0", "0"),
    }
    assert rows[("default", "1")]["outcome"] == "succeeded"
    # restarts after failures: one big job on every node, a failure a day
    big = tmp_path / "big"
    big.mkdir()
    c = big / "c.yaml"
    c.write_text(
        "node_groups:\n  - {name: n, count: 3, gpus_per_node: 2, gpu_model: H100-80GB}\n"
        "failures: {gpu_failures_per_day: 0.1667, node_repair_time: 12h}\n"
        "checkpoints: {interval: 1h, cost: 60s, restart: 5m}\n"
    )
    t = native_csv(big / "t.csv", [{"submit_time": 0, "duration": "5d", "gpus": 6, "max_restarts": 1000}])
    res = run(c, t, "fifo", seed=3).result
    with write_jobs(big / "jobs.csv", [res]).open() as f:
        (row,) = list(csv.DictReader(f))
    assert int(row["restarts"]) == res.restarts > 0 and row["preemptions"] == "0"
    assert float(row["time_not_running_s"]) == pytest.approx(res.end[0] - res.submit[0] - res.ran[0], abs=1e-3)
    assert float(row["time_not_running_s"]) > 0  # it held nothing while its nodes were repaired
