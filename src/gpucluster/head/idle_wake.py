"""Whether a committed submission needs the head's loop at once, while its last plan found that
nothing could start (issue 18).

Why: while every GPU is busy and no running job may be preempted, each commit of a burst of
submissions woke the loop for a cycle that read the new rows, built a snapshot and found again
that nothing could start (`core.scheduler.certainly_idle`): about a fifth of the head's
interpreter time while 8 clients streamed `sleep` jobs into a full cluster (py-spy on
bench_submit's rate phase), each such cycle holding the interpreter while the clients' answers
waited. A submission like those already queued changes nothing until a GPU frees or a running
job becomes preemptible, and the loop's periodic cycle (`Head.run`'s `interval_s`, 0.1 s) looks
for both and reads the new jobs then, as it does when no one submits.

A submission still wakes the loop at once where it might start or preempt now: it asks no whole
GPU (CPU only, or a share of one, by fraction or by memory: a shared GPU may have room), or its
class is above every queued job's at the idle plan (it may preempt a lower class the others
could not), or the idle plan saw a whole GPU free (a job of another model or size may fit where
the queued ones did not: no `IdleBar` then). Under attained-service preemption whether some
running job may be taken does not depend on the queue (`_Cycle._nothing_can_change`), so a new
job's rank needs no test here. A wake missed by a race with the loop (the bar read just before
the loop cleared it) waits for the periodic cycle: a later start, never a different plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpucluster.core.placement import Capacity
from gpucluster.core.types import Priority
from gpucluster.models import JobSpec


@dataclass(frozen=True)
class IdleBar:
    """What the last (idle) plan saw: the highest priority class queued then."""

    highest: int

    def moved_by(self, spec: JobSpec) -> bool:
        """Whether the submission of `spec` might let a plan start or preempt something now."""
        share = spec.gpus < 1 or spec.gpu_memory is not None  # CPU only, or a share of one GPU
        return share or int(Priority.parse(spec.priority)) > self.highest


def idle_bar(capacity: Capacity, highest: int | None) -> IdleBar | None:
    """The bar of an idle plan over `capacity` (what it planned on), `highest` the highest class
    it had queued (`queue_index.highest_queued_class`); None where a whole GPU was free, or no
    job was queued."""
    if highest is None or any(capacity.free_count(model) for model in capacity.model_memory):
        return None
    return IdleBar(highest)


def needs_plan(bar: IdleBar | None, specs: Sequence[JobSpec]) -> bool:
    """Whether the loop should plan now for these committed submissions."""
    return bar is None or any(map(bar.moved_by, specs))
