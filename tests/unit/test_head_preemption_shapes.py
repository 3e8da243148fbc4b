"""Issue 16 on the head: gangs over several nodes preempt, and victims are chosen for where the
preemptor will land. A real head loop and store on several virtual nodes (a local head has one,
so these run on the fake executor and a clock the test moves), the preemptor submitted and
watched over the HTTP API. Victims exit on SIGTERM, as a job that checkpoints does."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from gpucluster.core.states import JobState

from .headkit import T0, Cluster, api_client, make_cluster


def _until(c: Cluster, done: Callable[[], bool], start: float, what: str, ticks: int = 20) -> float:
    """Tick the head a second apart until `done` (a count of cycles, not a time: the clock is the test's)."""
    t = start
    for _ in range(ticks):
        c.tick_at(t)
        if done():
            return t
        t += 1
    raise AssertionError(f"{what} after {ticks} cycles")


def _submit(api: TestClient, **fields: object) -> int:
    r = api.post("/v1/jobs", json={"command": ["train"], **fields})
    assert r.status_code in (200, 201), r.text
    return int(r.json()["id"])


def _nodes_of(c: Cluster, job_id: int) -> dict[str, int]:
    alloc = c.record(job_id).allocation
    assert alloc is not None
    return {s.node: len(s.gpu_indices) for s in alloc.slices}


def _preempted(c: Cluster, jobs: list[int]) -> list[int]:
    return [j for j in jobs if any(e.state is JobState.PREEMPTED for e in c.store.events(j))]


def test_a_job_larger_than_a_node_lands_on_the_fewest_nodes_its_victims_allow(tmp_path: Path) -> None:
    """Measured: a high 6-GPU job on 4-GPU nodes always landed on 3 nodes (2+2+2): the three
    cheapest low jobs (least work lost) were one per node. Three victims either way, so the set
    that empties one node and frees two GPUs on another wins: 4+2."""
    c = make_cluster(tmp_path, gpus=4, nodes=3, default_command=["train"])
    c.fake.exit_on_signal[int(signal.SIGTERM)] = 143
    try:
        first = [c.submit(gpus=2, priority="low") for _ in range(6)]
        c.tick_at(T0)
        assert [_nodes_of(c, j) for j in first] == [{"n1": 2}, {"n1": 2}, {"n2": 2}, {"n2": 2}, {"n3": 2}, {"n3": 2}]
        for j in first[1::2]:
            c.service.cancel(j)
        _until(c, lambda: all(c.state(j).terminal for j in first[1::2]), T0 + 1, "the cancelled jobs to end")
        later = [c.submit(gpus=2, priority="low") for _ in range(3)]
        c.tick_at(T0 + 1000)  # the newest jobs (least work lost, the cheapest victims): one per node
        assert [_nodes_of(c, j) for j in later] == [{"n1": 2}, {"n2": 2}, {"n3": 2}]
        with api_client(c.service) as api:
            high = _submit(api, gpus=6, priority="high", name="six")
            _until(c, lambda: c.state(high) is JobState.RUNNING, T0 + 2000, "the 6-GPU job to start")
            assert api.get(f"/v1/jobs/{high}").json()["state"] == "running"
        assert sorted(_nodes_of(c, high).values()) == [2, 4]
        lows = [*first[0::2], *later]
        assert len(_preempted(c, lows)) == 3
    finally:
        c.close()


def test_a_gang_over_exactly_two_nodes_preempts_one_low_job_on_each(tmp_path: Path) -> None:
    """Measured: a job with `--nodes 2` never preempted (the same job without it did); it waited
    for free nodes for ever. Now it takes the cheapest job on each of two nodes."""
    c = make_cluster(tmp_path, gpus=2, nodes=2, default_command=["train"])
    c.fake.exit_on_signal[int(signal.SIGTERM)] = 143
    try:
        lows = [c.submit(gpus=1, priority="low") for _ in range(4)]
        c.tick_at(T0)
        assert all(c.state(j) is JobState.RUNNING for j in lows)
        with api_client(c.service) as api:
            high = _submit(api, gpus=2, nodes=2, priority="high", name="gang")
            c.tick_at(T0 + 10)
            waiting = api.get(f"/v1/jobs/{high}").json()
            assert waiting["wait_reason"] == "preempting", waiting
            _until(c, lambda: c.state(high) is JobState.RUNNING, T0 + 11, "the gang to start")
        assert _nodes_of(c, high) == {"n1": 1, "n2": 1}
        victims = _preempted(c, lows)
        assert len(victims) == 2 and {next(iter(_first_node(c, v))) for v in victims} == {"n1", "n2"}
        assert all(c.state(v) is JobState.QUEUED for v in victims)  # requeued, waiting for GPUs
    finally:
        c.close()


def _first_node(c: Cluster, job_id: int) -> set[str]:
    """The node of the job's first start, from its event ("started on n1 GPUs 0")."""
    started = next(e.reason for e in c.store.events(job_id) if e.state is JobState.RUNNING)
    return {started.split(" on ", 1)[1].split()[0]}
