"""`gpucluster simulate` end to end: files written, byte-identical metrics for a seed, and one
clear message with exit code 1 for each kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucluster.cli.main import app
from gpucluster.sim.synthetic import generate
from tests.sim.helpers import cluster_yaml

runner = CliRunner()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("sim")
    # 4 nodes x 8 GPUs; a GPU failure every ~6 GPU-hours so failures and restarts happen.
    cluster = cluster_yaml(
        d / "c.yaml",
        nodes=4,
        gpus=8,
        extra="failures: {gpu_failures_per_day: 4, node_repair_time: 1h}\n"
        "trace_fill: {priority: {high: 1, normal: 3, low: 1}}\n",
    )
    trace = generate(d / "t.csv", jobs=300, gpus=32, load=0.9, seed=1)
    return cluster, trace


def _simulate(cluster: Path, trace: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(
        app,
        ["simulate", "--cluster", str(cluster), "--trace", str(trace), "--out", str(out), "--quiet", *extra],
    )
    return result.exit_code, result.output


def test_writes_the_report_and_the_same_seed_gives_identical_metrics(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    cluster, trace = inputs
    policies = ["--policy", "fifo", "--policy", "priority", "--policy", "default"]
    code, output = _simulate(cluster, trace, tmp_path / "a", *policies, "--seed", "5", "--workers", "1")
    assert code == 0, output
    assert "300 jobs read" in output and "default" in output
    for name in ("metrics.json", "performance.json", "report.html", "utilisation.png", "jct_cdf.png", "queue.png"):
        assert (tmp_path / "a" / name).stat().st_size > 0, name
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert list(m["policies"]) == ["fifo", "priority", "default"]
    assert m["inputs"]["trace"]["jobs_read"] == 300
    fifo = m["policies"]["fifo"]
    assert fifo["jobs"]["simulated"] + fifo["jobs"]["skipped"] == 300
    assert fifo["failures"]["node_failures"] > 0
    assert m["comparison"][0]["jct_mean_vs_baseline"] == 1.0
    html = (tmp_path / "a" / "report.html").read_text()
    assert "Policies side by side" in html and "<img src='jct_cdf.png'" in html

    # the same seed, in parallel this time: byte-identical metrics
    code, output = _simulate(cluster, trace, tmp_path / "b", *policies, "--seed", "5", "--workers", "2")
    assert code == 0, output
    assert (tmp_path / "a" / "metrics.json").read_bytes() == (tmp_path / "b" / "metrics.json").read_bytes()

    # another seed draws other priorities and failures
    code, output = _simulate(cluster, trace, tmp_path / "c", *policies, "--seed", "6", "--workers", "2")
    assert code == 0, output
    assert (tmp_path / "a" / "metrics.json").read_bytes() != (tmp_path / "c" / "metrics.json").read_bytes()


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ("bad_cluster", "c.yaml:2: node_groups[0].count: must be a whole number"),
        ("bad_row_strict", "t.csv:3: duration must be between"),
        ("bad_policy", "--policy nope: no such file, and not a shipped baseline"),
        ("bad_format", "--format 'csv': allowed: philly, pollux, tiresias, alibaba2023, native"),
        ("missing_trace", "cannot read trace"),
    ],
)
def test_user_errors_print_one_message_and_exit_1(tmp_path: Path, setup: str, says: str) -> None:
    cluster = cluster_yaml(tmp_path / "c.yaml")
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,gpus\n0,10,1\n1,-1,1\n")
    extra: list[str] = []
    if setup == "bad_cluster":
        cluster.write_text("node_groups:\n  - {count: lots, gpus_per_node: 8, gpu_model: X}\n")
    elif setup == "bad_row_strict":
        extra = ["--strict"]
    elif setup == "bad_policy":
        extra = ["--policy", "nope"]
    elif setup == "bad_format":
        extra = ["--format", "csv"]
    elif setup == "missing_trace":
        trace = tmp_path / "absent.csv"
        extra = ["--format", "native"]
    code, output = _simulate(cluster, trace, tmp_path / "out", *extra)
    assert code == 1, output
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert says in lines[0], output


def test_policy_file_is_read_by_the_heads_loader(tmp_path: Path) -> None:
    cluster = cluster_yaml(tmp_path / "c.yaml")
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,gpus,team\n0,10,1,vision\n1,10,2,nlp\n")
    good = tmp_path / "fair.yaml"
    good.write_text("teams:\n  vision: {weight: 3}\n  nlp: {weight: 1}\n")
    code, output = _simulate(cluster, trace, tmp_path / "out", "--policy", str(good))
    assert code == 0, output
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["policies"]["fair"]["per_team"]["vision"]["entitlement"] == 0.75
    bad = tmp_path / "bad.yaml"
    bad.write_text("teams:\n  vision: {weight: -3}\n")
    code, output = _simulate(cluster, trace, tmp_path / "out2", "--policy", str(bad))
    assert code == 1 and "bad.yaml:2" in output, output


def test_metrics_do_not_depend_on_the_interpreters_hash_seed(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    """Separate processes with different string-hash seeds: still byte-identical metrics."""
    import os
    import subprocess
    import sys

    cluster, trace = inputs
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"h{hash_seed}"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gpucluster.cli.main",
                "simulate",
                "--cluster",
                str(cluster),
                "--trace",
                str(trace),
                "--out",
                str(out),
                "--policy",
                "default",
                "--seed",
                "3",
                "--quiet",
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            timeout=120,
        )
        outs.append((out / "metrics.json").read_bytes())
    assert outs[0] == outs[1]


def test_heterogeneous_shipped_pai_cluster(tmp_path: Path) -> None:
    """The shipped PAI spec: jobs drawn onto GPU models in proportion to capacity run at each
    model's speed (T4 0.6x, V100 1.7x of a P100)."""
    spec_text = (Path(__file__).resolve().parents[2] / "examples" / "clusters" / "pai.yaml").read_text()
    cluster = tmp_path / "pai.yaml"
    cluster.write_text(
        spec_text.replace("gpu_type: any ", "gpu_type: proportional ")
        .replace("4.7e-4", "0")
        .replace("interval: daly", "interval: none")
    )
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,gpus\n" + "".join(f"{i},600,1\n" for i in range(20)))
    code, output = _simulate(cluster, trace, tmp_path / "out", "--policy", "fifo", "--seed", "2")
    assert code == 0, output
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    fifo = m["policies"]["fifo"]
    assert fifo["jobs"]["succeeded"] == 20 and fifo["queueing_delay_s"]["max"] == 0
    run_times = {round(r) for r in _run_times(tmp_path / "out")}
    assert run_times <= {round(600 / s) for s in (1.0, 0.6, 0.8, 1.7)}
    assert len(run_times) >= 3  # several models were used


def _run_times(out: Path) -> list[float]:
    import csv

    with (out / "jobs.csv").open() as f:
        return [float(r["end_s"]) - float(r["first_start_s"]) for r in csv.DictReader(f)]
