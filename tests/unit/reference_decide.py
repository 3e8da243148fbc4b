"""A deliberately naive reference `decide`, for tests only: the independent oracle of issue 15.

It implements the scheduler's documented rules directly, with no caches, no indexes, no early
exits and no shared answers: every job is considered from scratch against plain dicts of free
GPU indices. It covers the rules the fast `decide` applies to whole-GPU jobs that fit on one
node of a single GPU model, under a policy without quotas or fair share (those get their own
property tests in test_scheduler_properties.py):

1. Order: jobs still backing off (`not_before` in the future) wait last (BACKOFF; BEGIN up to
   their submitter's begin time); the others
   by age if waiting longer than the starvation age, then by priority class (highest first),
   then, under `ordering.mode: las` (the default), by attained-service queue (the number of
   the policy's thresholds at or below the GPU-seconds of the job's earlier attempts; 0 once
   it has waited `promote_after` since it last entered the queue), then by age (submitted,
   then id).
2. Placement: best fit, the node left with the fewest free GPUs, on its lowest free GPU
   indices. Ties: the nodes no start of this cycle has changed by name, then the others in the
   order this cycle last changed them (a node whose free count a start changes joins the end
   of its new line). A job that would not end before a reservation's estimated start keeps off
   the reserved nodes (EASY backfill); without backfill nothing passes a reservation.
3. Preemption (one per GPU model per cycle, only while the model has no reservation): running
   jobs of a lower class, and under las with `preempt` those of the asker's own class in a
   later attained-service queue than the asker's (earlier attempts plus GPUs x time since its
   start) that have checkpointed, have run `min_slice` since they started, and whose loss
   (GPUs x (time since the checkpoint + `restart_cost`)) is at most the asker's queue's
   threshold; all of them not protected, not stopping, past the minimum runtime, ranked by
   (class, -usage share, work since the last checkpoint, -start, id). A node where stopping jobs
   already free enough needs none (the first by name). Else one victim if one is enough: the
   cheapest, ties by node name. Else on each node the cheapest prefix that frees enough (with
   the GPUs of jobs already stopping there), pruned of any victim not needed, most expensive
   first; the node needing the fewest, cheapest victims wins, ties by name.
   The GPUs are then held for the job from now + the grace period.
4. Otherwise the first job that cannot start gets a reservation (once per model): the earliest
   time some node has enough GPUs back from running jobs' expected ends (start + time limit,
   or the policy's default; now + grace for a job stopping; this cycle's starts included;
   never before now), ties by node name.
5. Waits: PREEMPTING, RESERVED (with its estimated start), BEHIND_RESERVATION (it would fit but
   for the reservation, or no backfill while some GPUs are free), RESOURCES otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpucluster.core.policy import Policy
from gpucluster.core.reasons import WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, NodeSlice, RunningJob


@dataclass(frozen=True)
class RefPlan:
    starts: tuple[tuple[int, Allocation], ...]
    preemptions: tuple[tuple[int, int], ...]  # (victim, for job)
    waits: dict[int, tuple[WaitReason, float | None]]  # job -> (reason, estimated start if known)


def reference_decide(snap: Snapshot, policy: Policy, now: float) -> RefPlan:
    size = {n.name: len(n.gpus) for n in snap.nodes}
    free: dict[str, list[int]] = {n.name: sorted(g.index for g in n.gpus) for n in snap.nodes}
    for r in snap.running:
        for s in r.allocation.slices:
            for i in s.gpu_indices:
                free[s.node].remove(i)
    grace = policy.preemption.grace_period_s
    default = policy.default_time_limit_s
    # (end, node, GPUs back then) for every running job's slices, and every start of this cycle
    ends: list[tuple[float, str, int]] = []
    for r in snap.running:
        end = now + grace if r.stopping else r.started_at + (r.time_limit_s or default)
        for s in r.allocation.slices:
            ends.append((max(end, now), s.node, len(s.gpu_indices)))
    starts: list[tuple[int, Allocation]] = []
    preemptions: list[tuple[int, int]] = []
    waits: dict[int, tuple[WaitReason, float | None]] = {}
    reservation: tuple[float, frozenset[str], int] | None = None  # (shadow, nodes, job)
    victims_taken: set[int] = set()
    moved: dict[str, int] = {}  # node -> the start of this cycle that last changed its free count

    held = [j for j in snap.queued if j.not_before is not None and j.not_before > now]
    ready = [j for j in snap.queued if j not in held]

    def age(j: JobRequest) -> tuple[float, int]:
        return (j.submitted_at, j.job_id)

    def entered(j: JobRequest) -> float:
        return float(j.submitted_at if j.queued_at is None else j.queued_at)

    order = policy.ordering
    las = order.mode == "las"

    def queue(gpu_s: float) -> int:
        return sum(1 for t in order.queues if t <= gpu_s)

    def rank(j: JobRequest) -> int:
        if not las:
            return 0
        if order.promote_after_s is not None and now - max(entered(j), j.submitted_at) >= order.promote_after_s:
            return 0
        return queue(snap.attained.get(j.job_id, 0.0))

    aged = sorted((j for j in ready if now - entered(j) >= policy.starvation_age_s), key=age)
    rest = [j for j in ready if j not in aged]
    rest.sort(key=age)
    rest.sort(key=rank)
    rest.sort(key=lambda j: -int(j.priority) if policy.priorities else 0)
    for job in [*aged, *rest]:
        n = int(job.gpus)
        limit = job.time_limit_s or default
        passes = reservation is not None and policy.backfill and now + limit <= reservation[0]
        if reservation is not None and not policy.backfill:
            if sum(len(f) for f in free.values()) >= n:
                waits[job.job_id] = (WaitReason.BEHIND_RESERVATION, None)
            else:
                waits[job.job_id] = (WaitReason.RESOURCES, None)
            continue
        off = reservation[1] if reservation is not None and not passes else frozenset()
        fitting = sorted(
            (len(f), name in moved, moved.get(name, 0), name)
            for name, f in free.items()
            if name not in off and len(f) >= n
        )
        if fitting:
            node = fitting[0][3]
            taken = tuple(free[node][:n])
            free[node] = free[node][n:]
            moved[node] = len(starts) + 1
            alloc = Allocation((NodeSlice(node, taken),))
            starts.append((job.job_id, alloc))
            ends.append((now + limit, node, n))
            continue
        if reservation is not None:
            would_fit = sum(len(f) for f in free.values()) >= n and any(len(f) >= n for f in free.values())
            waits[job.job_id] = (WaitReason.BEHIND_RESERVATION if would_fit else WaitReason.RESOURCES, None)
            continue
        takes = _las_takes(snap, policy, now, rank(job), queue) if las and order.preempt else None
        choice = _victims(snap, policy, now, job, free, size, victims_taken, takes)
        if choice is not None:
            node, victims = choice
            for v in victims:
                preemptions.append((v, job.job_id))
                victims_taken.add(v)
            waits[job.job_id] = (WaitReason.PREEMPTING, None)
            reservation = (now + grace, frozenset({node}), job.job_id)
            continue
        best: tuple[float, str] | None = None
        for name, f in free.items():
            have = len(f)
            for end, nd, back in sorted(e for e in ends if e[1] == name):
                del nd
                have += back
                if have >= n:
                    if best is None or (end, name) < best:
                        best = (end, name)
                    break
        if best is None:
            waits[job.job_id] = (WaitReason.RESOURCES, None)
            continue
        reservation = (best[0], frozenset({best[1]}), job.job_id)
        waits[job.job_id] = (WaitReason.RESERVED, best[0])
    for job in held:  # a submitter's begin time (--begin) or a restart's backoff
        begins = job.begin is not None and job.not_before is not None and job.not_before <= job.begin
        waits[job.job_id] = (WaitReason.BEGIN if begins else WaitReason.BACKOFF, job.not_before)
    return RefPlan(tuple(starts), tuple(preemptions), waits)


def _victims(
    snap: Snapshot,
    policy: Policy,
    now: float,
    job: JobRequest,
    free: dict[str, list[int]],
    size: dict[str, int],
    taken: set[int],
    las_takes: Callable[[RunningJob], bool] | None,
) -> tuple[str, list[int]] | None:
    """(node, victims) that make room for `job`, or None: step 3 of the module docstring.
    `las_takes`: whether `job` may take a running job of its own class for attained service."""
    pre = policy.preemption
    if not pre.enabled or not policy.priorities:
        return None
    n = int(job.gpus)

    def cost(v: RunningJob) -> tuple[float, ...]:
        lost = now - (v.last_checkpoint_at if v.last_checkpoint_at is not None else v.started_at)
        share = snap.usage.get(v.team, 0.0) / max(policy.share(v.team), 1e-9)
        return (int(v.priority), -share, lost, -v.started_at, v.job_id)

    candidates = [
        v
        for v in snap.running
        if (v.priority < job.priority or (v.priority == job.priority and las_takes is not None and las_takes(v)))
        and v.priority not in pre.protected_classes
        and not v.stopping
        and now - v.started_at >= pre.min_runtime_s
        and v.job_id not in taken
    ]
    candidates.sort(key=cost)  # stable: ties keep the running jobs' order
    stopping = [v for v in snap.running if v.stopping]
    if not candidates:
        return None
    releasing: dict[str, int] = {}
    for v in stopping:
        for s in v.allocation.slices:
            releasing[s.node] = releasing.get(s.node, 0) + len(s.gpu_indices)
    ready = [nd for nd in releasing if size[nd] >= n and len(free[nd]) + releasing[nd] >= n]
    if ready:
        return (min(ready), [])
    singles = [
        (cost(v), s.node, v.job_id)
        for v in candidates
        for s in v.allocation.slices
        if size[s.node] >= n and len(free[s.node]) + releasing.get(s.node, 0) + len(s.gpu_indices) >= n
    ]
    if singles:
        _, nd, victim = min(singles)
        return (nd, [victim])
    on_node: dict[str, list[tuple[RunningJob, int]]] = {}
    for v in candidates:
        for s in v.allocation.slices:
            on_node.setdefault(s.node, []).append((v, len(s.gpu_indices)))
    best: tuple[int, list[tuple[float, ...]], str, list[int]] | None = None
    for node in sorted(set(on_node) | set(releasing)):
        if size[node] < n:
            continue
        have = len(free[node]) + releasing.get(node, 0)
        if have >= n:
            return (node, [])
        chosen: list[tuple[RunningJob, int]] = []
        for v, g in on_node.get(node, []):
            chosen.append((v, g))
            have += g
            if have >= n:
                break
        if have < n:
            continue
        for pair in reversed(list(chosen)):
            if have - pair[1] >= n:
                chosen.remove(pair)
                have -= pair[1]
        key = (len(chosen), sorted(cost(v) for v, _ in chosen), node, [v.job_id for v, _ in chosen])
        if best is None or key[:3] < best[:3]:
            best = key
    return None if best is None else (best[2], best[3])


def _las_takes(
    snap: Snapshot, policy: Policy, now: float, asker_queue: int, queue: Callable[[float], int]
) -> Callable[[RunningJob], bool]:
    """Whether an asker in `asker_queue` may take a running job of its class (step 3)."""
    order = policy.ordering
    allowance = order.queues[asker_queue] if asker_queue < len(order.queues) else float("inf")

    def takes(v: RunningJob) -> bool:
        if v.last_checkpoint_at is None or now - v.started_at < order.min_slice_s:
            return False
        gpus = sum(len(s.gpu_indices) for s in v.allocation.slices)
        had = snap.attained.get(v.job_id, 0.0) + gpus * max(0.0, now - v.started_at)
        lost = gpus * (now - v.last_checkpoint_at + order.restart_cost_s)
        return queue(had) > asker_queue and lost <= allowance

    return takes
