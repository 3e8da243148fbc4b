"""Reservations for EASY backfill: when the first job in line for a GPU model will start.

The job first in line that cannot start gets a reservation: the earliest time (its shadow
time) and the nodes on which enough GPUs will be free, from the running jobs' expected ends
(start + time limit, or the policy's default). A later job may start before it only if it
ends before the shadow time or keeps off the reserved nodes, so backfill never delays it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpucluster.core.placement import Capacity
from gpucluster.core.types import Gpu, JobRequest, RunningJob


@dataclass(frozen=True)
class Reservation:
    job_id: int
    model: str
    shadow: float  # estimated start of the reserved job
    nodes: frozenset[str]


class EndTimes:
    """When each running job's GPUs are expected back, per (model, node); per model on demand."""

    def __init__(self) -> None:
        self.by_node: dict[tuple[str, str], list[tuple[float, int]]] = {}
        self._by_model: dict[str, list[tuple[float, int]]] | None = None

    def add(self, model: str, node: str, end: float, gpus: int) -> None:
        self.by_node.setdefault((model, node), []).append((end, gpus))
        self._by_model = None

    def add_running(
        self,
        running: Iterable[RunningJob],
        gpus: Mapping[tuple[str, int], Gpu],
        now: float,
        grace: float,
        default: float,
    ) -> list[tuple[RunningJob, float]]:
        """`add` for every whole GPU of the running jobs: expected back at start + time limit
        (`default` for none), or after the grace period for a job stopping, never before
        `now`. Returns the jobs holding a share of a GPU, with their end, for the caller (a
        shared GPU comes back when its last sharer ends). One loop with no call per job: it
        runs over every running job each cycle a job is first in line."""
        by_node = self.by_node
        shared: list[tuple[RunningJob, float]] = []
        for j in running:
            end = now + grace if j.stopping else j.started_at + (j.time_limit_s or default)
            if end < now:
                end = now
            slices = j.allocation.slices
            if not (slices[0].share >= 1 if len(slices) == 1 else all(s.share >= 1 for s in slices)):
                shared.append((j, end))
                continue
            for s in slices:
                node = s.node
                key = (gpus[(node, s.gpu_indices[0])].model, node)
                items = by_node.get(key)
                if items is None:
                    by_node[key] = [(end, len(s.gpu_indices))]
                else:
                    items.append((end, len(s.gpu_indices)))
        self._by_model = None
        return shared

    def for_model(self, model: str) -> list[tuple[float, int]]:
        """Every (end, GPUs) of `model`, in no particular order (callers sort)."""
        if self._by_model is None:
            by_model: dict[str, list[tuple[float, int]]] = {}
            for (m, _), items in self.by_node.items():
                by_model.setdefault(m, []).extend(items)
            self._by_model = by_model
        return self._by_model.get(model, [])


def reserve(job: JobRequest, model: str, cap: Capacity, ends: EndTimes, now: float) -> Reservation | None:
    """The reservation for `job` on `model`, or None if running jobs alone never free enough."""
    n = int(job.gpus)
    if job.nodes or n > cap.node_size[model]:
        free = cap.free_count(model)
        for end, gpus in sorted(ends.for_model(model)):
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
