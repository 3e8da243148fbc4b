"""Small builders for the core's value types, so tests state only what matters to them.

job(1).gpus(8).gpu_type("H100").priority("high").at(10.0).build()   -> JobRequest
node("n1").gpus(8, "H100").build()                                  -> Node
node("mixed").gpus(4, "H100").gpus(4, "A100").build()               -> Node, indices 0..7
snapshot(nodes=[...], running=[running(7, "n1", 0, 1)], queued=[...]) -> Snapshot
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, Gpu, JobRequest, Node, NodeSlice, Priority, RunningJob
from gpucluster.models import JobSpec


class JobBuilder:
    def __init__(self, job_id: int) -> None:
        self._job_id = job_id
        self._gpus = 1
        self._gpu_type: str | None = None
        self._priority = Priority.NORMAL
        self._submitted_at = float(job_id)
        self._team = "default"

    def gpus(self, n: int) -> JobBuilder:
        self._gpus = n
        return self

    def gpu_type(self, model: str | None) -> JobBuilder:
        self._gpu_type = model
        return self

    def priority(self, p: str | Priority) -> JobBuilder:
        self._priority = Priority.parse(p) if isinstance(p, str) else p
        return self

    def at(self, submitted_at: float) -> JobBuilder:
        self._submitted_at = submitted_at
        return self

    def team(self, team: str) -> JobBuilder:
        self._team = team
        return self

    def build(self) -> JobRequest:
        return JobRequest(
            job_id=self._job_id,
            gpus=self._gpus,
            gpu_type=self._gpu_type,
            priority=self._priority,
            submitted_at=self._submitted_at,
            team=self._team,
        )


def job(job_id: int) -> JobBuilder:
    """A queued job; by default 1 untyped GPU, normal priority, submitted at t=job_id."""
    return JobBuilder(job_id)


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._gpus: list[Gpu] = []

    def gpus(self, count: int, model: str = "H100", memory_mb: int = 81920) -> NodeBuilder:
        """Add `count` GPUs of `model`; indices continue after the GPUs already added."""
        start = len(self._gpus)
        for i in range(start, start + count):
            self._gpus.append(Gpu(index=i, model=model, memory_mb=memory_mb, uuid=f"GPU-{self._name}-{i}"))
        return self

    def build(self) -> Node:
        return Node(self._name, tuple(self._gpus))


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def running(job_id: int, node_name: str, *indices: int) -> RunningJob:
    """A running job holding `indices` on `node_name`."""
    return RunningJob(job_id, allocation(node_name, *indices))


def allocation(node_name: str, *indices: int) -> Allocation:
    return Allocation((NodeSlice(node_name, tuple(indices)),))


def snapshot(
    nodes: Iterable[Node | NodeBuilder] = (),
    running: Iterable[RunningJob] = (),
    queued: Iterable[JobRequest | JobBuilder] = (),
) -> Snapshot:
    """A Snapshot; builders are built for you."""
    return Snapshot(
        nodes=tuple(n.build() if isinstance(n, NodeBuilder) else n for n in nodes),
        running=tuple(running),
        queued=tuple(q.build() if isinstance(q, JobBuilder) else q for q in queued),
    )


def spec(**fields: Any) -> JobSpec:
    """A valid JobSpec (command ["true"] unless given), validated like a user's submission."""
    fields.setdefault("command", ["true"])
    return JobSpec.model_validate(fields)
