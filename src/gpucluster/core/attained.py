"""Ordering by attained service (Tiresias-style least attained service, LAS), and its preemption.

Why: the scheduler does not know how long a job will run, but it knows how much GPU-time each
job has had already. In GPU clusters run times are heavy-tailed: a job that has already run for
hours is likely to run for hours more, and a job that has had little is, more often than not,
short. Serving the least attained first (in a few discretised queues, so jobs of one queue keep
their arrival order and a running job is not re-ranked every second) brings most short jobs
forward without a single run-time estimate. Tiresias (NSDI '19) reports large mean-JCT gains on
Philly-derived workloads this way.

What this module decides, and nothing else:
- a queued job's rank within its team's line (`ranks`): the index of its attained-service queue
  (0: least attained), or 0 once it has waited `promote_after` since it last entered the queue
  (promotion: a long job demoted to the last queue is never starved by a stream of short ones);
- which running job a queued one may preempt for attained service alone (`may_take`).

It never changes what goes before it: the starvation age, priority classes, quota guarantees and
the fair share between teams keep their order (`queueing.TeamQueues` ranks jobs only inside one
team's line at one class level, and breaks ties between teams at equal fair share by rank), and
backfill reservations are made as before, for whichever job is first in line. Since the
starvation age and promotion both order by age, a backlog older than them is served oldest
first, not by attained service: the built-in `las` policies set both to a week
(`policy.LAS_STARVATION_AGE_S`).

Inputs both callers supply (`Snapshot.attained`): job id -> GPU-seconds over its previous
attempts (the head from its attempt rows, the simulator from its own bookkeeping); a running
job's current attempt is added here from its allocation and start, so neither caller must
update a running job's figure while it runs.

Learned run-time distributions (`runtime_model: gittins`, `Snapshot.runtime_dist`): job id ->
the run times of the finished jobs like it (core/runtime_predict.py's similarity keys, the ones
the start estimates use; the head learns them from its store, the simulator from the jobs
finished so far in the replay). Inside a queue, jobs are then ordered by their Gittins index
(core/gittins.py) as a fraction added to the queue number; a job with no such history (not
named) keeps plain LAS's place: the front of its queue, oldest first (an unknown job is
presumed short, as LAS presumes). Everything that compares queues (preemption, its allowance)
reads `int(rank)`, so the index reorders jobs within a queue and nothing else.

`Snapshot.expected_runtime` (mode `sjf`): job id -> expected run seconds, filled only by the
simulator, with the trace's true run times, for its reference oracle (`oracle-sjf`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter
from typing import Literal

from gpucluster.core import gittins
from gpucluster.core.runtime_predict import RunDistribution
from gpucluster.core.types import JobRequest, RunningJob

OrderingMode = Literal["age", "las", "sjf"]
RuntimeModel = Literal["none", "gittins"]
# A running job's (attained-service queue, GPU-seconds lost if stopped now): see `standing`.
Standing = tuple[int, float]
INF = float("inf")
_JOB_ID = attrgetter("job_id")
_GPUS = attrgetter("gpus")
_SUBMITTED = attrgetter("submitted_at")
_QUEUED = attrgetter("queued_at")
_NONE_FIRST = {None: -INF}  # read only: a queue stamp of None as before every time (`_promote`)
# The shipped starvation age and promotion under `las`: a week, not a day. Why: both put a job
# first in line by age, so once a backlog is older than they are, every job past them is ordered
# oldest first and LAS becomes FIFO for exactly the jobs it should reorder. On Philly days 40-47
# (17 nodes, a backlog of days) a day made `las`'s mean wait 9.2x the oracle's; a week 1.84x,
# with p99 below FIFO + backfill's (bench/RESULTS.md, "Why las failed on a second week").
LAS_STARVATION_AGE_S = 7 * 86400.0


@dataclass(frozen=True)
class Ordering:
    """The policy file's `ordering:`. `las` (the default since issue 25: it halves the mean wait
    of the age order it replaced on contended Philly weeks, within 2x of an oracle that knows run
    times, bench/RESULTS.md): within a team's line, least attained GPU-time first; `age`: oldest
    first (the default before).

    `queues`: the attained-service thresholds in GPU-seconds, ascending (one GPU-hour = 3600): a
    job below the first is in queue 0, between the first and second in queue 1, and so on.
    `promote_after_s`: a queued job waiting this long since it last entered the queue goes back
    to queue 0 (None: never; the policy's `starvation_age` still puts it first in line).
    `preempt`: a job may stop a job of the same class in a later queue (needs
    `preemption.enabled`); only a victim that checkpoints, that has run `min_slice_s` since it
    last started (so no job is preempted again before it got a slice), and whose loss (its
    GPUs x (work since its last checkpoint + `restart_cost_s`)) is at most what the preemptor
    may have at its rank (its queue's threshold): losing more than the preemptor can gain before
    it would itself be demoted is a net loss.
    `runtime_model`: `gittins` (mode `las` only) orders jobs inside a queue by their Gittins
    index from learned run times (`Snapshot.runtime_dist`, core/gittins.py); `none`: by age.
    `relearn_every_s`: under `gittins`, how often the queued jobs' distributions take in the runs
    finished since (0: at every plan; core/learned_kinds.py). Why not at once: a key holds up to
    256 runs, so one more moves its jobs' indexes little, yet each finished run re-ranked every
    queued job of its key and re-sorted their lines: at every plan, ~20 of `las-gittins`'s ~86
    CPU-s on whole Philly. Ten minutes keeps nearly all of it; a kind of job first seen
    meanwhile is looked up with every run known.
    """

    mode: OrderingMode = "las"
    queues: tuple[float, ...] = (3600.0, 8 * 3600.0)
    promote_after_s: float | None = LAS_STARVATION_AGE_S
    preempt: bool = True
    min_slice_s: float = 1800.0
    restart_cost_s: float = 60.0
    runtime_model: RuntimeModel = "none"
    relearn_every_s: float = 600.0

    @property
    def gittins(self) -> bool:
        """Whether queues are ordered inside by the Gittins index (reads `Snapshot.runtime_dist`)."""
        return self.mode == "las" and self.runtime_model == "gittins"

    @property
    def ranked(self) -> bool:
        """Whether jobs are ranked at all (False: `age` ordering, no per-job work)."""
        return self.mode != "age"

    def queue_of(self, gpu_s: float) -> int:
        """The attained-service queue of a job that has had `gpu_s` GPU-seconds."""
        return bisect_right(self.queues, gpu_s)

    def allowance(self, rank: float) -> float:
        """GPU-seconds a job of queue `rank` may have before it is demoted (the last: no end)."""
        i = int(rank)
        return self.queues[i] if i < len(self.queues) else INF


# The order of the default before issue 25 (the built-in `age`): oldest first inside a team's
# line, no ranks, no preemption by attained service.
AGE_ORDER = Ordering(mode="age", preempt=False)


def attained_now(job: RunningJob, attained: Mapping[int, float], now: float) -> float:
    """A running job's attained GPU-seconds: its previous attempts plus the current one."""
    return attained.get(job.job_id, 0.0) + job.allocation.gpu_count * max(0.0, now - job.started_at)


def rank_of(
    job: JobRequest,
    ordering: Ordering,
    attained: Mapping[int, float],
    expected: Mapping[int, float],
    now: float,
) -> float:
    """The job's rank within its team's line: lower goes first (ties: oldest first)."""
    if ordering.mode == "sjf":
        return expected.get(job.job_id, INF)
    promote = ordering.promote_after_s
    if promote is not None:
        entered = entered_queue(job)
        if now - entered >= promote:
            return 0.0
    return float(ordering.queue_of(attained.get(job.job_id, 0.0)))


def ranks(
    queued: Sequence[JobRequest],
    ordering: Ordering,
    attained: Mapping[int, float],
    expected: Mapping[int, float],
    now: float,
    dists: Mapping[int, RunDistribution] | None = None,
) -> dict[int, float]:
    """The queued jobs' ranks, once per cycle (only when `ordering.ranked`): a job not named
    ranks 0 (`rank_of` gives it 0). Callers read a rank with `.get(job_id, 0.0)`.

    Why not every job: under `las` a job that never ran has attained nothing, so it is in queue
    0 whether or not it was promoted. Only the jobs `attained` names can rank elsewhere, and
    those are found by a set intersection (C speed), not a Python call per queued job (6% of
    `las`'s profiled time on the whole of Philly, where two thirds of the queue had run before,
    so about half of that is saved; more on a queue of mostly new jobs). Exact when a job with
    nothing attained is in queue 0 (the first threshold above 0); else every job is ranked.

    With `ordering.gittins`, the jobs `dists` names also get their Gittins fraction (`gittins_ranks`).
    """
    if ordering.gittins and dists:
        return gittins_ranks(queued, ordering, attained, dists, now)
    if ordering.mode != "las" or ordering.queue_of(0.0) != 0:
        return {j.job_id: rank_of(j, ordering, attained, expected, now) for j in queued}
    ids = list(map(_JOB_ID, queued))
    ran = attained.keys() & ids
    if not ran:
        return {}
    by_id = dict(zip(ids, queued, strict=True))
    out: dict[int, float] = {}
    promote, queues = ordering.promote_after_s, ordering.queues
    for job_id in ran:  # `rank_of`, inline: a third of the cost
        if promote is not None:
            job = by_id[job_id]
            if now - entered_queue(job) >= promote:
                continue
        queue = bisect_right(queues, attained[job_id])
        if queue:
            out[job_id] = float(queue)
    return out


def gittins_ranks(
    queued: Sequence[JobRequest],
    ordering: Ordering,
    attained: Mapping[int, float],
    dists: Mapping[int, RunDistribution],
    now: float,
) -> dict[int, float]:
    """`ranks` under `runtime_model: gittins`: a job's LAS queue (`rank_of`: promotion still puts
    it at 0, ahead of every index), plus, when `dists` names its job, its Gittins index's
    fraction (core/gittins.py) looking ahead to its queue's threshold. A job `dists` does not
    name ranks as under plain LAS. Every queued job is named (rank 0 included). Jobs that never
    ran and share a distribution and a GPU count share one index (the common case: a key's new
    jobs), worked out once per call and read at C speed; only jobs that ran before, and those
    submitted `promote_after` ago, cost a Python step each."""
    ids = list(map(_JOB_ID, queued))
    by_id = dict(zip(ids, queued, strict=True))
    # Jobs that never ran, by (distribution, GPUs): one index each, read at C speed (a dict
    # whose misses work it out); most of a queue under Gittins ordering, every cycle.
    fresh = _Fresh(ordering)
    kinds = zip(map(dists.get, ids), map(_GPUS, queued), strict=True)
    out = dict(zip(ids, map(fresh.__getitem__, kinds), strict=True))
    for jid in attained.keys() & by_id.keys():  # ran before: its own queue and look-ahead
        out[jid] = _kind_rank(ordering, dists.get(jid), by_id[jid].gpus, attained[jid])
    _promote(out, queued, ordering, now)
    return out


def _promote(out: dict[int, float], queued: Sequence[JobRequest], ordering: Ordering, now: float) -> None:
    """Rank 0, ahead of every index, for the queued jobs promoted by now: promotion guards
    against starvation (`rank_of`)."""
    promote = ordering.promote_after_s
    if promote is not None:
        cut = now - promote
        # A job entered the queue at or after its submission: only those submitted by `cut` may be.
        old = list(compress(queued, map(cut.__ge__, map(_SUBMITTED, queued))))
        if old:
            # `rank_of`'s promotion test for each, at C speed (a call each was ~8 CPU-s of `las-gittins` on
            # whole Philly: ~110 jobs a cycle waited that long): `entered_queue` is the later of
            # the submission and the requeue (none: -inf), then `now - entered >= promote`.
            entered = map(max, map(_SUBMITTED, old), map(_NONE_FIRST.get, map(_QUEUED, old), map(_QUEUED, old)))
            out.update(dict.fromkeys(map(_JOB_ID, compress(old, map(promote.__le__, map(now.__sub__, entered)))), 0.0))


class _Fresh(dict[tuple[RunDistribution | None, float], float]):
    """(distribution, GPUs) -> the rank of a job of that kind that never ran: queue 0 plus its
    Gittins fraction looking ahead to the first threshold (no distribution, or no GPUs: plain
    LAS's queue of nothing attained)."""

    def __init__(self, ordering: Ordering) -> None:
        super().__init__()
        self.ordering = ordering

    def __missing__(self, key: tuple[RunDistribution | None, float]) -> float:
        dist, gpus = key
        rank = self[key] = _kind_rank(self.ordering, dist, gpus, 0.0)
        return rank


def _kind_rank(ordering: Ordering, dist: RunDistribution | None, gpus: float, got: float) -> float:
    """The rank of a job with `got` GPU-seconds attained: its LAS queue, plus, with a learned
    distribution, its Gittins fraction looking ahead to that queue's threshold (per GPU)."""
    if dist is None or gpus <= 0:
        return float(ordering.queue_of(got))
    key = (gpus, got, ordering.queues)
    rank = dist.ranks.get(key)
    if rank is None and dist.carry:  # an earlier distribution of its key's, where it holds
        rank = dist.carried_rank(key)
        if rank is not None:
            dist.ranks[key] = rank
    if rank is None:  # once per distribution and kind of job (`RunDistribution.ranks`)
        queue = ordering.queue_of(got)
        left = ordering.allowance(queue) - got
        rank = queue + gittins.rank_fraction(gittins.index(dist, got / gpus, max(0.0, left) / gpus) / gpus)
        dist.ranks[key] = rank
    return rank


def entered_queue(job: JobRequest) -> float:
    """When `job` last entered the queue: its requeue, else its submission. Never before its
    submission: a `queued_at` stamped earlier (another head's clock behind this one's after a
    failover) counts as the submission, so `gittins_ranks`, which looks for promoted jobs only
    among those submitted `promote_after` ago (at C speed), and `rank_of` agree on every job."""
    queued = job.queued_at
    return job.submitted_at if queued is None or queued < job.submitted_at else queued


def standing(victim: RunningJob, ordering: Ordering, attained: Mapping[int, float], now: float) -> Standing | None:
    """What attained-service preemption needs to know of a running job, asker aside: its queue
    now and what stopping it loses (its GPUs x (work since its last checkpoint + the restart
    cost), GPU-seconds); None when no asker may take it whatever its rank (it does not
    checkpoint, or has not had its minimum slice since it last started). Worked out once per
    job and cycle by the scheduler (`_Cycle._standing_of`), not once per asker."""
    checkpoint = victim.last_checkpoint_at
    if checkpoint is None or now - victim.started_at < ordering.min_slice_s:
        return None
    slices = victim.allocation.slices
    # `Allocation.gpu_count` (a sum over the slices from 0: the same float for one slice).
    gpus = len(slices[0].gpu_indices) * slices[0].share if len(slices) == 1 else victim.allocation.gpu_count
    queue = ordering.queue_of(attained.get(victim.job_id, 0.0) + gpus * max(0.0, now - victim.started_at))
    return queue, gpus * (now - checkpoint + ordering.restart_cost_s)


def takes(rank: float, victim: Standing, ordering: Ordering) -> bool:
    """`may_take` from the victim's `standing`: it is in a later queue than `rank`, and its loss
    is within that rank's allowance."""
    queue, lost = victim
    return queue > rank and lost <= ordering.allowance(rank)


def may_be_taken_standing(victim: Standing | None, ordering: Ordering) -> bool:
    """`may_be_taken` from the victim's `standing` (see there)."""
    if victim is None:
        return False
    queue, lost = victim
    return queue != 0 and lost <= ordering.queues[queue - 1]


def may_be_taken(victim: RunningJob, ordering: Ordering, attained: Mapping[int, float], now: float) -> bool:
    """Whether any queued job (of the victim's class) could preempt `victim` for attained service:
    `may_take` for the most favoured asker: of the queues before the victim's (only those may
    take it), the last, whose allowance is the largest. O(1) a job, so a full cluster with no
    such job skips ordering its queue (tests/unit/test_scheduler_attained.py checks it exact)."""
    if ordering.mode != "las" or not ordering.preempt:
        return False
    return may_be_taken_standing(standing(victim, ordering, attained, now), ordering)


def may_take(rank: float, victim: RunningJob, ordering: Ordering, attained: Mapping[int, float], now: float) -> bool:
    """Whether a queued job of `rank` may preempt `victim` (of the same class) for attained
    service: the victim is in a later queue, checkpoints, has had its minimum slice since it last
    started (anti-thrash), and losing its unsaved work and its restart costs no more GPU-time
    than the preemptor's allowance at its rank (see `Ordering`)."""
    if ordering.mode != "las" or not ordering.preempt:
        return False
    st = standing(victim, ordering, attained, now)
    return st is not None and takes(rank, st, ordering)
