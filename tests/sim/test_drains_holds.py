"""Drain windows (the cluster spec's `drains:`) and user holds (`hold: true` with a
`release_time`) in the simulator: a drain is fed to the core's admission as the head's drained
nodes are (no new job there; running jobs finish, or are requeued with `running: requeue`),
a hold to core/eligibility.py as the head's `held` flag is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucluster.sim.engine import NEVER_STARTED, SUCCEEDED
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.metrics import run_metrics
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import NO_FAILURES, cluster_yaml, run

EXTRA = f"failures: {json.dumps(NO_FAILURES['failures'])}\ncheckpoints: {json.dumps(NO_FAILURES['checkpoints'])}\n"


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cluster(tmp: Path, drains: str, nodes: int = 1, gpus: int = 4) -> Path:
    return cluster_yaml(tmp / "c.yaml", nodes=nodes, gpus=gpus, extra=EXTRA + drains)


def test_a_drained_node_takes_no_new_job_and_its_running_jobs_finish(tmp_path: Path) -> None:
    c = cluster(tmp_path, "drains: [{nodes: [n-0], start: 100s, duration: 200s, reason: firmware}]\n")
    trace = jsonl(
        tmp_path / "t.jsonl",
        [
            {"submit_time": 0, "duration": 500, "gpus": 2},  # runs through the drain
            {"submit_time": 150, "duration": 60, "gpus": 1},  # free GPUs, but drained: waits for its end
        ],
    )
    ran = run(c, trace)
    assert ran.outcome == {1: SUCCEEDED, 2: SUCCEEDED}
    assert (ran.start[1], ran.end[1]) == (0.0, 500.0)
    assert ran.start[2] == 300.0
    drains = run_metrics(ran.result, load_cluster_spec(c))["drains"]
    # 4 GPUs drained for 200 s; the running job held 2 of them: 2 x 200 GPU-s lost
    assert drains == {"windows": 1, "drained_gpu_hours": 0.22, "lost_gpu_hours": 0.11, "requeued_jobs": 0}
    assert ran.result.drained_gpu_s == 800.0 and ran.result.drain_idle_gpu_s == 400.0


def test_a_requeue_window_stops_the_running_jobs_and_they_resume_after_it(tmp_path: Path) -> None:
    c = cluster(tmp_path, "drains: [{nodes: [n], start: 100s, duration: 200s, running: requeue}]\n")
    trace = jsonl(tmp_path / "t.jsonl", [{"submit_time": 0, "duration": 500, "gpus": 2}])
    ran = run(c, trace)
    res = ran.result
    assert res.drain_requeues == 1 and res.preemptions == 0  # not the scheduler's preemption
    assert ran.outcome[1] == SUCCEEDED and ran.start[1] == 0.0
    # no checkpoints: stopped at once at 100 s, its work lost; back at the drain's end, 120 s
    # of restart (checkpoints.restart's default), then all 500 s again
    assert ran.end[1] == 300.0 + 120.0 + 500.0
    assert res.drained_gpu_s == res.drain_idle_gpu_s == 4 * 200.0


def test_simulate_reports_the_drains_in_metrics_json(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpucluster.cli.main import app

    c = cluster(tmp_path, "drains: [{nodes: [n-0], start: 0s, duration: 1h}]\n")
    trace = jsonl(tmp_path / "t.jsonl", [{"submit_time": 0, "duration": "30m", "gpus": 1}])
    out = tmp_path / "out"
    args = ["--cluster", str(c), "--trace", str(trace), "--out", str(out), "--quiet", "--policy", "fifo"]
    result = CliRunner().invoke(app, ["simulate", *args])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())["policies"]["fifo"]
    # the job waits out the hour, then runs 30 min: 4 GPUs drained for 1 h, none held meanwhile
    assert metrics["drains"] == {"windows": 1, "drained_gpu_hours": 4.0, "lost_gpu_hours": 4.0, "requeued_jobs": 0}
    assert metrics["jobs"]["succeeded"] == 1


def test_a_job_that_ends_just_as_a_requeue_window_opens_has_succeeded(tmp_path: Path) -> None:
    c = cluster(tmp_path, "drains: [{nodes: [n], start: 100s, duration: 50s, running: requeue}]\n")
    ran = run(c, jsonl(tmp_path / "t.jsonl", [{"submit_time": 0, "duration": 100, "gpus": 2}]))
    assert ran.result.drain_requeues == 0 and ran.outcome[1] == SUCCEEDED and ran.end[1] == 100.0


def test_a_drain_without_an_end_leaves_what_only_it_could_host_unstarted(tmp_path: Path) -> None:
    c = cluster(tmp_path, "drains: [{nodes: [n-1], start: 0s}]\n", nodes=2, gpus=2)
    trace = jsonl(
        tmp_path / "t.jsonl",
        [
            {"submit_time": 0, "duration": 60, "gpus": 2},  # n-0 hosts it
            {"submit_time": 10, "duration": 60, "gpus": 4},  # needs both nodes: never
        ],
    )
    ran = run(c, trace)
    assert ran.outcome == {1: SUCCEEDED, 2: NEVER_STARTED}
    assert ran.start[1] == 0.0
    assert ran.result.drained_gpu_s == ran.result.drain_idle_gpu_s == 2 * 60.0  # to the last end


def test_overlapping_windows_keep_a_node_drained_until_the_last_ends(tmp_path: Path) -> None:
    c = cluster(
        tmp_path,
        "drains:\n  - {nodes: [n], start: 0s, duration: 100s}\n  - {nodes: [n-0], start: 50s, duration: 150s}\n",
    )
    ran = run(c, jsonl(tmp_path / "t.jsonl", [{"submit_time": 10, "duration": 60, "gpus": 1}]))
    assert ran.start[1] == 200.0


def test_a_node_that_fails_inside_a_drain_window_comes_back_drained(tmp_path: Path) -> None:
    """Failures and repairs are NodeDown/NodeUp to the engine's cluster state, and a drain is
    said of the node: one repaired (in a second) inside its window takes no job until it ends."""
    c = cluster_yaml(
        tmp_path / "c.yaml",
        nodes=1,
        gpus=4,
        extra="failures: {gpu_failures_per_day: 500, node_repair_time: 1s, max_restarts: 0}\n"
        "checkpoints: {interval: none}\n"
        "drains: [{nodes: [n-0], start: 0s, duration: 1000s}]\n",
    )
    ran = run(c, jsonl(tmp_path / "t.jsonl", [{"submit_time": 10, "duration": 1, "gpus": 1}]))
    assert ran.start[1] >= 1000.0
    assert ran.result.node_failures >= 3  # about one every 43 s: several inside the window


@pytest.mark.parametrize(
    ("drains", "key", "says"),
    [
        ("drains: {nodes: [n-0]}", "drains", "must be a list of windows"),
        ("drains: [{nodes: [x-9], start: 1h}]", "drains[0].nodes", "no node or node group is named 'x-9'"),
        ("drains: [{nodes: [n-0]}]", "drains[0].start", "is required"),
        ("drains: [{nodes: [n-0], start: 1h, duration: 0s}]", "drains[0].duration", "must be above 0"),
        ("drains: [{nodes: [n-0], start: 1h, running: kill}]", "drains[0].running", "must be finish"),
        ("drains: [{nodes: [n-0], start: 1h, when: 2h}]", "drains[0].when", "unknown key"),
        ("drains: [{nodes: [], start: 1h}]", "drains[0].nodes", "must be a list of node names"),
    ],
)
def test_drain_windows_are_validated_naming_the_key(tmp_path: Path, drains: str, key: str, says: str) -> None:
    c = cluster(tmp_path, drains + "\n")
    with pytest.raises(SimInputError) as e:
        load_cluster_spec(c)
    assert "c.yaml:" in str(e.value) and f"{key}: " in str(e.value) and says in str(e.value)


def test_a_held_job_starts_at_its_release_and_one_never_released_never_starts(tmp_path: Path) -> None:
    c = cluster(tmp_path, "")
    trace = jsonl(
        tmp_path / "t.jsonl",
        [
            {"submit_time": 0, "duration": 60, "gpus": 1, "hold": True, "release_time": "5m"},
            {"submit_time": 0, "duration": 60, "gpus": 1, "hold": True},  # never released
            {"submit_time": 10, "duration": 60, "gpus": 1},
        ],
    )
    ran = run(c, trace)
    assert ran.start[1] == 300.0 and ran.outcome[1] == SUCCEEDED
    assert ran.outcome[2] == NEVER_STARTED
    assert ran.start[3] == 10.0
    # the plots count held jobs as queued, as the head's state does
    assert ran.result.series.queued_jobs[0] == 2


def test_a_held_array_is_released_as_a_whole_and_its_throttle_holds(tmp_path: Path) -> None:
    c = cluster(tmp_path, "", gpus=8)
    trace = jsonl(
        tmp_path / "t.jsonl",
        [
            {"id": 1, "submit_time": 0, "duration": 100, "array": "0-5%2", "hold": True, "release_time": 50},
            {"id": 2, "submit_time": 1, "duration": 10, "afterok": [1]},
        ],
    )
    ran = run(c, trace)
    assert [ran.start[i] for i in range(1, 7)] == [50.0, 50.0, 150.0, 150.0, 250.0, 250.0]
    assert ran.start[7] == 350.0


def test_a_held_dependent_waits_for_both_its_release_and_its_dependency(tmp_path: Path) -> None:
    c = cluster(tmp_path, "")
    trace = jsonl(
        tmp_path / "t.jsonl",
        [
            {"id": 1, "submit_time": 0, "duration": 100},
            {"id": 2, "submit_time": 0, "duration": 10, "afterok": [1], "hold": True, "release_time": 200},
            {"id": 3, "submit_time": 0, "duration": 10, "afterok": [1], "hold": True, "release_time": 50},
        ],
    )
    ran = run(c, trace)
    assert ran.start[2] == 200.0  # met at 100, released at 200
    assert ran.start[3] == 100.0  # released at 50, met at 100


# The simulator and a real head loop and store (tests/sim/headreplay.py) on a drain window whose
# running jobs finish, one whose running jobs are requeued, a held job released at a time, a
# throttled array and a dependency chain through it: the same starts, on the same nodes, at
# the same instants, and the same requeues.
AGREEMENT_POLICY = (
    "priorities: true\nfair_share: {enabled: false}\nbackfill: {enabled: false}\npreemption: {enabled: false}\n"
)
AGREEMENT_DRAINS = (
    "checkpoints: {interval: none, restart: 0s}\n"
    "drains:\n"
    "  - {nodes: [n-1], start: 60s, duration: 100s, reason: firmware}\n"
    "  - {nodes: [n-0], start: 230s, duration: 60s, running: requeue}\n"
)
AGREEMENT = [
    {"id": 1, "submit_time": 0, "duration": 100, "gpus": 2, "array": "0-3%2"},  # jobs 1..4
    {"id": 5, "submit_time": 1, "duration": 50, "gpus": 4, "afterok": [1]},
    {"id": 6, "submit_time": 2, "duration": 300, "gpus": 1, "hold": True, "release_time": 120},
    {"id": 7, "submit_time": 3, "duration": 40, "gpus": 2, "afterok": [5]},
    {"id": 8, "submit_time": 4, "duration": 400, "gpus": 1},
    {"id": 9, "submit_time": 5, "duration": 30, "gpus": 1, "after": [6]},
    {"id": 10, "submit_time": 70, "duration": 30, "gpus": 3},  # while n-1 is drained
]


def test_simulator_and_head_agree_on_drains_holds_an_array_and_a_chain(tmp_path: Path) -> None:
    from gpucluster.core.states import JobState
    from gpucluster.sim.engine import Engine
    from gpucluster.sim.readers import read_trace
    from gpucluster.sim.scheduling import load_policy
    from tests.sim.headreplay import replay_on_head

    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(AGREEMENT_POLICY)
    spec = load_cluster_spec(
        cluster_yaml(
            tmp_path / "c.yaml", nodes=2, gpus=4, extra="failures: {gpu_failures_per_day: 0}\n" + AGREEMENT_DRAINS
        )
    )
    trace = read_trace(jsonl(tmp_path / "t.jsonl", AGREEMENT), spec, 0)
    assert not trace.errors
    res = Engine(spec, trace.jobs, load_policy(str(policy_file)), 0, keep_starts=True).run()
    expected = sorted((t, j, a.slices[0].node) for t, j, a in res.starts)
    assert res.drain_requeues == 1 and all(o == SUCCEEDED for o in res.outcome)

    live = replay_on_head(tmp_path, spec, policy_file, AGREEMENT, trace.jobs)
    assert sorted(live.starts) == expected
    assert live.requeues == res.drain_requeues
    assert all(s is JobState.SUCCEEDED for s in live.states.values())
