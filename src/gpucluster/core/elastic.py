"""Elastic growth: a running elastic job below its maximum grows when GPUs stay free.

Pure, like `decide`: `grow(snapshot, policy, now, free_since)` names the running jobs to grow and
to what size; the head (and the simulator) carry it out by checkpoint-and-restart: the job is
asked to stop like a requeue ("resized: growing from 2 to 4 GPUs"), checkpoints, and restarts
at once at the largest size that fits then, which is the larger size because nothing else
wanted those GPUs.

When: GPUs have been free, with no job waiting in the queue, for `grow_after_s` (`free_since`:
the head's clock since that is so without a break); the job has run `grow_every_s` since its
(re)start (at most one resize per interval, so a restart's cost is paid at most that often);
and the restart pays for itself: a job that still has `left` seconds of work on `n` GPUs
finishes it on `m` in `left * n / m` plus `restart_cost_s`, so it grows only if
`left * (1 - n / m) > restart_cost_s` (`left` from its time limit; a job without one is
assumed to have `default_time_limit_s` left, the backfill's assumption). One job per cycle, the
one that gains most (then the oldest), so several elastic jobs do not all restart at once for
the same GPUs.

Never beyond its user's limits (core/limits.py): a size its user may not run is not grown to
(a restart that the limits would then clamp back would cost a checkpoint for nothing).

Shrinking is the preemption path: a victim that is elastic goes back to the queue and restarts
at whatever fits, at least its minimum, once its preemptor has started (`Snapshot.preempted_for`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpucluster.core.limits import within_limits
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, RunningJob


@dataclass(frozen=True)
class Resize:
    job_id: int
    from_gpus: int
    to_gpus: int
    reason: str


def restart_pays(left_s: float, now_gpus: int, new_gpus: int, restart_cost_s: float) -> bool:
    """Does moving from `now_gpus` to `new_gpus` for the `left_s` seconds of work left (at the
    current size) beat the `restart_cost_s` a checkpoint-and-restart costs?"""
    return new_gpus > now_gpus and left_s * (1 - now_gpus / new_gpus) > restart_cost_s


def grow(snapshot: Snapshot, policy: Policy, now: float, free_since: float | None) -> tuple[Resize, ...]:
    """The resize to carry out now (at most one), see the module docstring."""
    rule = policy.elastic
    if not rule.enabled or free_since is None or now - free_since < rule.grow_after_s:
        return ()
    if any(j.not_before is None or j.not_before <= now for j in snapshot.queued):
        return ()  # a job waits: the free GPUs are its (or held for it), never an elastic job's
    best: tuple[float, float, Resize] | None = None
    for job in _growable(snapshot.running, now, rule.grow_every_s):
        now_gpus = int(job.allocation.gpu_count)
        assert job.max_gpus is not None
        size = _largest_fit(snapshot, policy, now, job, now_gpus, job.max_gpus)
        if size is None:
            continue
        limit = job.time_limit_s if job.time_limit_s is not None else policy.default_time_limit_s
        left = max(0.0, job.started_at + limit - now)
        if not restart_pays(left, now_gpus, size, rule.restart_cost_s):
            continue
        gain = left * (1 - now_gpus / size) - rule.restart_cost_s
        resize = Resize(
            job.job_id,
            now_gpus,
            size,
            f"resized: growing from {now_gpus} to {size} GPUs (free for {now - free_since:.0f}s)",
        )
        key = (gain, -job.started_at)
        if best is None or key > best[:2]:
            best = (gain, -job.started_at, resize)
    return (best[2],) if best is not None else ()


def _growable(running: Iterable[RunningJob], now: float, every_s: float) -> Iterable[RunningJob]:
    for job in running:
        if job.max_gpus is None or job.stopping or now - job.started_at < every_s:
            continue
        if job.allocation.gpu_count < job.max_gpus:
            yield job


def _largest_fit(
    snapshot: Snapshot, policy: Policy, now: float, job: RunningJob, now_gpus: int, max_gpus: int
) -> int | None:
    """The largest size above `now_gpus` the job would be placed at if it released its GPUs now,
    and its user may run (the limits asked as they would be when it is queued again)."""
    others = [r for r in snapshot.running if r.job_id != job.job_id]
    capacity = Capacity(snapshot.nodes, others)
    model = Capacity(snapshot.nodes, snapshot.running).model_of(job.allocation)
    request = JobRequest(
        job.job_id, float(max_gpus), team=job.team, priority=job.priority, time_limit_s=job.time_limit_s, user=job.user
    )
    limited = policy.limits.active and bool(job.user)
    for n in range(max_gpus, now_gpus, -1):
        sized = replace(request, gpus=float(n))
        if not capacity.fits(sized, model):
            continue
        if limited and within_limits(Snapshot(snapshot.nodes, tuple(others), (sized,)), policy, now)[1]:
            continue  # beyond its user's limits at this size
        return n
    return None
