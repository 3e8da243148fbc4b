"""The head records an estimated start for every waiting job, and the queue API shows them in
scheduling order: a real store file, the real API over a test client, a fake executor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.head.estimates import EstimateRefresher
from gpucluster.waits_text import reason_text

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


def test_estimates_refresh_soon_after_a_change_and_every_few_seconds_without(cluster: Cluster) -> None:
    cluster.head.estimates = EstimateRefresher(every_s=5.0, min_gap_s=1.0)
    cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0)
    first = cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0 + 1)
    assert cluster.record(first).estimated_start == T0 + 600
    assert cluster.head.estimates.refreshes == 1  # counted for /metrics, with their CPU time
    late = cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0 + 1.5)  # planned for the submit, but the last replay is 0.5 s old
    assert cluster.record(late).estimated_start is None
    cluster.tick_at(T0 + 2.1)  # before the next periodic plan (T0 + 2.5): planned for the held-back replay
    assert cluster.record(late).estimated_start == T0 + 1200
    cluster.tick_at(T0 + 3.7)  # planned again, nothing changed: no replay before every_s
    cluster.tick_at(T0 + 6.5)
    assert cluster.head.estimates.refreshes == 2
    cluster.tick_at(T0 + 7.7)
    assert cluster.head.estimates.refreshes == 3 and cluster.head.estimates.cpu_s > 0


def test_a_cancelled_job_moves_the_jobs_behind_it_up_at_the_next_plan(cluster: Cluster) -> None:
    """A queued job's cancel is a change the loop plans for (the queue cache says so), and the
    estimates are replayed for it; it used to wait for the periodic replay, up to 5 s."""
    cluster.head.estimates = EstimateRefresher(every_s=5.0, min_gap_s=1.0)
    cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0)
    first, second = (cluster.submit(gpus=8, time_limit="10m") for _ in range(2))
    cluster.tick_at(T0 + 1)
    assert cluster.record(second).estimated_start == T0 + 1200
    cluster.service.cancel(first)
    cluster.tick_at(T0 + 2.1)
    assert cluster.record(second).estimated_start == T0 + 600


def test_past_the_estimated_part_the_reason_says_not_before(cluster: Cluster) -> None:
    cluster.head.estimates = EstimateRefresher(limit=1)
    cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0)
    cluster.submit(gpus=8, time_limit="10m")
    second = cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0 + 1)
    r = cluster.record(second)
    assert r.estimated_start is None
    assert "starts no earlier than" in reason_text(r.reason) and "first 1 in line" in reason_text(r.reason)


def test_an_unchanged_wait_is_the_same_object_from_one_plan_to_the_next(cluster: Cluster) -> None:
    """Issue 15: at 100,000 queued, a new Wait per job each cycle, compared by value with the one
    written last, cost ten times `decide` (bench/bench_head_cycle.py). An equal wait is now the
    same object from plan to plan (exact estimates, estimates past the replayed part, a begin
    time), so the loop's comparison is an identity test, and nothing is rewritten."""
    cluster.head.estimates = EstimateRefresher(limit=1)
    cluster.submit(gpus=8, time_limit="10m")
    cluster.tick_at(T0)
    waiting = [cluster.submit(gpus=8, time_limit="10m") for _ in range(3)] + [cluster.submit(gpus=2, begin=T0 + 100)]
    cluster.tick_at(T0 + 1)
    before = dict(cluster.head._reasons)
    assert set(before) == set(waiting)
    assert before[waiting[0]].estimated_start == T0 + 600  # exact
    assert before[waiting[1]].facts.no_earlier_than is not None  # past the replayed part
    assert before[waiting[3]].estimated_start == T0 + 100  # its begin time
    cluster.tick_at(T0 + 2.5)  # the periodic plan: nothing changed
    after = cluster.head._reasons
    assert cluster.head._last_plan_at == T0 + 2.5
    assert [after[j] is before[j] for j in waiting] == [True] * 4


def test_a_begin_time_holds_the_job_says_so_and_is_its_estimate(cluster: Cluster) -> None:
    """`--begin`: not started before its time though GPUs are free; `why` names the time (not a
    backoff), the estimate is the begin time; at that time it starts. One already past runs now."""
    later = cluster.submit(gpus=2, begin=T0 + 100)
    past = cluster.submit(gpus=2, begin=T0 - 100)
    cluster.tick_at(T0 + 1)
    assert cluster.state(past).value == "running"
    r = cluster.record(later)
    assert (r.state.value, r.estimated_start) == ("queued", T0 + 100)
    assert r.wait_reason == "begin" and reason_text(r.reason).startswith("waits for its begin time "), reason_text(
        r.reason
    )
    cluster.tick_at(T0 + 99)
    assert cluster.state(later).value == "queued"
    cluster.tick_at(T0 + 100)
    assert cluster.state(later).value == "running"
    assert cluster.record(later).started_at == T0 + 100


def test_a_begin_time_more_than_a_year_ahead_is_refused_at_the_field(cluster: Cluster) -> None:
    r = api_client(cluster.service).post("/v1/jobs", json={"command": ["true"], "begin": T0 + 400 * 86400})
    assert r.status_code == 422, r.text
    assert "begin" in r.json()["error"] and "within a year" in r.json()["error"], r.text
