"""The head loop and the API when the database's lease is lost or the database is unreachable.

A real store (SQLite, PostgreSQL), the real loop (`Head.run` on its thread) and the real app in
process; the fake executor stands for the jobs, so what the head does to them is visible.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.core.states import JobState
from gpucluster.store import Store
from gpucluster.store.lease import Holder
from tests.e2e.headproc import wait_for
from tests.pgserver import PostgresServer

from .headkit import Cluster, api_client, make_cluster

STORE_BACKENDS = ("sqlite", "postgresql")  # tests/unit/conftest.py
WAIT_S = 30.0  # generous: the loop cycles every 0.1 s; a head that never reacts fails the wait, not the run


@pytest.fixture
def running_head(tmp_path: Path, store_target: Path | str) -> Iterator[tuple[Cluster, threading.Thread]]:
    cluster = make_cluster(tmp_path, store_target=store_target)
    loop = threading.Thread(target=cluster.head.run, name="head-loop", daemon=True)
    try:
        yield cluster, loop
    finally:
        cluster.head.stop()
        if loop.is_alive():
            loop.join(10)
        cluster.close()


def test_a_head_that_lost_the_lease_stops_scheduling_touches_no_job_and_says_why(
    running_head: tuple[Cluster, threading.Thread], store_target: Path | str
) -> None:
    cluster, loop = running_head
    cluster.store.claim(Holder("host-a", 1111, "/a"), duration_s=0.3)
    api = api_client(cluster.service)
    ran = cluster.submit(gpus=8)
    cluster.tick_at(cluster.clock.t)
    assert cluster.state(ran) is JobState.RUNNING
    waiting = cluster.submit(gpus=8)
    stopped = threading.Event()
    cluster.head.on_lease_lost = stopped.set
    other = Store(store_target)  # a second head, after the first stopped renewing
    try:
        assert other.claim(Holder("host-b", 2222, "/b"), duration_s=600).epoch == 2
        cluster.fake.finish(ran, 0)  # the job ends: only the lease's holder may record that
        loop.start()
        wait_for(lambda: cluster.head.lease_lost is not None, WAIT_S, 0.02, "the head to notice it lost the lease")
        assert stopped.is_set()
        health = api.get("/v1/health")
        assert health.status_code == 503, health.text
        body = health.json()
        assert body["status"] == "degraded" and "no longer holds the database's lease" in body["problem"]
        assert body["error"] == body["problem"] and "host-b" in body["error"]
        submit = api.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
        assert submit.status_code == 503 and "no longer holds the database's lease" in submit.json()["error"]
        assert api.post(f"/v1/jobs/{waiting}/cancel").status_code == 503
        assert api.get(f"/v1/jobs/{ran}").status_code == 200  # reads still answer
        cycles = cluster.head.cycles
        cluster.head.wake.set()
        loop.join(0.5)  # a few cycles' worth: none runs
        assert cluster.head.cycles == cycles
        # Nothing was touched: the ended job is the other head's to record, the queued one to start.
        assert [(j.id, j.state) for j in other.list_jobs()] == [(ran, JobState.RUNNING), (waiting, JobState.QUEUED)]
        assert other.get_job(ran).reason.startswith("started")  # type: ignore[union-attr]
    finally:
        other.close()


@pytest.mark.backends("postgresql")
def test_a_database_outage_is_503_json_and_the_loop_resumes_by_itself(
    tmp_path: Path, private_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(tmp_path, store_target=private_postgres.create_database())
    loop = threading.Thread(target=cluster.head.run, name="head-loop", daemon=True)
    try:
        cluster.store.claim(Holder("host-a", 1111, "/a"), duration_s=600)
        api = api_client(cluster.service)
        before = cluster.submit(gpus=1)
        loop.start()
        wait_for(lambda: cluster.state(before) is JobState.RUNNING, WAIT_S, 0.02, "the first job to start")
        private_postgres.shutdown()
        for call in (
            lambda: api.get("/v1/health"),
            lambda: api.get("/v1/jobs"),
            lambda: api.post("/v1/jobs", json={"command": ["true"], "gpus": 1}),
        ):
            r = call()
            assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text
            assert r.json()["error"].startswith("database unavailable: "), r.text
        wait_for(
            lambda: (cluster.head.last_error or "").startswith("database"), WAIT_S, 0.02, "the loop to see the outage"
        )
        assert cluster.head.outage_retry_s > 0
        private_postgres.start_again()
        wait_for(
            lambda: cluster.head.last_error is None and cluster.head.outage_retry_s == 0,
            WAIT_S,
            0.02,
            "the loop to resume",
        )
        assert api.get("/v1/health").status_code == 200
        after = api.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
        assert after.status_code == 201, after.text
        started = lambda: cluster.state(after.json()["id"]) is not JobState.QUEUED  # noqa: E731
        wait_for(started, WAIT_S, 0.02, "a job submitted after the outage to start")
        assert cluster.state(before) is JobState.RUNNING  # the outage changed nothing about it
        assert not [r for r in caplog.records if r.exc_info], "no traceback in the log"
        assert cluster.store.integrity_problems() == []
    finally:
        cluster.head.stop()
        if loop.is_alive():
            loop.join(10)
        cluster.close()


@pytest.mark.parametrize(
    ("value", "says"),
    [("1s", "--lease must be between 3s and 10m, not 1s"), ("2h", "--lease must be between 3s and 10m, not 2h")],
)
def test_a_lease_out_of_range_is_one_clear_line(tmp_path: Path, value: str, says: str) -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "gpucluster.cli.main", "up", "--data-dir", str(tmp_path), "--lease", value],
        capture_output=True,
        text=True,
        timeout=60,  # refused before anything starts; a head that started instead would hang here
    )
    assert r.returncode == 1 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
