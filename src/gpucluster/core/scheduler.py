"""`decide(snapshot, now) -> Plan`: priority, then first come first served, on whole GPUs.

The ordering is strict within a GPU pool: a job that cannot start holds back later jobs that
would compete for the same GPU models, so a large job is never starved by a stream of small
ones. Jobs that need other GPU models pass it. Backfill, fair share, quotas and preemption are
the full scheduler's job (issue 3) and slot in here without changing the signature's shape.
"""

from __future__ import annotations

from gpucluster.core.reasons import WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node, NodeSlice, Plan, Start


def queue_order(job: JobRequest) -> tuple[int, float, int]:
    """Sort key: higher priority first, then earlier submission, then lower id."""
    return (-int(job.priority), job.submitted_at, job.job_id)


def decide(snapshot: Snapshot, now: float) -> Plan:
    del now  # ordering here needs no clock; the signature is the one every scheduler keeps
    free = snapshot.free_gpus_by_node()
    nodes = {n.name: n for n in snapshot.nodes}
    starts: list[Start] = []
    waiting: dict[int, str] = {}
    blocked: list[tuple[int, frozenset[str]]] = []  # (job id, GPU models it holds back)

    for job in sorted(snapshot.queued, key=queue_order):
        wanted = _models_for(job, snapshot.nodes)
        blocker = next((bid for bid, models in blocked if models & wanted), None)
        if blocker is not None:
            waiting[job.job_id] = WaitReason.BEHIND_HIGHER_PRIORITY.sentence(blocker=blocker)
            continue
        allocation = _place(job, nodes, free)
        if allocation is None:
            blocked.append((job.job_id, wanted))
            free_now = sum(1 for name, idxs in free.items() for i in idxs if _gpu_model(nodes[name], i) in wanted)
            waiting[job.job_id] = WaitReason.RESOURCES.sentence(gpus=job.gpus, gpu_type=job.gpu_type, free=free_now)
            continue
        for s in allocation.slices:
            free[s.node] = [i for i in free[s.node] if i not in s.gpu_indices]
        starts.append(Start(job.job_id, allocation))
    return Plan(starts=tuple(starts), waiting=waiting)


def _models_for(job: JobRequest, nodes: tuple[Node, ...]) -> frozenset[str]:
    if job.gpu_type is not None:
        return frozenset({job.gpu_type})
    return frozenset(g.model for n in nodes for g in n.gpus)


def _gpu_model(node: Node, index: int) -> str:
    return next(g.model for g in node.gpus if g.index == index)


def _place(job: JobRequest, nodes: dict[str, Node], free: dict[str, list[int]]) -> Allocation | None:
    """Best fit on one node: the node left with the fewest free GPUs, so whole nodes stay free."""
    best: tuple[int, str, list[int]] | None = None
    for name in sorted(nodes):
        node = nodes[name]
        usable = [i for i in free.get(name, []) if job.gpu_type is None or _gpu_model(node, i) == job.gpu_type]
        if job.gpu_type is None and usable:
            # An untyped job takes GPUs of one model only: mixing models in one job is never wanted.
            by_model: dict[str, list[int]] = {}
            for i in usable:
                by_model.setdefault(_gpu_model(node, i), []).append(i)
            usable = max(by_model.values(), key=len)
        if len(usable) < job.gpus:
            continue
        left = len(free[name]) - job.gpus
        if best is None or left < best[0]:
            best = (left, name, usable[: job.gpus])
    if best is None:
        return None
    return Allocation((NodeSlice(best[1], tuple(best[2])),))
