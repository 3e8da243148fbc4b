"""A head driven by hand: real store, fake executor, a clock the test moves. Shared by the
head's unit tests so each only states the settings it cares about."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gpucluster.api.app import create_app
from gpucluster.auth.control import AccessControl
from gpucluster.core.states import JobState
from gpucluster.executors.fake import FakeExecutor, FakeProcess
from gpucluster.head.loop import Head
from gpucluster.head.paths import DataDir
from gpucluster.head.service import ClusterService
from gpucluster.store import JobRecord, Store

from .builders import node, spec

T0 = 1000.0


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


@dataclass
class Cluster:
    store: Store
    fake: FakeExecutor
    head: Head
    service: ClusterService
    clock: Clock
    data_dir: DataDir
    tmp: Path
    default_command: list[str] | None = None

    def submit(self, **fields: object) -> int:
        if self.default_command is not None:
            fields.setdefault("command", self.default_command)
        return self.service.submit(spec(**fields)).id

    def record(self, job_id: int) -> JobRecord:
        r = self.store.get_job(job_id)
        assert r is not None
        return r

    def state(self, job_id: int) -> JobState:
        return self.record(job_id).state

    def proc(self, job_id: int, attempt: int = 1) -> FakeProcess:
        return self.fake.processes[(job_id, attempt)]

    def tick_at(self, t: float) -> None:
        self.clock.t = t
        self.head.tick()

    def close(self) -> None:
        self.service.close()
        self.store.close()


def make_cluster(
    tmp_path: Path,
    gpus: int = 8,
    default_command: list[str] | None = None,
    store_target: Path | str | None = None,
    nodes: int = 1,
    **head: Any,
) -> Cluster:
    """`nodes` nodes `n1`, `n2`, ... with `gpus` H100s each; `head` keywords go to Head (policy,
    grace_period_s, ...). `store_target`: the store's file or PostgreSQL URL (default: state.db
    in tmp_path)."""
    store = Store(store_target or tmp_path / "state.db")
    for i in range(1, nodes + 1):
        store.put_node(node(f"n{i}").gpus(gpus, "H100").build(), virtual=True, now=T0)
    fake = FakeExecutor()
    clock = Clock()
    data_dir = DataDir(tmp_path)
    head.setdefault("base_env", {"HOME": "/h"})
    h = Head(store=store, executor=fake, data_dir=data_dir, clock=clock, **head)
    return Cluster(store, fake, h, ClusterService(h), clock, data_dir, tmp_path, default_command)


def closing_cluster(tmp_path: Path, **kwargs: Any) -> Iterator[Cluster]:
    """`make_cluster` for a fixture: the cluster, closed after the test."""
    c = make_cluster(tmp_path, **kwargs)
    try:
        yield c
    finally:
        c.close()


def api_client(service: ClusterService, user: str = "admin") -> TestClient:
    """A TestClient of the service's API with a cluster admin's token (created on first use)."""
    access = AccessControl(service.store, service.head.clock, run_as_submitter=False)  # nothing really runs
    token = access.bootstrap(user, None)
    if token is None:
        token, _ = access.issue_token(user, None, "test")
    return TestClient(create_app(service, access), headers={"Authorization": f"Bearer {token}"})
