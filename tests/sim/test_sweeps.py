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
