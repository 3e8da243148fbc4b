"""`--sweep` and `--seeds`: a grid of real simulator runs, summarised with its spread and optimum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucluster.cli.main import app
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.run import SimulateOptions, simulate
from gpucluster.sim.sweep import parse_axis
from tests.sim.helpers import low_then_high_trace, native_csv

ONE_JOB = (
    "node_groups:\n  - {name: n, count: 3, gpus_per_node: 2, gpu_model: H100-80GB, price_per_gpu_hour: 2}\n"
    "failures: {gpu_failures_per_day: 0.1667, node_repair_time: 12h, max_restarts: unlimited}\n"
    "checkpoints: {interval: 1h, cost: 60s, restart: 5m}\n"
)


@pytest.fixture
def one_job(tmp_path: Path) -> tuple[Path, Path]:
    c = tmp_path / "c.yaml"
    c.write_text(ONE_JOB)
    return c, native_csv(tmp_path / "t.csv", [{"submit_time": 0, "duration": "5d", "gpus": 6}])


def test_a_grid_runs_every_point_policy_and_seed_and_marks_the_optimum(
    tmp_path: Path, one_job: tuple[Path, Path]
) -> None:
    cluster, trace = one_job
    opts = SimulateOptions(
        cluster=cluster,
        trace=trace,
        out=tmp_path / "out",
        policies=("fifo",),
        seed=0,
        sweeps=("checkpoints.interval=5m,1h,6h", "node_groups[0].spares.hot=0,2"),
        seeds=2,
    )
    m = simulate(opts, workers=1).metrics
    sw = m["sweep"]
    assert sw["runs"] == 3 * 2 * 2 and len(sw["rows"]) == 6 and sw["seeds"] == [0, 1]
    assert [a["values"] for a in sw["axes"]] == [["5m", "1h", "6h"], ["0", "2"]]
    assert all(len(row["per_seed"]) == 2 for row in sw["rows"])
    for row in sw["rows"]:  # the spread is over the seeds' own values
        seeds = [s["goodput"] for s in row["per_seed"]]
        assert row["goodput"]["min"] == min(seeds) and row["goodput"]["max"] == max(seeds)
    best = max(range(6), key=lambda k: row_goodput(sw, k))
    assert sw["optimum"]["row"] == best
    # two hot spares beat none at every interval: a failure no longer idles the job for its repair
    by = {(r["point"]["checkpoints.interval"], r["point"]["node_groups[0].spares.hot"]): r for r in sw["rows"]}
    for interval in ("5m", "1h", "6h"):
        assert by[(interval, "2")]["goodput"]["mean"] > by[(interval, "0")]["goodput"]["mean"]
    assert sw["rows"][best]["point"]["node_groups[0].spares.hot"] == "2"
    # one training job: what checkpoint/restart cost reaches 90% is answered
    assert "reach_goodput" in m and "90%" in m["reach_goodput"]["answer"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.index("<h2>Answer</h2>") < html.index("<h2>Workload</h2>")  # the answer first
    assert "Optimum:" in html and (tmp_path / "out" / "sweep.png").stat().st_size > 0
    again = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert again["sweep"] == json.loads(json.dumps(sw))


def row_goodput(sw: dict[str, object], k: int) -> float:
    rows = sw["rows"]
    assert isinstance(rows, list)
    return float(rows[k]["goodput"]["mean"])


def test_a_wait_target_picks_the_smallest_cluster_that_meets_it(tmp_path: Path) -> None:
    c = tmp_path / "c.yaml"
    c.write_text(
        "node_groups:\n  - {name: n, count: 1, gpus_per_node: 2, gpu_model: H100-80GB}\n"
        "failures: {gpu_failures_per_day: 0}\ncheckpoints: {interval: none}\n"
    )
    # 8 one-GPU jobs of 1 h at once: 1 node (2 GPUs) makes the last wait 3 h, 2 nodes 1 h, 4 none
    t = native_csv(tmp_path / "t.csv", [{"submit_time": 0, "duration": "1h", "gpus": 1} for _ in range(8)])
    opts = SimulateOptions(
        cluster=c,
        trace=t,
        out=None,
        policies=("fifo",),
        sweeps=("node_groups[0].count=1,2,4,8",),
        wait_target_s=3600.0,
    )
    sw = simulate(opts, write=False, workers=1).metrics["sweep"]
    p99 = {r["point"]["node_groups[0].count"]: r["time_not_running_p99_s"]["mean"] for r in sw["rows"]}
    assert p99 == {"1": 3 * 3600.0, "2": 3600.0, "4": 0.0, "8": 0.0}
    assert sw["rows"][sw["optimum"]["row"]]["gpus"] == 4  # 2 nodes: the p99 wait is 1 h, at most the target
    assert "fewest GPUs" in sw["optimum"]["why"]


@pytest.mark.parametrize(
    ("sweep", "says"),
    [
        ("checkpoints.interval", "write KEY=V1,V2,..."),
        ("checkpoints.interval=1h,", "every value must be non-empty"),
        ("checkpoints.interval=1h,1h", "a value is given twice"),
        ("policy.=true,false", "has an empty part; write e.g. policy.preemption.enabled"),
        ("policy.preemption..enabled=true", "has an empty part"),
        ("node groups.count=1", "cannot read the key"),
    ],
)
def test_a_malformed_sweep_says_what_to_write(sweep: str, says: str) -> None:
    with pytest.raises(SimInputError, match=says):
        parse_axis(sweep)


def test_a_bad_swept_key_or_value_is_refused_by_the_specs_own_rules(tmp_path: Path, one_job: tuple[Path, Path]) -> None:
    cluster, trace = one_job
    runner = CliRunner()
    for sweep, says in (
        ("checkpoints.intervl=1h,2h", "checkpoints.intervl: unknown key; allowed here: interval"),
        ("node_groups[0].count=2,two", "node_groups[0].count: must be a whole number; got 'two'"),
        ("node_groups[3].count=2", "--sweep node_groups[3].count: no such item"),
    ):
        result = runner.invoke(
            app,
            [
                "simulate",
                "--cluster",
                str(cluster),
                "--trace",
                str(trace),
                "--out",
                str(tmp_path / "o"),
                "--quiet",
                "--sweep",
                sweep,
            ],
        )
        assert result.exit_code == 1, result.output
        assert says in result.output, result.output


def test_the_cli_prints_the_sweep_and_its_optimum(tmp_path: Path, one_job: tuple[Path, Path]) -> None:
    cluster, trace = one_job
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--cluster",
            str(cluster),
            "--trace",
            str(trace),
            "--out",
            str(tmp_path / "o"),
            "--quiet",
            "--policy",
            "fifo",
            "--sweep",
            "checkpoints.interval=10m,2h",
            "--seeds",
            "2",
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "sweep: 4 runs, seeds 0..1" in result.output and "optimum (*): highest mean goodput" in result.output


def test_reach_goodput_solves_the_calibrated_model_for_the_target(tmp_path: Path, one_job: tuple[Path, Path]) -> None:
    import math

    from gpucluster.sim.spec import load_cluster_spec
    from gpucluster.sim.sweep import reach_goodput

    spec = load_cluster_spec(one_job[0])  # 6 GPUs at 0.1667 a GPU-day: MTBF ~1 day; C 60 s, R 300 s
    run = {
        "failures": {"restarts": 4},
        "goodput": {"of_reserved": 0.93, "reserved_gpu_hours": 6 * 100.0},
        "gpu_hours": {"allocated": 6 * 100.0 - 6 * 4 * 600 / 3600},  # 10 min holding nothing per failure
    }
    out = reach_goodput(spec, 6, [run], 0.95)
    assert out is not None and out["holding_nothing_per_failure_s"] == 600.0
    m, c, rr, d, s = out["job_mtbf_s"], 60.0, 300.0, 600.0, out["scale"]
    assert m == pytest.approx(86400 / (0.1667 * 6), abs=0.1)

    def loss(k: float) -> float:
        return math.sqrt(2 * k * c / m) + (k * rr + d) / m

    # calibrated: today's costs give the simulated 93%; the scale found gives 95%
    assert loss(1.0) + out["model_bias"] == pytest.approx(0.07, abs=1e-3)
    assert loss(s) + out["model_bias"] == pytest.approx(0.05, abs=1e-3)
    assert 0 < s < 1 and "as fast as now" in out["answer"]
    # a job that holds nothing for hours per failure cannot get there by checkpointing faster
    run["gpu_hours"]["allocated"] = 6 * 100.0 - 6 * 4 * 4 * 3600 / 3600  # 4 h each
    run["goodput"]["of_reserved"] = 0.8
    stuck = reach_goodput(spec, 6, [run], 0.95)
    assert stuck is not None and stuck["scale"] is None and "add spares or shorten repairs" in stuck["answer"]


def test_the_policy_itself_can_be_a_swept_key(tmp_path: Path, one_job: tuple[Path, Path]) -> None:
    cluster, trace = one_job
    opts = SimulateOptions(
        cluster=cluster,
        trace=trace,
        out=None,
        policies=("fifo",),
        sweeps=("policy=fifo,default", "checkpoints.interval=30m,2h"),
    )
    sw = simulate(opts, write=False, workers=1).metrics["sweep"]
    assert sw["runs"] == 4
    assert [(r["policy"], r["point"]["checkpoints.interval"]) for r in sw["rows"]] == [
        ("fifo", "30m"),
        ("fifo", "2h"),
        ("default", "30m"),
        ("default", "2h"),
    ]


PREEMPTING = "priorities: true\npreemption: {enabled: true, grace_period: 30s}\nfair_share: {enabled: false}\n"


@pytest.fixture
def low_then_high(tmp_path: Path) -> tuple[Path, Path, Path]:
    """L (low, 2 GPUs, 2 h) at 0, H (high, 2 GPUs, 1 h) at 30 min on 2 GPUs: H preempts L only
    if the policy preempts. And a policy file that does."""
    c = tmp_path / "c.yaml"
    c.write_text(
        "node_groups:\n  - {name: n, count: 1, gpus_per_node: 2, gpu_model: H100-80GB}\n"
        "failures: {gpu_failures_per_day: 0}\ncheckpoints: {interval: 10m, cost: 10s, restart: 60s}\n"
    )
    t = low_then_high_trace(tmp_path / "t.csv")
    pol = tmp_path / "mine.yaml"
    pol.write_text(PREEMPTING)
    return c, t, pol


def test_a_value_inside_a_policy_file_can_be_swept(low_then_high: tuple[Path, Path, Path]) -> None:
    cluster, trace, pol = low_then_high
    opts = SimulateOptions(
        cluster=cluster,
        trace=trace,
        out=None,
        policies=(str(pol),),
        sweeps=("policy.preemption.enabled=true,false", "policy.ordering.mode=age,las"),
    )
    sw = simulate(opts, write=False, workers=1).metrics["sweep"]
    assert sw["runs"] == 4
    got = [
        (
            r["policy"],
            r["point"]["policy.preemption.enabled"],
            r["point"]["policy.ordering.mode"],
            r["preemptions"]["mean"],
        )
        for r in sw["rows"]
    ]
    # H preempts L only where preemption is on; the ordering within a class does not change that
    assert got == [
        ("mine", "true", "age", 1.0),
        ("mine", "true", "las", 1.0),
        ("mine", "false", "age", 0.0),
        ("mine", "false", "las", 0.0),
    ]
    assert [a["key"] for a in sw["axes"]] == ["policy.preemption.enabled", "policy.ordering.mode"]
    assert pol.read_text() == PREEMPTING  # the file itself is left as written


def test_a_policy_value_not_in_the_policy_files_rules_is_refused_naming_the_key(
    tmp_path: Path, low_then_high: tuple[Path, Path, Path]
) -> None:
    cluster, trace, pol = low_then_high
    for policy, sweep, says in (
        (
            str(pol),
            "policy.preemption.enabld=true,false",
            "mine.yaml:2: preemption.enabld: unknown key in a policy file",
        ),
        (str(pol), "policy.preemption.enabled=true,maybe", "preemption.enabled: Input should be a valid boolean"),
        (str(pol), "policy.ordering.mode=age,sjf2", "ordering.mode"),
        (str(pol), "policy.priorities.x=1", "--sweep policy.priorities.x: priorities is not a mapping or list"),
        ("fifo", "policy.preemption.enabled=true", "--policy fifo is a shipped baseline, not a file"),
    ):
        opts = SimulateOptions(cluster=cluster, trace=trace, out=None, policies=(policy,), sweeps=(sweep,))
        with pytest.raises(SimInputError) as e:
            simulate(opts, write=False, workers=1)
        assert says in str(e.value), str(e.value)
        if policy != "fifo":
            assert str(pol) in str(e.value)  # the file the key was laid over
        assert "(with --sweep policy." in str(e.value)
