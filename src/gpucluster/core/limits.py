"""Per-user and per-class limits (issue 16): which queued jobs `decide` may plan with, given what
each user already runs, and whether a submission would queue more jobs than a user may.

Why in the core, before the cycle: a limit says whether a job may start at all, as a budget hold
does, so like admission (core/admission.py) it filters the queue `decide` plans with; `decide`
applies it itself, so the head and the simulator (which reads the same policy) both honour it.
A job at a limit never reaches the cycle: it takes no reservation and blocks no one (a limit
frees when the user's own jobs end, not when GPUs do), and the cycle's shared answers
(`JobRequest.demand`) stay independent of the user.

The rule, per user (jobs without a user are not limited): their queued jobs are taken in their
own order (class, then queue entry, then id), and each is admitted if, with the jobs admitted
before it, it fits every limit set for it: `max_running_gpus` (GPUs held by the user's running
jobs, plus its own) and `max_gpu_hours_in_flight` (their GPUs x time limit left, plus its own
GPUs x its time limit), per user and per the user's jobs of its class. A job that does not fit
waits with the first limit it is over and takes no room, so a smaller job of the same user
further back may still pass (Slurm checks each job on its own likewise). Admitted jobs hold
their room for this cycle even if they cannot start (busy GPUs): the user never runs beyond a
limit, whatever the cycle starts. A job still backing off (or before its begin time) is passed
on without taking room: the cycle will not start it. An elastic job is admitted at the largest
size from its `gpus` down to its `min_gpus` that fits.

A job without a time limit counts `default_time_limit_s` of GPU-hours in full for as long as it
runs (its end is unknown; counting it as ending at the default would let a user escape the
limit once such jobs had run that long), and gives no estimate of when its GPUs come back.

Queued-job limits (`max_queued_jobs`) are checked at submit, where the store counts the user's
queued jobs in its write transaction (`queued_refusal`), so two submissions at once cannot
both pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpucluster.core.policy import Limits, Policy
from gpucluster.core.reasons import WaitFacts, WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Priority, RunningJob, Wait

HOUR = 3600.0
EPSILON = 1e-9  # float sums of fractional GPUs and hours: a job exactly at the limit fits

GPUS, HOURS = "max_running_gpus", "max_gpu_hours_in_flight"
_Key = tuple[str, Priority | None]  # (user, None): all their jobs; (user, class): those of one class


@dataclass
class _Use:
    """What one user (or one user's jobs of one class) holds: running now, and admitted ahead in
    this cycle (`pending_*`, counted as starting now)."""

    gpus: float = 0.0
    fixed_hours: float = 0.0  # GPU-hours of running jobs without a time limit (constant)
    ends: list[tuple[float, float]] = field(default_factory=list)  # (end, GPUs) of jobs with a limit
    pending_gpus: float = 0.0
    pending_hours: float = 0.0
    _hours: float | None = None  # `hours(now)`, once: `now` is one instant per call of `within_limits`

    def hours(self, now: float) -> float:
        """GPU-hours in flight of the running jobs at `now` (asked per queued job: summed once)."""
        if self._hours is None:
            self._hours = self.fixed_hours + sum(g * max(0.0, end - now) for end, g in self.ends) / HOUR
        return self._hours


@dataclass(frozen=True, eq=False)
class _Check:
    kind: str  # GPUS or HOURS
    key: _Key
    limit: float
    path: str  # where the policy file sets it, for the message

    @property
    def reason(self) -> WaitReason:
        per_class = self.key[1] is not None
        if self.kind == GPUS:
            return WaitReason.CLASS_GPUS if per_class else WaitReason.USER_GPUS
        return WaitReason.CLASS_GPU_HOURS if per_class else WaitReason.USER_GPU_HOURS


def within_limits(snapshot: Snapshot, policy: Policy, now: float) -> tuple[Snapshot, dict[int, Wait]]:
    """The snapshot to plan on (no job beyond its user's limits; `limited` set so it is not
    applied twice), and the wait of every job held back. Unchanged without running limits.

    One pass over the queue, each job checked against its (user, class)'s few checks with the
    usage objects looked up once per (user, class): at 100,000 queued every step per job shows."""
    limits = policy.limits
    if snapshot.limited or not limits.active:
        return snapshot, {}
    default = policy.default_time_limit_s
    mine: dict[str, list[JobRequest]] = {}
    for job in snapshot.queued:
        if job.user and (job.not_before is None or job.not_before <= now):
            mine.setdefault(job.user, []).append(job)
    if not mine:
        return replace(snapshot, limited=True), {}
    use = _usage(snapshot.running, mine, default)
    plans: dict[tuple[str, Priority], _Plan] = {}
    waits: dict[int, Wait] = {}
    resized: dict[int, JobRequest] = {}
    said: dict[tuple[object, ...], Wait] = {}  # equal jobs at the same point get one sentence
    for user, jobs in mine.items():
        jobs.sort(key=lambda r: (-int(r.priority), r.queued_at or r.submitted_at, r.job_id))
        for job in jobs:
            plan = plans.get((user, job.priority))
            if plan is None:
                plan = plans[(user, job.priority)] = _plan(limits, user, job.priority, use, now)
            pairs, mine_all, mine_class = plan
            if not pairs:
                continue
            gpus = job.gpus
            hours = gpus * (job.time_limit_s or default) / HOUR
            over = _first_over(pairs, gpus, hours)
            if over is not None and job.min_gpus is not None and gpus >= 1:
                for n in range(int(gpus) - 1, job.min_gpus - 1, -1):
                    if _first_over(pairs, float(n), n * (job.time_limit_s or default) / HOUR) is None:
                        resized[job.job_id] = replace(job, gpus=float(n))
                        gpus, hours, over = float(n), n * (job.time_limit_s or default) / HOUR, None
                        break
            if over is None:
                mine_all.pending_gpus += gpus
                mine_all.pending_hours += hours
                mine_class.pending_gpus += gpus
                mine_class.pending_hours += hours
                continue
            check, u = over
            said_key = (id(check), gpus, job.time_limit_s, u.pending_gpus, u.pending_hours)
            wait = said.get(said_key)
            if wait is None:
                wait = said[said_key] = _wait(job, check, u, now, default)
            waits[job.job_id] = wait
    if not waits and not resized:
        return replace(snapshot, limited=True), {}
    queued = tuple(resized.get(j.job_id, j) for j in snapshot.queued if j.job_id not in waits)
    # A kept queue index holds every queued job: the cycle sorts the admitted ones itself.
    return replace(snapshot, queued=queued, queue_index=None, limited=True), waits


# A (user, class)'s checks with the usage each reads, and its usage in all and in the class.
_Plan = tuple[list[tuple["_Check", _Use]], _Use, _Use]


def _plan(limits: Limits, user: str, priority: Priority, use: dict[_Key, _Use], now: float) -> _Plan:
    mine_all = use.setdefault((user, None), _Use())
    mine_class = use.setdefault((user, priority), _Use())
    pairs: list[tuple[_Check, _Use]] = []
    for kind in (GPUS, HOURS):
        got = limits.of_user(user, kind)
        if got is not None:
            pairs.append((_Check(kind, (user, None), *got), mine_all))
    for kind in (GPUS, HOURS):
        got = limits.of_class(priority, kind)
        if got is not None:
            pairs.append((_Check(kind, (user, priority), *got), mine_class))
    for _, u in pairs:
        u.hours(now)  # summed once, before any job is admitted
    return pairs, mine_all, mine_class


def _first_over(pairs: list[tuple[_Check, _Use]], gpus: float, hours: float) -> tuple[_Check, _Use] | None:
    """The first check a job of `gpus` GPUs and `hours` GPU-hours would go beyond, with its usage."""
    for check, u in pairs:
        if check.kind == GPUS:
            if u.gpus + u.pending_gpus + gpus > check.limit + EPSILON:
                return check, u
        elif (u._hours or 0.0) + u.pending_hours + hours > check.limit + EPSILON:
            return check, u
    return None


def _usage(running: tuple[RunningJob, ...], users: dict[str, list[JobRequest]], default: float) -> dict[_Key, _Use]:
    """What each user with queued jobs holds now, in all and per class. Summed per (user, class)
    first and the users' totals from those: one dict step per running job (60,000 at scale)."""
    use: dict[_Key, _Use] = {}
    for r in running:
        user = r.user
        if user not in users:
            continue
        slices = r.allocation.slices
        first = slices[0]
        gpus = len(first.gpu_indices) * first.share if len(slices) == 1 else r.allocation.gpu_count
        key = (user, r.priority)
        u = use.get(key)
        if u is None:
            u = use[key] = _Use()
        u.gpus += gpus
        if r.time_limit_s:
            u.ends.append((r.started_at + r.time_limit_s, gpus))
        else:
            u.fixed_hours += gpus * default / HOUR
    for (user, _), u in list(use.items()):
        total = use.get((user, None))
        if total is None:
            total = use[(user, None)] = _Use()
        total.gpus += u.gpus
        total.fixed_hours += u.fixed_hours
        total.ends.extend(u.ends)
    return use


def _wait(job: JobRequest, check: _Check, u: _Use, now: float, default: float) -> Wait:
    user, cls = check.key
    if check.kind == GPUS:
        asks, used, ahead = job.gpus, u.gpus, u.pending_gpus
        when = None if asks > check.limit + EPSILON else _gpus_free_at(u, check.limit - asks, now)
    else:
        asks, used, ahead = job.gpus * (job.time_limit_s or default) / HOUR, u.hours(now), u.pending_hours
        when = None if asks > check.limit + EPSILON else _hours_free_at(u, check.limit - asks, now)
    facts = WaitFacts(
        variant="never" if asks > check.limit + EPSILON else None,
        user=user,
        priority_class=cls.label if cls is not None else None,
        path=check.path,
        limit=check.limit,
        used=used,
        ahead=ahead or None,
        asks=asks,
    )
    return Wait(check.reason, facts, when)


def _gpus_free_at(u: _Use, room: float, now: float) -> float | None:
    """When the user's running GPUs first drop to `room`, by their jobs' time limits; None if a
    job without one, or one admitted ahead in this cycle (not started: its end is unknown), would
    have to end first."""
    if u.pending_gpus:
        return None
    held = u.gpus
    if held <= room + EPSILON:
        return now
    for end, gpus in sorted(u.ends):
        held -= gpus
        if held <= room + EPSILON:
            return max(now, end)
    return None


def _hours_free_at(u: _Use, room: float, now: float) -> float | None:
    """When the user's GPU-hours in flight first drop to `room`: f(t) = fixed + sum of GPUs x
    (end - t) over the jobs not yet ended, piecewise linear and falling, solved segment by
    segment. None when the jobs without a time limit alone hold more, or jobs ahead in line
    have not started yet."""
    if u.pending_hours:
        return None
    target = room - u.fixed_hours
    if target < -EPSILON:
        return None
    ends = sorted((e, g) for e, g in u.ends if e > now)
    gpus = sum(g for _, g in ends)
    weighted = sum(g * e for e, g in ends)
    start = now
    for end, g in ends:
        # On [start, end] the jobs still running hold (weighted - gpus * t) / HOUR.
        t = (weighted - target * HOUR) / gpus
        if t <= end:
            return max(start, t)
        gpus -= g
        weighted -= g * end
        start = end
    return start


def queued_refusal(
    limits: Limits, user: str, priority: Priority, queued: int, queued_in_class: int, adding: int
) -> str | None:
    """Why a submission of `adding` jobs (an array's elements) of `priority` by `user`, who has
    `queued` jobs queued (`queued_in_class` of that class), may not be queued; None if it may."""
    for got, have, what in (
        (limits.of_user(user, "max_queued_jobs"), queued, "per-user"),
        (limits.of_class(priority, "max_queued_jobs"), queued_in_class, "per-class"),
    ):
        if got is None:
            continue
        limit, path = got
        if have + adding > limit:
            jobs = f"{have} job{'s' if have != 1 else ''}" + (
                f" of class {priority.label}" if what == "per-class" else ""
            )
            return (
                f"{user} has {jobs} queued, the {what} limit ({path}) is {limit:g}, and this submission adds "
                f"{adding}: wait for some to start, or cancel some (gpucluster cancel), then submit again"
            )
    return None
