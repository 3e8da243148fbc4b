"""`decide(snapshot, now) -> Plan`: priority, then first come first served, on whole GPUs.

The ordering is strict within a GPU pool: a job that cannot start holds back later jobs that
would compete for the same GPU models, so a large job is never starved by a stream of small
ones. Jobs that need other GPU models pass it. Backfill, fair share, quotas and preemption are
the full scheduler's job (issue 3) and slot in here without changing the signature's shape.
"""

from __future__ import annotations

from gpucluster.core.reasons import WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, NodeSlice, Plan, Start


def queue_order(job: JobRequest) -> tuple[int, float, int]:
    """Sort key: higher priority first, then earlier submission, then lower id."""
    return (-int(job.priority), job.submitted_at, job.job_id)


def decide(snapshot: Snapshot, now: float) -> Plan:
    del now  # ordering here needs no clock; the signature is the one every scheduler keeps
    model_of = {(n.name, g.index): g.model for n in snapshot.nodes for g in n.gpus}
    all_models = tuple(sorted(set(model_of.values())))
    # Free GPUs per node, grouped by model: placement only ever wants one model per job.
    free: dict[str, dict[str, list[int]]] = {}
    for name, idxs in snapshot.free_gpus_by_node().items():
        by_model = free.setdefault(name, {})
        for i in idxs:
            by_model.setdefault(model_of[(name, i)], []).append(i)

    starts: list[Start] = []
    waiting: dict[int, str] = {}
    blocked: dict[str, int] = {}  # GPU model -> the first job that waits for it
    behind: dict[int, str] = {}  # blocker -> its sentence, formatted once for the whole queue

    for job in sorted(snapshot.queued, key=queue_order):
        wanted = (job.gpu_type,) if job.gpu_type is not None else all_models
        if blocked:
            blocker = next((blocked[m] for m in wanted if m in blocked), None)
            if blocker is not None:
                if blocker not in behind:
                    behind[blocker] = WaitReason.BEHIND_HIGHER_PRIORITY.sentence(blocker=blocker)
                waiting[job.job_id] = behind[blocker]
                continue
        allocation = _place(job, wanted, free)
        if allocation is None:
            for m in wanted:
                blocked.setdefault(m, job.job_id)
            free_now = sum(len(idxs) for by_model in free.values() for m, idxs in by_model.items() if m in wanted)
            waiting[job.job_id] = WaitReason.RESOURCES.sentence(gpus=job.gpus, gpu_type=job.gpu_type, free=free_now)
            continue
        (s,) = allocation.slices
        model = model_of[(s.node, s.gpu_indices[0])]
        free[s.node][model] = free[s.node][model][job.gpus :]
        starts.append(Start(job.job_id, allocation))
    return Plan(starts=tuple(starts), waiting=waiting)


def _place(job: JobRequest, wanted: tuple[str, ...], free: dict[str, dict[str, list[int]]]) -> Allocation | None:
    """Best fit on one node: the node left with the fewest free GPUs, so whole nodes stay free."""
    best: tuple[int, str, list[int]] | None = None
    for name in sorted(free):
        by_model = free[name]
        left_on_node = sum(len(v) for v in by_model.values()) - job.gpus
        for model in wanted:
            idxs = by_model.get(model, [])
            if len(idxs) >= job.gpus and (best is None or left_on_node < best[0]):
                best = (left_on_node, name, idxs[: job.gpus])
    if best is None:
        return None
    return Allocation((NodeSlice(best[1], tuple(best[2])),))
