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
"""

from __future__ import annotations

from dataclasses import replace

from gpucluster.core.reasons import WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, Wait


def admit(snapshot: Snapshot) -> tuple[Snapshot, dict[int, Wait]]:
    """The snapshot to plan on (no drained node, no held team's queued job, and no drains or
    holds left to apply), and the wait of every job held back."""
    if not snapshot.drained and not snapshot.holds:
        return snapshot, {}
    snap = without_nodes(snapshot, snapshot.drained)
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
