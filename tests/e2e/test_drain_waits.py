"""A drained node stays visible to the scheduler as unavailable, on a real head and the real CLI.

On a cluster whose only node is drained, a queued job was told "no set of nodes can host it (no
GPUs)" with no estimate; now `why` names the drain, and with `drain --until` the estimate is the
drain's end, when the head ends the drain by itself and starts the job.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from gpucluster.waits_text import at
from tests.e2e.headproc import HeadProcess, cli, wait_for


def why(head: HeadProcess, job_id: int) -> dict[str, Any]:
    r = cli(head, "why", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def submit(head: HeadProcess, *args: str) -> int:
    r = cli(head, "submit", "--json", *args)
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["id"])


def test_a_job_on_a_drained_only_node_is_told_the_drain_and_no_end(head: HeadProcess) -> None:
    assert cli(head, "drain", "node0", "--reason", "maintenance").returncode == 0
    job = submit(head, "--gpus", "2", "--", "true")
    w = wait_for(lambda: (w := why(head, job))["wait_reason"] == "drained" and w, what="a drained wait")
    assert w["reason"] == "node node0 is drained (maintenance) with no end set"
    assert w["estimated_start"] is None
    human = cli(head, "why", str(job)).stdout
    assert "[drained] node node0 is drained (maintenance) with no end set" in human


def test_a_drain_with_an_end_gives_the_estimate_and_ends_by_itself(head: HeadProcess) -> None:
    r = cli(head, "drain", "node0", "--reason", "firmware", "--until", "now+20s")
    assert r.returncode == 0, r.stderr
    assert "drained until " in r.stdout
    until = json.loads(cli(head, "nodes", "--json").stdout)[0]["drained_until"]
    assert until is not None and until > time.time()
    job = submit(head, "--gpus", "2", "--", "true")
    w = wait_for(lambda: (w := why(head, job))["wait_reason"] == "drained" and w, what="a drained wait")
    assert w["reason"].startswith("node node0 is drained (firmware), until ")
    assert w["estimated_start"] == until
    # The wait's numbers travel beside the sentence; the API says its time in UTC, naming the
    # zone, and the CLI in the viewer's local zone, named too.
    assert w["wait"] == {"code": "drained", "drains": [["node0", "firmware", until]]}
    assert w["reason"] == f"node node0 is drained (firmware), until {at(until)}" and at(until).endswith(" UTC")
    assert f"until {at(until, None)}" in cli(head, "why", str(job)).stdout
    # The head ends the drain at its end by itself, and the job runs then. The 20 s above are
    # room for the CLI calls on busy cores, not something to sit out: the drain's end is moved
    # to 2 s from now (a drain of a drained node replaces its end), straight through the API so
    # no CLI start stands between the clock read and the request.
    end = time.time() + 2
    r2 = httpx.post(f"{head.url}/v1/nodes/node0/drain", json={"reason": "firmware", "until": end}, headers=head.headers)
    assert r2.status_code == 200 and r2.json()["drained_until"] == end, r2.text
    wait_for(lambda: why(head, job)["state"] == "succeeded", timeout=60, what="the job to run after the drain")
    with head.client() as c:
        started = c.job(job).started_at
    assert started is not None and started >= end, (started, end)
    assert json.loads(cli(head, "nodes", "--json").stdout)[0]["drained"] is False


def test_a_drain_end_in_the_past_is_one_clear_line(head: HeadProcess) -> None:
    r = cli(head, "drain", "node0", "--until", "2020-01-01T00:00")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "until" in r.stderr
