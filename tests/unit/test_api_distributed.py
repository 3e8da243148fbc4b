"""The HTTP side of issue 4: requeue, progress reports, per-rank logs, attempts in the Job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpucluster.executors.base import Exited
from gpucluster.executors.fake import FakeExecutor
from gpucluster.head.loop import Head
from gpucluster.head.paths import DataDir
from gpucluster.head.service import ClusterService
from gpucluster.store import Store

from .builders import node
from .headkit import api_client


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Head, FakeExecutor]]:
    store = Store(tmp_path / "s.db")
    store.put_node(node("n1").gpus(8, "H100").build(), virtual=True, now=1000.0)
    fake = FakeExecutor()
    head = Head(store=store, executor=fake, data_dir=DataDir(tmp_path), clock=lambda: 1000.0, base_env={})
    service = ClusterService(head)
    try:
        yield api_client(service), head, fake
    finally:
        service.close()
        store.close()


def test_requeue_progress_and_attempts_over_http(api: tuple[TestClient, Head, FakeExecutor]) -> None:
    client, head, fake = api
    job = client.post("/v1/jobs", json={"command": ["python", "t.py"], "gpus": "2..4", "per_gpu": True}).json()
    assert (job["spec"]["gpus"], job["spec"]["min_gpus"], job["spec"]["per_gpu"]) == (4, 2, True)
    jid = job["id"]
    r = client.post(f"/v1/jobs/{jid}/requeue")
    assert r.status_code == 409 and "only a running job can be requeued" in r.json()["error"]
    assert client.post(f"/v1/jobs/{jid}/progress", json={"step": 1}).status_code == 409
    head.tick()

    assert client.post(f"/v1/jobs/{jid}/progress", json={"step": 10, "checkpoint_at": 990.0}).status_code == 204
    bad = client.post(f"/v1/jobs/{jid}/progress", json={"step": -1})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "step"
    assert client.post("/v1/jobs/99/progress", json={"step": 1}).status_code == 404
    shown = client.get(f"/v1/jobs/{jid}").json()
    assert shown["progress"]["step"] == 10 and shown["progress"]["checkpoint_at"] == 990.0
    assert [(a["attempt"], a["outcome"], a["gpus"]) for a in shown["attempts"]] == [(1, "running", 4)]
    assert client.get("/v1/jobs").json()["jobs"][0]["attempts"] == []  # only in a job's own detail

    assert client.post(f"/v1/jobs/{jid}/requeue").status_code == 200
    head.tick()
    fake.finish(jid, 79)
    head.tick()
    shown = client.get(f"/v1/jobs/{jid}").json()
    assert shown["attempt"] == 2
    first = shown["attempts"][0]
    assert (first["outcome"], first["exit_codes"], first["reason"]) == (
        "preempted",
        [79, 79, 79, 79],
        "requeued by user (exit code 79 on all 4 ranks)",
    )
    assert client.get(f"/v1/jobs/{jid}/logs", params={"rank": 1}).status_code == 200
    fake.end_rank(jid, 0, Exited(0))
    assert client.get(f"/v1/jobs/{jid}/logs", params={"rank": -1}).status_code == 422
