"""The head learns run times from its finished jobs (head/runtime_model.py, store/runs.py): a
job like earlier finished ones gets their run time in its estimate and in GET /v1/jobs/{id}.
A real store file, the real API over a test client, a fake executor and an injected clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.core.start_interval import WaitCalibration
from gpucluster.head.runtime_model import RuntimeModel
from gpucluster.store.runs import finished_runs

from .headkit import T0, Cluster, api_client, make_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def run_three(cluster: Cluster, seconds: float) -> float:
    """Three 8-GPU `train` jobs with a 1 h limit, each finished after `seconds`; the time after."""
    t = T0
    for _ in range(3):
        job = cluster.submit(gpus=8, name="train", time_limit="1h")
        cluster.tick_at(t)
        assert cluster.state(job).value == "running"
        t += seconds
        cluster.fake.finish(job, 0)
        cluster.tick_at(t)
        assert cluster.state(job).value == "succeeded"
    return t


def test_a_similar_job_is_estimated_with_the_learned_run_time(cluster: Cluster) -> None:
    t = run_three(cluster, 100.0)
    running = cluster.submit(gpus=8, name="train", time_limit="1h")
    cluster.tick_at(t)
    waiting = cluster.submit(gpus=8, name="train", time_limit="1h")
    other = cluster.submit(gpus=8, name="never-seen", time_limit="1h", team="nlp", priority="low")
    cluster.tick_at(t + 1)
    assert cluster.state(running).value == "running"
    # `running` is expected to end after 100 s, not its 1 h limit; `waiting` runs 100 s too,
    # then `other`, another team's with no history, waits for that.
    assert cluster.record(waiting).estimated_start == pytest.approx(t + 100)
    assert cluster.record(other).estimated_start == pytest.approx(t + 200)
    body = api_client(cluster.service).get(f"/v1/jobs/{waiting}").json()
    assert body["expected_run"]["seconds"] == pytest.approx(100)
    assert body["expected_run"]["samples"] == 3
    assert body["expected_run"]["sentence"].startswith("expected to run ~2 m (from 3 similar jobs")
    unknown = api_client(cluster.service).get(f"/v1/jobs/{other}").json()["expected_run"]
    assert (unknown["samples"], unknown["seconds"]) == (0, 3600)


def test_without_history_estimates_still_assume_time_limits(cluster: Cluster) -> None:
    cluster.submit(gpus=8, name="train", time_limit="10m")
    cluster.tick_at(T0)
    waiting = cluster.submit(gpus=8, name="train", time_limit="10m")
    cluster.tick_at(T0 + 1)
    assert cluster.record(waiting).estimated_start == T0 + 600


def test_the_model_learns_incrementally_and_a_new_one_from_the_store(cluster: Cluster) -> None:
    model = RuntimeModel(cluster.store)
    assert model.refresh() == 0
    t = run_three(cluster, 50.0)
    assert model.refresh() == 3
    assert model.refresh() == 0  # nothing new: nothing read twice
    rows = finished_runs(cluster.store, None, 10)
    assert [r.run_s for r in rows] == [50.0, 50.0, 50.0]
    assert rows[0].name == "train" and rows[0].time_limit_s == 3600
    cancelled = cluster.submit(gpus=8, name="train", time_limit="1h")
    cluster.tick_at(t)
    cluster.service.cancel(cancelled)  # cancels say nothing of how long the work takes
    cluster.tick_at(t + 5)
    cluster.fake.finish(cancelled, 143, stopped=True)
    cluster.tick_at(t + 10)
    assert model.refresh() == 0


def test_queue_shows_an_interval_once_starts_calibrate_it(cluster: Cluster) -> None:
    cluster.head.estimates.calibration = WaitCalibration(min_samples=2)
    t = run_three(cluster, 100.0)  # each started at once: no estimate, nothing to calibrate
    first = cluster.submit(gpus=8, name="train", time_limit="1h")
    cluster.tick_at(t)
    waiters = [cluster.submit(gpus=8, name="train", time_limit="1h") for _ in range(4)]
    cluster.tick_at(t + 1)
    assert cluster.head.estimates.intervals == {}  # no start seen yet
    for job in (first, *waiters[:2]):
        cluster.fake.finish(job, 0)
        t += 120  # each runs 120 s where 100 s was expected: starts are a little late
        cluster.tick_at(t)
        cluster.tick_at(t + 6)  # the next refresh
    entry = api_client(cluster.service).get("/v1/queue").json()["entries"][0]["job"]
    assert entry["id"] == waiters[3]
    assert entry["start_low"] is not None and entry["start_low"] <= entry["estimated_start"] <= entry["start_high"]


def test_a_job_renamed_while_queued_is_learned_under_its_new_name(cluster: Cluster) -> None:
    """The head learns a finished job under the workload it already read while the job waited
    (its spec is not parsed again at its end), so a rename (`gpucluster update --name`) must be
    read again: three `train` jobs renamed `tune` while queued are learned as `tune` runs."""
    api = api_client(cluster.service)
    t = T0
    for _ in range(3):
        filler = cluster.submit(gpus=8, name="filler", time_limit="1h")
        cluster.tick_at(t)
        renamed = cluster.submit(gpus=8, name="train", time_limit="1h")
        cluster.tick_at(t + 1)  # its workload ("train") is read while it waits
        answer = api.patch(f"/v1/jobs/{renamed}", json={"name": "tune"})
        assert answer.status_code == 200, answer.text
        cluster.fake.finish(filler, 0)
        cluster.tick_at(t + 2)
        assert cluster.state(renamed).value == "running"
        cluster.fake.finish(renamed, 0)
        t += 202
        cluster.tick_at(t)
        assert cluster.state(renamed).value == "succeeded"
    blocker = cluster.submit(gpus=8, name="filler", time_limit="1h")
    cluster.tick_at(t)
    assert cluster.state(blocker).value == "running"
    waiting = {name: cluster.submit(gpus=8, name=name, time_limit="1h") for name in ("train", "tune")}
    cluster.tick_at(t + 1)
    runs = {name: api.get(f"/v1/jobs/{job}").json()["expected_run"] for name, job in waiting.items()}
    assert (runs["tune"]["samples"], runs["tune"]["seconds"]) == (3, pytest.approx(200.0)), runs
    assert runs["train"]["basis"] != runs["tune"]["basis"], runs  # no run was learned as `train`


def test_a_known_jobs_command_is_not_read_again(cluster: Cluster) -> None:
    run_three(cluster, 10.0)
    ids = [r.job_id for r in finished_runs(cluster.store, None, 10)]
    rows = finished_runs(cluster.store, None, 10, known={ids[0]})
    assert rows[0].command is None and all(r.command is not None for r in rows[1:])
