"""Reservations for EASY backfill: when the first job in line for a GPU model will start.

The job first in line that cannot start gets a reservation: the earliest time (its shadow
time) and the nodes on which enough GPUs will be free, from the running jobs' expected ends
(start + time limit, or the policy's default). A later job may start before it only if it
ends before the shadow time or keeps off the reserved nodes, so backfill never delays it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.core.placement import Capacity
from gpucluster.core.types import JobRequest


@dataclass(frozen=True)
class Reservation:
    job_id: int
    model: str
    shadow: float  # estimated start of the reserved job
    nodes: frozenset[str]


class EndTimes:
    """When each running job's GPUs are expected back, per (model, node)."""

    def __init__(self) -> None:
        self.by_node: dict[tuple[str, str], list[tuple[float, int]]] = {}
        self.by_model: dict[str, list[tuple[float, int]]] = {}

    def add(self, model: str, node: str, end: float, gpus: int) -> None:
        self.by_node.setdefault((model, node), []).append((end, gpus))
        self.by_model.setdefault(model, []).append((end, gpus))


def reserve(job: JobRequest, model: str, cap: Capacity, ends: EndTimes, now: float) -> Reservation | None:
    """The reservation for `job` on `model`, or None if running jobs alone never free enough."""
    n = int(job.gpus)
    if job.nodes or n > cap.node_size[model]:
        free = cap.free_count(model)
        for end, gpus in sorted(ends.by_model.get(model, [])):
            free += gpus
            if free >= n:
                nodes = frozenset(nd for nd, models in cap.node_models.items() if model in models)
                return Reservation(job.job_id, model, max(end, now), nodes)
        return None
    best: tuple[float, str] | None = None
    for node, idxs in cap.free[model].items():
        free = len(idxs)
        if free >= n:
            continue  # excluded by another reservation, or refused by quota: not a place to hold
        for end, gpus in sorted(ends.by_node.get((model, node), [])):
            free += gpus
            if free >= n:
                if best is None or (end, node) < best:
                    best = (end, node)
                break
    if best is None:
        return None
    return Reservation(job.job_id, model, max(best[0], now), frozenset({best[1]}))
