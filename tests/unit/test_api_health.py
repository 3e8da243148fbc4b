from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from gpucluster.api.app import create_app
from gpucluster.executors.fake import FakeExecutor
from gpucluster.head.loop import Head
from gpucluster.head.paths import DataDir
from gpucluster.head.service import ClusterService
from gpucluster.store import Store


def test_health_is_503_with_the_reason_when_the_scheduling_loop_fails(tmp_path: Path) -> None:
    now = [1000.0]
    head = Head(
        store=Store(tmp_path / "s.db"), executor=FakeExecutor(), data_dir=DataDir(tmp_path), clock=lambda: now[0]
    )
    service = ClusterService(head)
    try:
        client = TestClient(create_app(service))
        head.last_cycle_at = now[0]
        ok = client.get("/v1/health")
        assert ok.status_code == 200 and ok.json()["status"] == "ok"
        head.last_error = "AttributeError: boom"
        bad = client.get("/v1/health")
        assert bad.status_code == 503 and bad.json()["problem"] == "AttributeError: boom"
        head.last_error = None
        now[0] += 60  # the loop stopped cycling
        stalled = client.get("/v1/health")
        assert stalled.status_code == 503 and "no scheduling cycle for 60 s" in stalled.json()["problem"]
    finally:
        service.close()
