"""Choosing preemption victims so that the preempting job loses others the least.

Candidates are preemptible jobs past their minimum runtime that either have a lower priority
class, or belong to a team borrowing GPUs that the preempting job's team is guaranteed. They are
ranked lowest class first, then furthest over fair share, then least work since their last
checkpoint. On each node the cheapest prefix that frees enough GPUs is taken and then pruned of
any victim not needed; the node needing the fewest, cheapest victims wins. Jobs already stopping
count as free GPUs first, so a job never asks for more victims while earlier ones are exiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpucluster.core.placement import Capacity
from gpucluster.core.types import JobRequest, RunningJob

CostKey = tuple[int, float, float, float]


@dataclass(frozen=True)
class VictimChoice:
    victims: tuple[RunningJob, ...]  # empty: enough GPUs are already being released
    node: str | None


def _whole_gpus(job: RunningJob, node: str | None, model: str, cap: Capacity) -> int:
    return sum(
        len(s.gpu_indices)
        for s in job.allocation.slices
        if (node is None or s.node == node) and s.share >= 1 and cap.gpus[(s.node, s.gpu_indices[0])].model == model
    )


def choose_victims(
    job: JobRequest,
    model: str,
    cap: Capacity,
    candidates: Sequence[RunningJob],
    stopping: Sequence[RunningJob],
    cost: Callable[[RunningJob], CostKey],
) -> VictimChoice | None:
    """The victims that make room for `job` on `model`, or None if no set of candidates does.

    `candidates` must already be limited to jobs on `model`; only nodes holding candidates,
    stopping jobs or free GPUs are looked at, so the cost is O(candidates + such nodes).
    """
    n = int(job.gpus)
    ranked = sorted(candidates, key=cost)
    if n > cap.node_size[model] or job.nodes:
        if job.nodes:
            return None  # exact node counts are not preempted for; they wait for free nodes
        have = cap.free_count(model) + sum(_whole_gpus(j, None, model, cap) for j in stopping)
        if have >= n:
            return VictimChoice((), None)
        chosen = _prefix(ranked, have, n, lambda j: _whole_gpus(j, None, model, cap))
        return None if chosen is None else VictimChoice(tuple(chosen), None)

    by_node: dict[str, list[RunningJob]] = {}
    for j in ranked:
        for nd in dict.fromkeys(s.node for s in j.allocation.slices):
            by_node.setdefault(nd, []).append(j)
    releasing: dict[str, int] = {}
    for j in stopping:
        for s in j.allocation.slices:
            if s.share >= 1 and cap.gpus[(s.node, s.gpu_indices[0])].model == model:
                releasing[s.node] = releasing.get(s.node, 0) + len(s.gpu_indices)
    best: tuple[int, list[CostKey], str, list[RunningJob]] | None = None
    for node in sorted(set(by_node) | set(releasing)):
        if cap.node_model_count.get((node, model), 0) < n:
            continue
        have = len(cap.free[model].get(node, [])) + releasing.get(node, 0)
        if have >= n:
            return VictimChoice((), node)
        chosen = _prefix(by_node.get(node, []), have, n, lambda j, nd=node: _whole_gpus(j, nd, model, cap))  # type: ignore[misc]
        if chosen is None:
            continue
        key = (len(chosen), sorted(cost(j) for j in chosen), node, chosen)
        if best is None or key[:3] < best[:3]:
            best = key
    return None if best is None else VictimChoice(tuple(best[3]), best[2])


def _prefix(
    ranked: Sequence[RunningJob], have: int, need: int, gpus_of: Callable[[RunningJob], int]
) -> list[RunningJob] | None:
    chosen: list[RunningJob] = []
    for j in ranked:
        g = gpus_of(j)
        if g == 0:
            continue
        chosen.append(j)
        have += g
        if have >= need:
            break
    if have < need:
        return None
    # Prune: drop the most expensive victims that turn out not to be needed.
    for j in reversed(list(chosen)):
        g = gpus_of(j)
        if have - g >= need:
            chosen.remove(j)
            have -= g
    return chosen
