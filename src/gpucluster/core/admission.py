"""Admission: what `decide` may plan with, from the snapshot's drains and holds.

Why in the core: drained (or down) nodes and budget holds decide which jobs may start, as much as
quotas do; applied outside the core (by the head alone), the simulator could not model them.
The snapshot carries them as inputs (`Snapshot.drained`, `Snapshot.holds`); `decide` admits
before it plans, and a held job's wait is a BUDGET wait with the hold's reason.

A drained node is gone for new jobs while its running jobs go on. The scheduler places only on
the snapshot's nodes, so a drained node is left out, and so are running jobs' slices on it: the
core must never consider a GPU it does not know (preemption would look it up), and a job
spanning a drained and a healthy node still holds its GPUs on the healthy one. The price:
preemption never picks a job for GPUs on a drained node, which is what a drain means anyway.

Left out of the plan is not forgotten: the drained nodes move to `Snapshot.unavailable`, with
why and until when (`Snapshot.drains`). A job that no node left could host, but the drained ones
could, waits DRAINED with a sentence naming the drain ("node n1 is drained (maintenance), until
14:00") instead of "no set of nodes can host it" (`explain_drains`, applied by `decide`), and
the estimates count from each drain's end (core/estimate.py).
"""

from __future__ import annotations

from dataclasses import replace

from gpucluster.core.placement import Capacity
from gpucluster.core.reasons import WaitFacts, WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, Drain, JobRequest, Node, Plan, Wait

# Drains named in one wait at most; the rest are counted.
NAMED_DRAINS = 3


def admit(snapshot: Snapshot) -> tuple[Snapshot, dict[int, Wait]]:
    """The snapshot to plan on (no drained node, no held team's queued job, and no drains or
    holds left to apply), and the wait of every job held back."""
    if not snapshot.drained and not snapshot.holds:
        return snapshot, {}
    snap = without_nodes(snapshot, snapshot.drained)
    if snapshot.drained:
        gone = tuple(n for n in snapshot.nodes if n.name in snapshot.drained)
        snap = replace(snap, unavailable=snapshot.unavailable + gone)
    waits: dict[int, Wait] = {}
    holds = snapshot.holds
    if holds:
        keep = []
        for job in snap.queued:
            why = holds.get(job.team)
            if why is None:
                keep.append(job)
            else:
                waits[job.job_id] = Wait(WaitReason.BUDGET, why)
        if waits:
            # A kept queue index holds every queued job: the cycle sorts the admitted ones itself.
            snap = replace(snap, queued=tuple(keep), queue_index=None)
    return replace(snap, drained=frozenset(), holds={}), waits


def without_nodes(snap: Snapshot, drained: frozenset[str]) -> Snapshot:
    """`snap` without the `drained` nodes and without running jobs' slices on them."""
    if not drained:
        return snap
    running = []
    for job in snap.running:
        slices = tuple(s for s in job.allocation.slices if s.node not in drained)
        if len(slices) == len(job.allocation.slices):
            running.append(job)
        elif slices:
            running.append(replace(job, allocation=Allocation(slices)))
    return replace(snap, nodes=tuple(n for n in snap.nodes if n.name not in drained), running=tuple(running))


def explain_drains(plan: Plan, snapshot: Snapshot, now: float) -> Plan:
    """`plan` with each NO_FIT wait that only drained nodes stand in the way of made a DRAINED
    wait: which drains, until when, and (when every one of them has an end) that end as the
    estimated start. `snapshot` is the admitted one (`unavailable` holds the drained nodes).

    Why after the cycle: only jobs that fit no node left are looked at again (rare), so the
    cycle itself costs the same with drains as without."""
    if not snapshot.unavailable:
        return plan
    stuck = [w for w in plan.waiting.values() if w.reason is WaitReason.NO_FIT]
    if not stuck:
        return plan
    queued = {j.job_id: j for j in snapshot.queued}
    # Drained nodes in the order they come back: those with an end first, soonest first.
    order = sorted(
        snapshot.unavailable,
        key=lambda n: (_until(snapshot, n) is None, _until(snapshot, n) or 0.0, n.name),
    )
    caps: dict[int, Capacity] = {}  # the nodes left plus the first k drained ones back

    def fits(k: int, job: JobRequest) -> bool:
        cap = caps.get(k)
        if cap is None:
            cap = caps[k] = Capacity((*snapshot.nodes, *order[:k]), ())
        return any(cap.could_ever_fit(job, m) for m in cap.acceptable_models(job))

    waiting = dict(plan.waiting)
    for job_id, wait in plan.waiting.items():
        job = queued.get(job_id)
        if wait.reason is not WaitReason.NO_FIT or job is None or not fits(len(order), job):
            continue
        low, high = 1, len(order)  # more nodes back never hurts: the fewest that serve, by bisection
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if fits(mid, job) else (mid + 1, high)
        waiting[job_id] = _drained_wait(snapshot, order[:low], now)
    return replace(plan, waiting=waiting)


def _until(snapshot: Snapshot, node: Node) -> float | None:
    drain = snapshot.drains.get(node.name)
    return drain.until if drain is not None else None


def _drained_wait(snapshot: Snapshot, needed: list[Node] | tuple[Node, ...], now: float) -> Wait:
    """The wait of a job that only `needed` (drained nodes, soonest back first) could host."""
    drains = []
    for node in needed[-NAMED_DRAINS:][::-1]:  # the last one back decides: named first
        drain = snapshot.drains.get(node.name, Drain("drained"))
        drains.append((node.name, drain.reason, drain.until))
    more = len(needed) - NAMED_DRAINS if len(needed) > NAMED_DRAINS else None
    ends = [_until(snapshot, n) for n in needed]
    last = None if any(e is None for e in ends) else max(max(e for e in ends if e is not None), now)
    return Wait(WaitReason.DRAINED, WaitFacts(drains=tuple(drains), more=more), last)
