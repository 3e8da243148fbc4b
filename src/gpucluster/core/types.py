"""Frozen value types shared by the core, the store, the head and the simulator.

They carry no behaviour that needs I/O; the wire format (pydantic) lives in `gpucluster.models`
so the core stays importable without FastAPI or pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from gpucluster.core.states import JobState


class Priority(IntEnum):
    """Priority classes; a larger value is scheduled first."""

    LOW = 0
    NORMAL = 1
    HIGH = 2

    @classmethod
    def parse(cls, name: str) -> Priority:
        try:
            return cls[name.upper()]
        except KeyError:
            allowed = ", ".join(p.name.lower() for p in cls)
            raise ValueError(f"unknown priority {name!r}; allowed: {allowed}") from None

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Gpu:
    index: int
    model: str
    memory_mb: int
    uuid: str


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]

    def gpu_models(self) -> frozenset[str]:
        return frozenset(g.model for g in self.gpus)


@dataclass(frozen=True)
class NodeSlice:
    """The GPUs one job holds on one node."""

    node: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Allocation:
    """Where a job runs: one slice per node (a single slice until multi-node jobs exist)."""

    slices: tuple[NodeSlice, ...]

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpu_indices) for s in self.slices)

    def gpu_keys(self) -> frozenset[tuple[str, int]]:
        return frozenset((s.node, i) for s in self.slices for i in s.gpu_indices)


@dataclass(frozen=True)
class JobRequest:
    """What the scheduler needs to know about a queued job: its demand and its place in line."""

    job_id: int
    gpus: int
    gpu_type: str | None
    priority: Priority
    submitted_at: float
    team: str = "default"


@dataclass(frozen=True)
class RunningJob:
    job_id: int
    allocation: Allocation


@dataclass(frozen=True)
class Start:
    job_id: int
    allocation: Allocation


@dataclass(frozen=True)
class Plan:
    """The scheduler's answer for one cycle: jobs to start now, and why every other job waits."""

    starts: tuple[Start, ...] = ()
    waiting: dict[int, str] = field(default_factory=dict)


__all__ = [
    "Allocation",
    "Gpu",
    "JobRequest",
    "JobState",
    "Node",
    "NodeSlice",
    "Plan",
    "Priority",
    "RunningJob",
    "Start",
]
