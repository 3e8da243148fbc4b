"""Node selection through the head (issue 16): the real head loop, store and API on two labelled
nodes with the fake executor (a head declares one local node, so two nodes need this or Ray)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpucluster.core.states import JobState
from gpucluster.executors.fake import FakeExecutor
from gpucluster.head.loop import REPLAN_EVERY_S, Head
from gpucluster.head.paths import DataDir
from gpucluster.head.service import ClusterService, Rejected
from gpucluster.store import Store

from .builders import node, spec
from .headkit import T0, Clock, Cluster, api_client


def two_nodes(tmp_path: Path) -> Cluster:
    store = Store(tmp_path / "state.db")
    store.put_node(node("n1").gpus(4, "H100").labels("ib", "rack=r1").build(), virtual=True, now=T0)
    store.put_node(node("n2").gpus(4, "H100").build(), virtual=True, now=T0)
    fake, clock = FakeExecutor(), Clock()
    data_dir = DataDir(tmp_path)
    h = Head(store=store, executor=fake, data_dir=data_dir, clock=clock, base_env={"HOME": "/h"})
    return Cluster(store, fake, h, ClusterService(h), clock, data_dir, tmp_path, ["true"])


def nodes_of(c: Cluster, job_id: int) -> set[str]:
    a = c.record(job_id).allocation
    assert a is not None
    return {s.node for s in a.slices}


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    c = two_nodes(tmp_path)
    yield c
    c.close()


def test_labels_are_stored_and_listed(cluster: Cluster) -> None:
    assert {r.node.name: r.node.labels for r in cluster.store.nodes()} == {
        "n1": frozenset({"ib", "rack=r1"}),
        "n2": frozenset(),
    }
    with api_client(cluster.service) as api:
        listing = api.get("/v1/nodes").json()["nodes"]
    assert {n["name"]: n["labels"] for n in listing} == {"n1": ["ib", "rack=r1"], "n2": []}


def test_constraint_nodelist_and_exclude_place_jobs_on_their_nodes(cluster: Cluster) -> None:
    # Best fit alone would put the 1-GPU job on n1 after the 3-GPU one; each asks elsewhere.
    ib = cluster.submit(gpus=3, constraint="ib")
    listed = cluster.submit(gpus=1, nodelist="n2")
    excluded = cluster.submit(gpus=2, exclude=["n1"])
    cluster.head.tick()
    assert [cluster.state(j) for j in (ib, listed, excluded)] == [JobState.RUNNING] * 3
    assert (nodes_of(cluster, ib), nodes_of(cluster, listed), nodes_of(cluster, excluded)) == ({"n1"}, {"n2"}, {"n2"})


def test_the_queue_says_which_selection_a_job_waits_for(cluster: Cluster) -> None:
    first = cluster.submit(gpus=4, constraint="ib")
    cluster.head.tick()
    waiting = cluster.submit(gpus=2, constraint="rack=r1")
    cluster.head.tick()
    assert cluster.state(first) is JobState.RUNNING
    behind = cluster.submit(gpus=1, constraint="ib")
    cluster.head.tick()
    job = cluster.service.job(waiting)
    assert job.state is JobState.QUEUED
    assert job.reason is not None and job.reason.startswith("first in line (--constraint rack=r1): 2 H100 GPUs on n1")
    # n2 has 4 free GPUs, but no ib: the next job's wait says so.
    assert (cluster.service.job(behind).reason or "").startswith(
        "no free node matches --constraint ib: 1 node(s) with H100 GPUs match, 1 of them busy"
    )


def test_an_exclusive_job_keeps_its_node_to_itself_in_later_cycles(cluster: Cluster) -> None:
    alone = cluster.submit(gpus=1, exclusive=True, nodelist="n1")
    cluster.head.tick()
    assert nodes_of(cluster, alone) == {"n1"}
    fill = [cluster.submit(gpus=2) for _ in range(3)]  # 7 GPUs free on paper, 4 really (n2)
    cluster.head.tick()
    started = [j for j in fill if cluster.state(j) is JobState.RUNNING]
    assert len(started) == 2 and all(nodes_of(cluster, j) == {"n2"} for j in started)
    # What the head reads back from its store each cycle says the job holds its node alone.
    assert [j.exclusive for j in cluster.store.running_jobs() if j.job_id == alone] == [True]
    late = cluster.submit(gpus=1)
    for _ in range(2):
        cluster.clock.advance(1)
        cluster.head.tick()
    assert cluster.state(late) is JobState.QUEUED and cluster.state(fill[2]) is JobState.QUEUED


def test_an_exclusive_job_waits_for_an_idle_node(cluster: Cluster) -> None:
    busy = [cluster.submit(gpus=1, nodelist=n) for n in ("n1", "n2")]
    cluster.head.tick()
    alone = cluster.submit(gpus=1, exclusive=True)
    cluster.head.tick()
    assert cluster.state(alone) is JobState.QUEUED
    reason = cluster.service.job(alone).reason or ""
    assert "--exclusive" in reason and "nodes where nothing runs" in reason
    cluster.fake.exit_on_signal[int(signal.SIGTERM)] = 143
    cluster.service.cancel(busy[1])
    for _ in range(3):
        cluster.clock.advance(5)
        cluster.head.tick()
    assert cluster.state(alone) is JobState.RUNNING and nodes_of(cluster, alone) == {"n2"}


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"constraint": "nvswitch"}, "constraint", "no node matches --constraint nvswitch (nodes and their labels: "),
        ({"nodelist": ["n9"]}, "nodelist", "unknown node 'n9'; this cluster has: n1, n2"),
        ({"exclude": ["n9"]}, "exclude", "unknown node 'n9'"),
        ({"exclude": ["n1", "n2"]}, "exclude", "no node matches --exclude n1,n2"),
        ({"constraint": "ib", "gpus": 8}, "constraint", "can never host 8 GPUs"),
        ({"constraint": "ib", "nodelist": ["n2"]}, "constraint", "no node matches --nodelist n2 --constraint ib"),
    ],
)
def test_a_selection_no_node_can_satisfy_is_refused_at_submit(
    cluster: Cluster, fields: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(Rejected) as e:
        cluster.submit(**fields)
    assert e.value.field == field and words in e.value.message
    with api_client(cluster.service) as api:
        r = api.post("/v1/jobs", json={"command": ["true"], **fields})
    assert r.status_code == 422 and words in r.json()["error"]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"constraint": "ib&&rack=r1"}, "an empty label"),
        ({"constraint": "i b"}, "bad label 'i b'"),
        ({"nodelist": ["n1"], "exclude": ["n1"]}, "node n1 is both in nodelist and in exclude"),
        ({"exclusive": True, "gpus": 0.5}, "exclusive holds whole nodes"),
        ({"nodelist": []}, "nodelist is empty"),
    ],
)
def test_bad_selections_are_422_naming_what_is_wrong(cluster: Cluster, fields: dict[str, object], words: str) -> None:
    with api_client(cluster.service) as api:
        r = api.post("/v1/jobs", json={"command": ["true"], **fields})
    assert r.status_code == 422 and words in r.json()["error"], r.json()
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        spec(**fields)


def test_a_selected_jobs_estimate_counts_only_its_nodes(cluster: Cluster) -> None:
    """Issue 16: the estimate replay ignored selections, so a job held to n1 (ib) was promised
    n2's GPUs, free much sooner. Second in line, after a job that n2 serves first."""
    cluster.submit(gpus=4, nodelist="n1", time_limit="10m")
    cluster.submit(gpus=4, nodelist="n2", time_limit="1m")
    cluster.head.tick()
    ib = cluster.submit(gpus=4, constraint="ib", time_limit="5m")
    # Every GPU is busy: its wait and estimate come with the next periodic replan.
    cluster.tick_at(cluster.clock.t + REPLAN_EVERY_S)
    job = cluster.service.job(ib)
    assert job.state is JobState.QUEUED and job.estimated_start is not None
    assert abs(job.estimated_start - (T0 + 600)) < 5, job.estimated_start - T0  # n1's end, not n2's (T0 + 60)
