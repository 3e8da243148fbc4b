"""The head records an estimated start for every waiting job, and the queue API shows them in
scheduling order: a real store file, the real API over a test client, a fake executor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.head.estimates import EstimateRefresher

from .headkit import T0, Cluster, api_client, make_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_the_third_in_line_has_an_estimate_in_the_queue(cluster: Cluster) -> None:
    big = cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0)
    first, second, third = (cluster.submit(gpus=8, time_limit="10m") for _ in range(3))
    cluster.tick_at(T0 + 1)
    entries = api_client(cluster.service).get("/v1/queue").json()["entries"]
    assert [(e["position"], e["job"]["id"]) for e in entries] == [(1, first), (2, second), (3, third)]
    # big ends at T0+600 (its limit); each 10-minute job after the one before it.
    assert [e["job"]["estimated_start"] for e in entries] == [T0 + 600, T0 + 1200, T0 + 1800]
    assert entries[2]["job"]["wait_reason"] == "resources"
    assert cluster.state(big).value == "running"


def test_estimates_refresh_at_most_every_few_seconds(cluster: Cluster) -> None:
    cluster.head.estimates = EstimateRefresher(every_s=5.0)
    cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0)
    first = cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0 + 1)
    late = cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0 + 2)  # planned, but the estimates are 1 s old: not replayed yet
    assert cluster.record(first).estimated_start == T0 + 600
    assert cluster.record(late).estimated_start is None
    cluster.tick_at(T0 + 7)
    assert cluster.record(late).estimated_start == T0 + 1200


def test_past_the_estimated_part_the_reason_says_not_before(cluster: Cluster) -> None:
    cluster.head.estimates = EstimateRefresher(limit=1)
    cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0)
    cluster.submit(gpus=8, time_limit="10m")
    second = cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0 + 1)
    r = cluster.record(second)
    assert r.estimated_start is None
    assert "starts no earlier than" in r.reason and "first 1 in line" in r.reason
