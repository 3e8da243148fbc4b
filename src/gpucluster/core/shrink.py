"""Elastic shrink before preemption: a victim that can run smaller gives up GPUs first.

An elastic job (`--gpus MAX --min-gpus MIN`, core/elastic.py) that runs above its minimum can
make room for a higher job without losing its place on the cluster: it is stopped like a
preemption victim (checkpoint, SIGTERM), goes back to the queue right behind its preemptor
(`Snapshot.preempted_for`), and restarts at once at the largest size that fits then, at least its
minimum. That is the same checkpoint-and-restart path elastic growth takes (`elastic.grow`, the
head's loop asks the job to stop with a "resized" reason), run in the other direction.

Why preferred over stopping others whole: a job preempted whole waits in the queue for GPUs
(minutes to hours); a shrunk job pays one restart and keeps running. So when the policy allows
(`preemption.shrink_elastic`, on by default), `shrink_first` looks for victims among the
elastic candidates alone, and takes them only if, once they and the preemptor are placed, enough
GPUs of the model remain (on the nodes the preemptor may use, free or freed) for every one of
them to come back at its minimum. Otherwise the ordinary search (`preempt.choose_victims`)
decides, over every candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpucluster.core import preempt_shapes as shapes
from gpucluster.core.placement import Capacity
from gpucluster.core.preempt import CostKey, Guarantees, VictimChoice, choose_victims
from gpucluster.core.types import JobRequest, RunningJob


def shrinkable(job: RunningJob) -> bool:
    """An elastic job holding more GPUs than its minimum."""
    return job.min_gpus is not None and job.allocation.gpu_count > job.min_gpus


def shrink_first(
    job: JobRequest,
    model: str,
    cap: Capacity,
    candidates: Sequence[RunningJob],
    stopping: Sequence[RunningJob],
    cost: Callable[[RunningJob], CostKey],
    guarantees: Guarantees | None,
    shared: bool,
    allowed: frozenset[str] | None,
) -> VictimChoice | None:
    """Victims that are all elastic jobs above their minimum and leave room for the preemptor
    and for each of them at its minimum, or None (then the ordinary search decides).
    `candidates` in cost order, as `choose_victims(ranked=True)` takes them."""
    if job.selection is not None and job.selection.exclusive:
        return None  # an exclusive preemptor takes whole nodes: nothing is left on them to shrink to
    elastic = [v for v in candidates if shrinkable(v)]
    if not elastic:
        return None
    choice = choose_victims(
        job, model, cap, elastic, stopping, cost, ranked=True, guarantees=guarantees, shared=shared, allowed=allowed
    )
    if choice is None or not choice.victims:
        return None
    # Room left once the victims (and the jobs stopping) are gone and the preemptor is placed:
    # whole GPUs of the model, on the nodes it may use, against the victims' minimums.
    room = shapes.Room(cap, model, stopping, allowed)
    for v in choice.victims:
        room.add(v)
    wants = 1 if job.fractional else int(job.gpus)
    back = sum(v.min_gpus or 0 for v in choice.victims)
    return choice if room.total_free() >= wants + back else None
