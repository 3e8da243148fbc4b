"""Preemption victims for a job limited to some nodes (its node selection, core/selection.py).

Why beside `preempt.py` and not inside it: `choose_victims`'s fast paths count free GPUs over
every node (buckets, totals); a job that may use only some nodes must count only those, freed
or free. Jobs with a selection are few, so this is the plain search without the fast paths:
the same ranking, prefix and pruning (`preempt_shapes.prefix`), limited to the allowed nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from gpucluster.core.placement import Capacity
from gpucluster.core.preempt import CostKey, Guarantees, VictimChoice
from gpucluster.core.preempt_shapes import prefix
from gpucluster.core.types import JobRequest, RunningJob


def _gpus_on(job: RunningJob, model: str, cap: Capacity, nodes: Collection[str]) -> dict[str, int]:
    """The job's whole GPUs of `model` per node, on `nodes` only."""
    out: dict[str, int] = {}
    for s in job.allocation.slices:
        if s.node in nodes and s.share >= 1 and cap.gpus[(s.node, s.gpu_indices[0])].model == model:
            out[s.node] = out.get(s.node, 0) + len(s.gpu_indices)
    return out


def choose_victims_on(
    job: JobRequest,
    model: str,
    cap: Capacity,
    candidates: Sequence[RunningJob],
    stopping: Sequence[RunningJob],
    cost: Callable[[RunningJob], CostKey],
    nodes: Collection[str],
    guarantees: Guarantees | None = None,
) -> VictimChoice | None:
    """`preempt.choose_victims` (candidates ranked already) for a job that may run on `nodes` only."""
    n = int(job.gpus)
    free = cap.free[model]
    if n > cap.node_size[model] or job.nodes:
        if job.nodes:
            return None  # exact node counts are not preempted for; they wait for free nodes
        have = sum(len(free.get(nd, ())) for nd in nodes)
        have += sum(sum(_gpus_on(j, model, cap, nodes).values()) for j in stopping)
        if have >= n:
            return VictimChoice((), None)
        pairs = [(j, sum(_gpus_on(j, model, cap, nodes).values())) for j in candidates]
        chosen = prefix(pairs, have, n, guarantees)
        return None if chosen is None else VictimChoice(tuple(chosen), None)
    releasing: dict[str, int] = {}
    for j in stopping:
        for nd, g in _gpus_on(j, model, cap, nodes).items():
            releasing[nd] = releasing.get(nd, 0) + g
    by_node: dict[str, list[tuple[RunningJob, int]]] = {}
    for j in candidates:
        for nd, g in _gpus_on(j, model, cap, nodes).items():
            by_node.setdefault(nd, []).append((j, g))
    best: tuple[int, list[CostKey], str, list[RunningJob]] | None = None
    for node in sorted(set(by_node) | set(releasing)):
        if cap.node_model_count.get((node, model), 0) < n:
            continue
        have = len(free.get(node, ())) + releasing.get(node, 0)
        if have >= n:
            return VictimChoice((), node)
        chosen = prefix(by_node.get(node, []), have, n, guarantees)
        if chosen is None:
            continue
        key = (len(chosen), sorted(cost(j) for j in chosen), node, chosen)
        if best is None or key[:3] < best[:3]:
            best = key
    return None if best is None else VictimChoice(tuple(best[3]), best[2])
