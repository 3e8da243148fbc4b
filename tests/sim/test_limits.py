"""Per-user limits in the simulator (issue 16): the policy file's `limits:` hold a user's jobs at
their limit through the same core step as on the head (core/limits.py, applied by `decide`), with
users from the trace (native `user`, Philly's optional `user` column)."""

from __future__ import annotations

from pathlib import Path

from gpucluster.sim.readers import read_trace
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import NO_FAILURES, cluster_yaml, native_csv, run

HOUR = 3600.0


def _cluster(tmp: Path) -> Path:
    return cluster_yaml(tmp / "c.yaml", nodes=1, gpus=8, extra=f"failures: {NO_FAILURES['failures']}\n")


def test_a_user_runs_no_more_than_their_limit_while_a_teammate_starts(tmp_path: Path) -> None:
    rows = [
        {"submit_time": 0, "duration": "1h", "gpus": 4, "user": "alice", "team": "vision"},
        {"submit_time": 1, "duration": "1h", "gpus": 4, "user": "alice", "team": "vision"},
        {"submit_time": 2, "duration": "1h", "gpus": 4, "user": "alice", "team": "vision"},
        {"submit_time": 10, "duration": "1h", "gpus": 4, "user": "bob", "team": "vision"},
    ]
    trace = native_csv(tmp_path / "t.csv", rows)
    (tmp_path / "limits.yaml").write_text("limits:\n  per_user: {max_running_gpus: 4}\n")
    (tmp_path / "open.yaml").write_text("teams: {}\n")
    limited = run(_cluster(tmp_path), trace, str(tmp_path / "limits.yaml"))
    # alice's second and third wait for her first and second; bob starts at once, beside her
    assert limited.start == {1: 0.0, 2: HOUR, 3: 2 * HOUR, 4: 10.0}
    open_ = run(_cluster(tmp_path), trace, str(tmp_path / "open.yaml"))
    assert open_.start == {1: 0.0, 2: 1.0, 3: HOUR, 4: HOUR + 1}  # without the limit alice takes the node


def test_users_come_from_native_rows_and_phillys_optional_user_column(tmp_path: Path) -> None:
    spec = load_cluster_spec(_cluster(tmp_path))
    philly = tmp_path / "philly.csv"
    philly.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster,user\n"
        "2017-10-03 14:05:09,60,1,60,vc1,u42\n"
        "2017-10-03 14:06:09,60,1,60,vc1,\n"
    )
    assert [j.user for j in read_trace(philly, spec, 0).jobs] == ["u42", ""]
    bad = native_csv(tmp_path / "bad.csv", [{"submit_time": 0, "duration": 60, "user": "x" * 200}])
    trace = read_trace(bad, spec, 0)
    assert not trace.jobs and "user must be a user name" in trace.errors[0].message
