"""Eligibility: which queued jobs the scheduler may consider now (user holds, dependencies and
array throttles).

Why a step of its own before `decide`: these rules say whether a job may start at all, not
where or in which order, so they filter the queue the scheduler sees and leave the scheduler
untouched. The head applies them when it builds a cycle's snapshot, the simulator can apply
the same function to its own queue. Pure: targets' states, running counts and `now` come in.

Not admission (core/admission.py): admission is the cluster's side (drained nodes, budget holds),
an input of `decide`; eligibility is the job's own conditions, checked against other jobs.

A job that waits here gets a named reason (held, dependency, throttle) and, for a dependency,
an estimated start from its targets' expected ends, so a pipeline has a timeline through the
chain: jobs are looked at in id order, and a dependency's id is always smaller than its
dependent's (it existed at submit), so a target that itself waits has its estimate by then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from gpucluster.core.reasons import WaitFacts, WaitReason
from gpucluster.core.states import JobState
from gpucluster.core.types import Dependency, DependencyKind, JobRequest, Wait

_PENDING = (JobState.RUNNING, JobState.PREEMPTED, JobState.QUEUED)  # an array's state: the first present


class Verdict(Enum):
    MET = "met"
    WAITING = "waiting"
    NEVER = "never"  # the target ended in a way the dependency cannot accept


@dataclass(frozen=True)
class Target:
    """A dependency's target as eligibility sees it: a job, or an array's elements summed up
    (state: the first element's pending state while any is pending, else succeeded if all
    did, else failed)."""

    state: JobState
    started: bool = False  # it (for an array: every element) has started at least once
    any_failed: bool = False  # an array: some element already ended badly (afterok can never be met)
    expected_start: float | None = None
    expected_end: float | None = None


@dataclass(frozen=True)
class Eligibility:
    eligible: tuple[JobRequest, ...]  # what the scheduler may start from
    waits: dict[int, Wait] = field(default_factory=dict)  # why the others wait
    doomed: dict[int, str] = field(default_factory=dict)  # a dependency that can never be met -> why


def array_target(counts: Mapping[JobState, int], started: int) -> Target:
    """An array as one target, from its elements counted by state and how many ever started:
    the first pending state (running, preempted, queued) while any element is pending, else
    failed if any ended badly, else succeeded. The head (from its store) and the simulator
    (from its own jobs) both sum an array up here, so a dependency on an array means one thing."""
    total = sum(counts.values())
    bad = counts.get(JobState.FAILED, 0) + counts.get(JobState.CANCELLED, 0)
    pending = next((s for s in _PENDING if counts.get(s, 0)), None)
    state = pending or (JobState.FAILED if bad else JobState.SUCCEEDED)
    return Target(state, started == total, bad > 0)


def array_times(
    latest: float | None, unknown: int, limit: float, throttle: int | None, now: float
) -> tuple[float | None, float | None]:
    """When an array's last element is expected to start and to end (an `after` dependency
    waits for the first, the others for the second): the latest known start of its pending
    elements, that plus their (shared) limit; elements with no estimate yet (held back by the
    throttle) follow in waves of `throttle`, each one limit long, the last wave starting one
    limit before the end. (None, None): nothing pending, or no way to tell."""
    if unknown == 0:
        return (None, None) if latest is None else (latest, latest + limit)
    if throttle is None:
        return None, None
    base = max(now, latest + limit if latest is not None else now)
    end = base + -(-unknown // throttle) * limit
    return end - limit, end


def verdict(kind: DependencyKind, target: Target) -> Verdict:
    if kind is DependencyKind.AFTER:
        return Verdict.MET if target.started or target.state.terminal else Verdict.WAITING
    if kind is DependencyKind.AFTEROK and target.any_failed:
        return Verdict.NEVER
    if not target.state.terminal:
        return Verdict.WAITING
    if kind is DependencyKind.AFTERANY:
        return Verdict.MET
    ok = target.state is JobState.SUCCEEDED
    if kind is DependencyKind.AFTEROK:
        return Verdict.MET if ok else Verdict.NEVER
    return Verdict.NEVER if ok else Verdict.MET  # afternotok


def label(dep: Dependency) -> str:
    return f"{'array' if dep.array else 'job'} {dep.job_id}"


def eligible(
    queued: Iterable[JobRequest],
    targets: Mapping[tuple[int, bool], Target],
    running_by_array: Mapping[int, int],
    throttles: Mapping[int, int],
    now: float,
    default_time_limit_s: float,
) -> Eligibility:
    """Split the queue into what the scheduler may consider and what waits here, and why.

    `targets` has every dependency's target, keyed (id, is_array); one missing (purged) counts
    as never met. `throttles`: array id -> the most elements that may run at once."""
    keep: list[JobRequest] = []
    waits: dict[int, Wait] = {}
    doomed: dict[int, str] = {}
    ends: dict[int, tuple[float, float]] = {}  # jobs waiting here: expected start and end, for their dependents
    queue = queued if isinstance(queued, tuple | list) else tuple(queued)
    # Dependent jobs first, in id order (a chain's earlier steps have smaller ids); the rest of
    # the queue is not sorted: a cycle with 100,000 queued pays for no sort it does not need.
    for job in sorted((r for r in queue if r.after), key=lambda r: r.job_id):
        blocked = _dependencies(job, targets, ends, now)
        if isinstance(blocked, str):
            doomed[job.job_id] = blocked
        elif blocked is not None:
            waits[job.job_id] = blocked
            if blocked.estimated_start is not None:
                start = blocked.estimated_start
                ends[job.job_id] = (start, start + (job.time_limit_s or default_time_limit_s))
    throttled: dict[int, list[JobRequest]] = {}
    for job in queue:
        if job.job_id in waits or job.job_id in doomed:
            continue
        if job.held:
            waits[job.job_id] = Wait(WaitReason.HELD)
        elif job.array_id is not None and job.array_id in throttles:
            throttled.setdefault(job.array_id, []).append(job)
        else:
            keep.append(job)
    for array_id, elements in throttled.items():
        limit = throttles[array_id]
        running = running_by_array.get(array_id, 0)
        room = max(0, limit - running)
        elements.sort(key=lambda r: r.job_id)  # the lowest indices go first
        keep.extend(elements[:room])
        busy = running + min(room, len(elements))  # the eligible ones start in this very cycle
        wait = Wait(WaitReason.THROTTLE, WaitFacts(array_id=array_id, limit=limit, running=busy))
        for job in elements[room:]:
            waits[job.job_id] = wait
    return Eligibility(tuple(keep), waits, doomed)


def _dependencies(
    job: JobRequest, targets: Mapping[tuple[int, bool], Target], ends: Mapping[int, tuple[float, float]], now: float
) -> Wait | str | None:
    """None: all met. A Wait: some unmet, with the first named. A string: one never can be."""
    unmet: list[tuple[Dependency, Target]] = []
    for dep in job.after:
        target = targets.get((dep.job_id, dep.array))
        if target is None:
            return f"dependency can never be met: {label(dep)} no longer exists ({dep.kind.value})"
        v = verdict(dep.kind, target)
        if v is Verdict.NEVER:
            return f"dependency can never be met: {label(dep)} {target.state.value} ({dep.kind.value})"
        if v is Verdict.WAITING:
            if not dep.array and dep.job_id in ends:
                # a target that itself waits here: its start and end through the chain (an
                # `after` dependent waits for the start)
                target = Target(target.state, target.started, target.any_failed, *ends[dep.job_id])
            unmet.append((dep, target))
    if not unmet:
        return None
    starts: list[float | None] = [
        t.expected_start if d.kind is DependencyKind.AFTER else t.expected_end for d, t in unmet
    ]
    known = [s for s in starts if s is not None]
    estimate = max([now, *known]) if len(known) == len(starts) else None
    dep, target = unmet[0]
    facts = WaitFacts(
        job=dep.job_id,
        array=dep.array or None,
        kind=dep.kind.value,
        state="waiting" if target.state is JobState.QUEUED else target.state.value,
        at=target.expected_start if dep.kind is DependencyKind.AFTER else target.expected_end,
        more=len(unmet) - 1 or None,
    )
    return Wait(WaitReason.DEPENDENCY, facts, estimate)
