"""Arrays and dependencies replayed from a native trace: the simulator applies the head's own
eligibility rules (core/eligibility.py) to its queue: throttles, dependency verdicts, and a
dependency that can never be met cancelling the dependent and its own dependents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpucluster.sim.engine import CANCELLED_DEPENDENCY, FAILED_TIME_LIMIT, SUCCEEDED
from gpucluster.sim.metrics import run_metrics
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import NO_FAILURES, cluster_yaml, run

EXTRA = f"failures: {json.dumps(NO_FAILURES['failures'])}\ncheckpoints: {json.dumps(NO_FAILURES['checkpoints'])}\n"


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals [start, end) that overlap at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])  # ends first at a tie
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_a_throttled_array_never_runs_more_than_its_throttle_at_once(tmp_path: Path) -> None:
    cluster = cluster_yaml(tmp_path / "c.yaml", nodes=2, gpus=8, extra=EXTRA)
    trace = jsonl(
        tmp_path / "t.jsonl",
        [
            {"id": 1, "submit_time": 0, "duration": 100, "array": "0-19%3"},
            {"id": 2, "submit_time": 10, "duration": 50, "gpus": 1},  # a plain job beside it starts at once
        ],
    )
    ran = run(cluster, trace)
    elements = range(1, 21)
    assert all(ran.outcome[i] == SUCCEEDED for i in elements)
    assert most_at_once([(ran.start[i], ran.end[i]) for i in elements]) == 3  # 16 GPUs free: the throttle holds
    assert ran.start[21] == 10.0
    # Waves of 3, lowest indices first: 7 waves of 100 s.
    assert [ran.start[i] for i in elements] == sorted(ran.start[i] for i in elements)
    assert max(ran.end[i] for i in elements) == 700.0
    # the plots count the elements the throttle holds back as queued, as the head's state does
    assert ran.result.series.bin_s == 60.0 and ran.result.series.queued_jobs[0] == 17


def test_a_three_step_pipeline_runs_in_order(tmp_path: Path) -> None:
    cluster = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=8, extra=EXTRA)
    trace = jsonl(
        tmp_path / "t.jsonl",
        [
            {"id": 10, "submit_time": 0, "duration": 300, "name": "prepare"},
            {"id": 20, "submit_time": 0, "duration": 100, "array": "0-3", "afterok": [10], "name": "train"},
            {"id": 30, "submit_time": 1, "duration": 60, "afterok": [20], "name": "evaluate"},
            {"id": 40, "submit_time": 2, "duration": 10, "after": [10]},  # only needs 10 started
        ],
    )
    ran = run(cluster, trace)
    prepare, train, evaluate, watcher = 1, range(2, 6), 6, 7
    assert all(o == SUCCEEDED for o in ran.outcome.values())
    assert ran.start[prepare] == 0.0 and ran.end[prepare] == 300.0
    assert all(ran.start[i] == 300.0 and ran.end[i] == 400.0 for i in train)  # 8 GPUs idle meanwhile
    assert ran.start[evaluate] == 400.0
    assert ran.start[watcher] == 2.0  # its target had started when it arrived


def test_afterok_on_a_failing_job_cancels_the_dependent_and_its_dependents(tmp_path: Path) -> None:
    cluster = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=4, extra=EXTRA)
    trace = jsonl(
        tmp_path / "t.jsonl",
        [
            {"id": 1, "submit_time": 0, "duration": 600, "time_limit": "5m"},  # killed at its limit: failed
            {"id": 2, "submit_time": 0, "duration": 60, "afterok": [1]},
            {"id": 3, "submit_time": 0, "duration": 60, "array": "0-2", "afterok": [2]},
            {"id": 4, "submit_time": 0, "duration": 60, "afternotok": [1]},
            {"id": 5, "submit_time": 0, "duration": 60, "afterany": [3]},  # an array that was cancelled ended
        ],
    )
    ran = run(cluster, trace)
    assert ran.outcome[1] == FAILED_TIME_LIMIT and ran.end[1] == 300.0
    cancelled = [2, 3, 4, 5]  # job 2 and the three elements of array 3
    assert all(ran.outcome[i] == CANCELLED_DEPENDENCY and ran.end[i] == 300.0 for i in cancelled)
    assert all(ran.start[i] < 0 for i in cancelled)
    assert ran.outcome[6] == SUCCEEDED and ran.start[6] == 300.0  # afternotok: met
    assert ran.outcome[7] == SUCCEEDED and ran.start[7] == 300.0  # afterany on a cancelled array: met
    jobs = run_metrics(ran.result, load_cluster_spec(cluster))["jobs"]
    assert jobs["cancelled_by_dependency"] == 4 and jobs["succeeded"] == 2 and jobs["simulated"] == 7


# A sweep and a pipeline with a failing step, for the simulator and a real head loop and store
# (fake executor, a clock the test moves, as test_live_head.py's second half): trace ids are the
# head's job ids, so the rows submit unchanged.
AGREEMENT_POLICY = (
    "priorities: true\nfair_share: {enabled: false}\nbackfill: {enabled: false}\npreemption: {enabled: false}\n"
)
AGREEMENT = [
    {"id": 1, "submit_time": 0, "duration": 100, "gpus": 2, "array": "0-5%2"},  # jobs 1..6
    {"id": 7, "submit_time": 1, "duration": 50, "gpus": 4, "afterok": [1]},
    {"id": 8, "submit_time": 2, "duration": 400, "gpus": 1, "time_limit": 120},  # fails at its limit
    {"id": 9, "submit_time": 3, "duration": 30, "gpus": 1, "afterok": [8]},  # cancelled
    {"id": 10, "submit_time": 4, "duration": 30, "gpus": 2, "afternotok": [8]},
    {"id": 11, "submit_time": 5, "duration": 30, "gpus": 1, "after": [7]},
    {"id": 12, "submit_time": 6, "duration": 30, "gpus": 1, "afterany": [9]},
]


def test_simulator_and_head_agree_on_a_sweep_and_a_pipeline(tmp_path: Path) -> None:
    from gpucluster.core.states import JobState
    from gpucluster.sim.engine import Engine
    from gpucluster.sim.readers import read_trace
    from gpucluster.sim.scheduling import load_policy
    from tests.sim.headreplay import replay_on_head

    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(AGREEMENT_POLICY)
    spec = load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=8, extra=EXTRA))
    trace = read_trace(jsonl(tmp_path / "t.jsonl", AGREEMENT), spec, 0)
    assert not trace.errors
    res = Engine(spec, trace.jobs, load_policy(str(policy_file)), 0, keep_starts=True).run()
    sim_starts = sorted((t, job_id) for t, job_id, _ in res.starts)
    sim_cancelled = {j for j, o in zip(res.job_id, res.outcome, strict=True) if o == CANCELLED_DEPENDENCY}
    assert sim_cancelled == {9}  # 12 runs: afterany accepts a cancelled target

    live = replay_on_head(tmp_path, spec, policy_file, AGREEMENT, trace.jobs)
    assert sorted((t, j) for t, j, _ in live.starts) == sim_starts
    assert {j for j, s in live.states.items() if s is JobState.CANCELLED} == sim_cancelled
    assert live.states[8] is JobState.FAILED


def test_the_throttle_holds_through_failures_and_restarts(tmp_path: Path) -> None:
    """GPUs failing often: elements are interrupted and come back to the queue, lower indices
    among them taking their place under the throttle again; at no start do more than 4 run."""
    from gpucluster.core.types import Start
    from gpucluster.sim.engine import Engine
    from gpucluster.sim.readers import read_trace
    from gpucluster.sim.scheduling import load_policy

    cluster = cluster_yaml(
        tmp_path / "c.yaml",
        nodes=2,
        gpus=8,
        extra="failures: {gpu_failures_per_day: 40, node_repair_time: 10m, max_restarts: 100}\n"
        "checkpoints: {interval: 10m, cost: 10s, restart: 30s}\n",
    )
    trace = jsonl(tmp_path / "t.jsonl", [{"id": 1, "submit_time": 0, "duration": "1h", "array": "0-29%4"}])
    spec = load_cluster_spec(cluster)
    most: list[int] = []

    class Checked(Engine):
        def _start(self, start: Start, now: float) -> None:
            super()._start(start, now)
            most.append(sum(1 for r in self._running.values() if r.job_id <= 30))

    res = Checked(spec, read_trace(trace, spec, 0).jobs, load_policy("fifo"), 3).run()
    assert res.restarts > 5  # the failures did interrupt elements
    assert max(most) == 4 and len(most) == 30 + res.restarts + res.preemptions
    assert list(res.outcome) == [SUCCEEDED] * 30


def test_simulate_counts_jobs_cancelled_by_a_dependency_in_metrics_and_the_report(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpucluster.cli.main import app

    cluster = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=4, extra=EXTRA)
    trace = tmp_path / "t.csv"
    trace.write_text(
        "id,submit_time,duration,time_limit,array,afterok\n"
        "1,0,10m,5m,,\n"  # fails at its limit
        '2,0,1m,,0-9%2,"1"\n'  # ten elements that can never start
        "3,1,1m,,,2\n"  # and their dependent
        "4,2,1m,,,\n"
    )
    out = tmp_path / "out"
    args = ["--cluster", str(cluster), "--trace", str(trace), "--out", str(out), "--quiet", "--policy", "fifo"]
    result = CliRunner().invoke(app, ["simulate", *args])
    assert result.exit_code == 0, result.output
    jobs = json.loads((out / "metrics.json").read_text())["policies"]["fifo"]["jobs"]
    assert (jobs["simulated"], jobs["cancelled_by_dependency"], jobs["succeeded"]) == (13, 11, 1)
    assert "cancelled: dependency" in (out / "report.html").read_text()
    rows = (out / "jobs.csv").read_text().splitlines()
    assert sum(1 for r in rows if r.endswith(",cancelled_dependency")) == 11
