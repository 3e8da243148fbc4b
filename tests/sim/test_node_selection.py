"""Node labels in the cluster spec and node selection in native traces (issue 16): the simulator
runs the core's rules, so a constrained job runs only on labelled nodes, an exclusive one never
shares a node, and a selection no node satisfies is skipped with the core's reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.sim.engine import Engine
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.readers import read_trace
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import cluster_yaml, native_csv

GROUPS = """node_groups:
  - {name: ib, count: 2, gpus_per_node: 4, gpu_model: H100, labels: [ib, rack=r1]}
  - {name: eth, count: 2, gpus_per_node: 4, gpu_model: H100}
failures: {gpu_failures_per_day: 0}
checkpoints: {interval: none}
"""


def test_constrained_and_exclusive_jobs_keep_to_their_nodes(tmp_path: Path) -> None:
    spec = load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=GROUPS))
    assert {n.name: n.labels for n, _ in spec.nodes()} == {
        "ib-0": frozenset({"ib", "rack=r1"}),
        "ib-1": frozenset({"ib", "rack=r1"}),
        "eth-0": frozenset(),
        "eth-1": frozenset(),
    }
    rows = []
    for i in range(24):
        row: dict[str, object] = {"submit_time": i * 5, "duration": 60 + 7 * (i % 5), "gpus": 1 + i % 3}
        if i % 4 == 0:
            row["constraint"] = "ib"
        elif i % 4 == 1:
            row["exclusive"] = "true"
        elif i % 4 == 2:
            row["exclude"] = "eth-0"
        rows.append(row)
    rows.append({"submit_time": 1, "duration": 10, "gpus": 1, "constraint": "nvswitch"})  # nowhere
    trace = read_trace(native_csv(tmp_path / "t.csv", rows), spec, 0, "native")
    res = Engine(spec, trace.jobs, load_policy("fifo"), 0, keep_starts=True).run()
    by_id = {j.job_id: j for j in trace.jobs}
    assert len(res.job_id) == 24 and sum(res.skipped.values()) == 1
    assert any("no node matches --constraint nvswitch" in why for why in res.skipped)
    ends = dict(zip(res.job_id, res.end, strict=True))
    spans: list[tuple[float, float, int, set[str]]] = []
    for at, job_id, alloc in res.starts:
        nodes = {s.node for s in alloc.slices}
        sel = by_id[job_id].selection
        if sel is not None:
            labels = {n.name: n.labels for n, _ in spec.nodes()}
            assert all(sel.allows(n, labels[n]) for n in nodes), (job_id, nodes)
        spans.append((at, ends[job_id], job_id, nodes))
    exclusive = {j.job_id for j in trace.jobs if j.selection is not None and j.selection.exclusive}
    assert exclusive and exclusive <= {s[2] for s in spans}
    for a0, a1, a, an in spans:
        for b0, b1, b, bn in spans:
            if a != b and a in exclusive and an & bn:
                assert a1 <= b0 or b1 <= a0, f"exclusive job {a} shared {an & bn} with job {b}"


def test_a_bad_label_in_a_cluster_spec_names_its_line(tmp_path: Path) -> None:
    bad = GROUPS.replace("labels: [ib, rack=r1]", "labels: [ib, 'two words']")
    with pytest.raises(SimInputError, match=r"c.yaml:2: node_groups\[0\].labels: bad label 'two words'"):
        load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=bad))


def test_pools_in_the_policy_file_decide_where_each_team_runs(tmp_path: Path) -> None:
    """The simulator reads pools from the same policy file as the head: team b never runs on the
    ib nodes, and team c, which every node's pool closes out, is skipped with the core's reason;
    a job of team a asking the same as a skipped one of team c is not skipped for it."""
    spec = load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=GROUPS))
    policy = tmp_path / "p.yaml"
    policy.write_text("pools:\n  ib: {labels: [ib], teams: [a]}\n  eth: {nodes: [eth-0, eth-1], teams: [a, b]}\n")
    rows = [{"submit_time": 0, "duration": 30, "gpus": 2, "team": "c"}]
    rows += [{"submit_time": i, "duration": 30 + i, "gpus": 2, "team": "ab"[i % 2]} for i in range(1, 13)]
    trace = read_trace(native_csv(tmp_path / "t.csv", rows), spec, 0, "native")
    res = Engine(spec, trace.jobs, load_policy(str(policy)), 0, keep_starts=True).run()
    assert len(res.job_id) == 12 and sum(res.skipped.values()) == 1
    assert any("pool(s) eth, ib" in why for why in res.skipped), res.skipped
    team = {j.job_id: j.team for j in trace.jobs}
    for _, job_id, alloc in res.starts:
        if team[job_id] == "b":
            assert all(s.node.startswith("eth-") for s in alloc.slices), (job_id, alloc)
    assert any(team[j] == "a" and any(s.node.startswith("ib-") for s in a.slices) for _, j, a in res.starts)
