"""End to end: node labels and node selection (issue 16) on a live head and the real CLI.

A head declares one local node (`up --label ib --label rack=r1`), so this checks what one node
can show: labels listed, constraints that match it run there, selections no node satisfies
refused at submit in one line, a job file's selection, and --exclusive keeping the node to one
job both ways. Placement among several nodes is tested on the real loop with two nodes in
tests/unit/test_head_selection.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.headproc import HeadProcess, cli, wait_for
from tests.e2e.test_jobs import finished, running


@pytest.fixture
def labelled(head_factory: type[HeadProcess], tmp_path: Path) -> HeadProcess:
    return head_factory(tmp_path / "data", gpus=4, extra_args=("--label", "ib", "--label", "rack=r1")).start()


def submit(head: HeadProcess, *args: str) -> int:
    r = cli(head, "submit", "--json", *args)
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["id"])


def test_labels_are_listed_and_constraints_that_match_run(labelled: HeadProcess, tmp_path: Path) -> None:
    table = cli(labelled, "nodes")
    assert table.returncode == 0 and "node0 labels: ib, rack=r1" in table.stdout
    listing = json.loads(cli(labelled, "nodes", "--json").stdout)
    assert [n["labels"] for n in listing] == [["ib", "rack=r1"]]
    ok = submit(labelled, "--constraint", "ib&rack=r1", "--", "true")
    either = submit(labelled, "--constraint", "nvswitch|rack=r1", "--nodelist", "node0", "--", "true")
    job_file = tmp_path / "job.yaml"
    job_file.write_text('command: ["true"]\nconstraint: ib\nnodelist: node0\nexclusive: true\n')
    from_file = submit(labelled, "-f", str(job_file))
    for job_id in (ok, either, from_file):
        assert finished(labelled, job_id).state.value == "succeeded"
    shown = json.loads(cli(labelled, "show", str(from_file), "--json").stdout)
    assert (shown["spec"]["constraint"], shown["spec"]["nodelist"], shown["spec"]["exclusive"]) == (
        "ib",
        ["node0"],
        True,
    )


def test_selections_no_node_satisfies_are_one_line_errors(labelled: HeadProcess) -> None:
    cases = [
        (
            ["--constraint", "nvswitch"],
            "constraint: no node matches --constraint nvswitch (nodes and their labels: node0: ib,rack=r1)",
        ),
        (["--nodelist", "node9"], "nodelist: unknown node 'node9'; this cluster has: node0"),
        (["--exclude", "node0"], "exclude: no node matches --exclude node0"),
        (["--constraint", "ib&", "--gpus", "1"], "an empty label"),
        (["--exclusive", "--gpus", "0.5"], "exclusive holds whole nodes"),
        (["--nodelist", "node0", "--exclude", "node0"], "node node0 is both in nodelist and in exclude"),
    ]
    for args, needle in cases:
        r = cli(labelled, "submit", *args, "--", "true")
        assert r.returncode == 1, (args, r.stdout)
        assert needle in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(cli(labelled, "jobs", "--json").stdout) == []
    up = cli(labelled, "up", "--label", "bad label", "--port", "1")
    assert up.returncode == 1 and "--label: bad label 'bad label'" in up.stderr and "Traceback" not in up.stderr
    helps = [cli(labelled, "submit", "--help").stdout, cli(labelled, "up", "--help").stdout]
    for option in ("--nodelist", "--exclude", "--constraint", "--exclusive"):
        assert option in helps[0]
    assert "--label" in helps[1]


def test_an_exclusive_job_holds_its_node_alone_both_ways(labelled: HeadProcess) -> None:
    alone = submit(labelled, "--exclusive", "--gpus", "1", "--", "sleep", "60")
    running(labelled, alone)
    other = submit(labelled, "--gpus", "1", "--", "true")  # 3 GPUs are free, but the node is held
    # A cycle considered it (it has a wait reason) and left it queued.
    why = wait_for(lambda: (w := _why(labelled, other))["wait_reason"] and w, 60, what="a cycle to consider it")
    assert why["state"] == "queued", why
    assert cli(labelled, "cancel", str(alone)).returncode == 0
    assert finished(labelled, other, timeout=60).state.value == "succeeded"
    # The other way: an exclusive job waits while anything else runs on the node.
    busy = submit(labelled, "--gpus", "1", "--", "sleep", "60")
    running(labelled, busy)
    waits = submit(labelled, "--exclusive", "--gpus", "1", "--", "true")
    wait_for(lambda: _why(labelled, waits)["wait_reason"], 60, what="a cycle to consider it")
    text = cli(labelled, "why", str(waits)).stdout
    # First in line, it holds the node from when it empties (a reservation naming --exclusive).
    assert "--exclusive" in text and "nodes where nothing runs" in text, text
    assert cli(labelled, "cancel", str(busy)).returncode == 0
    assert finished(labelled, waits, timeout=60).state.value == "succeeded"


def _why(head: HeadProcess, job_id: int) -> dict[str, object]:
    r = cli(head, "why", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out
