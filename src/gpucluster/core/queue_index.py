"""A queue index a caller keeps across scheduling cycles, so `decide` does not sort every queued
job into its team's line again each cycle.

Why: sorting the queue in (`queueing.sort_in_plain`) is O(queued jobs) a cycle, with sorts,
even at C speed ~0.5 us a job, and in the simulator a cycle is asked for at every arrival while
thousands of jobs wait: on Philly it was most of the time once the scheduler stopped early
(`decide(..., reasons=False)`). Between two cycles only a few jobs come or go. The index keeps
the last cycle's jobs sorted by age, overall and per (class, team), and applies the difference:
jobs gone are removed, jobs new (or replaced by another object) are inserted, by bisection. A
cycle then only cuts each sorted list where jobs have aged (a bisection) and copies the parts,
a level's lists only when its walk reaches them (`sorted_lazily`).

Only "plain" jobs are kept sorted (never requeued, not held back: they entered the queue when
they were submitted, so the aged ones are a prefix of each list); the few others are sorted in
each cycle by `queueing.sort_in` and merged by bisection. Without quotas only: the guaranteed
level depends on each cycle's quota use (`decide` then sorts in without the index).

`decide` stays a pure function of its snapshot: the lists handed out equal
`sort_in_plain(snapshot.queued, ...)` whatever the index saw before (the unit tests check this
over random histories). Jobs are matched by object identity: the index holds the objects of
the last cycle, so an identity is never reused meanwhile. Not thread-safe; one caller, one index.

A caller that knows what came and went (the simulator: its own enqueue and start) builds the index
with `told=True` and calls `add` / `remove` as jobs enter and leave its queue; `update` then
applies those changes instead of diffing the whole queue, which was the largest cost left per
cycle on Philly (~0.4 ms a cycle at ~6,000 queued jobs). The promise is checked by count: when the
queue handed to `update` does not hold as many jobs as the index after the changes, the index falls
back to the diff, so a plan never depends on the caller being right about the count.
"""

from __future__ import annotations

import sys
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from functools import partial
from operator import attrgetter, is_not
from typing import NamedTuple

from gpucluster.core.counts import bump
from gpucluster.core.policy import Policy
from gpucluster.core.queueing import Sorted, sort_in
from gpucluster.core.split_kept import KeptSplit
from gpucluster.core.types import JobRequest

# Moves kept for a follower (`QueueIndex.follow`) that has not taken them: past this many it is
# taken to have stopped following, and recording stops (it would grow without end).
MOVES_LIMIT = 1 << 16

_age = attrgetter("submitted_at", "job_id")  # the order of `queueing.by_age`, as one key
_SUBMITTED = attrgetter("submitted_at")
_PRIORITY = attrgetter("priority")
# Up to this many jobs entering at once are inserted one by one (`_ByAge.add_all` beyond).
_FEW_ADDS = 64
_NO_CHANGE = sys.maxsize  # `_ByAge.low` when nothing came or went
_NO_JOBS: tuple[JobRequest, ...] = ()  # no odd jobs for a line (one object: `_part` compares by identity)


class Asked(NamedTuple):
    """Bounds over a set of queued jobs that say whether any of them could still start
    (`scheduler._Cycle._settled`, `_nothing_can_change`)."""

    need: float  # the fewest GPUs any could start with (below 1: a share; 0: a CPU-only job)
    shortest: float  # the shortest time limit any has
    # Whether any may take fewer GPUs on one node than a size below: split over a set number
    # of nodes, or elastic (it starts at any size between its least and what it asks).
    loose: bool
    sizes: tuple[float, ...]  # the whole-GPU counts asked, ascending


def least_asked(jobs: Collection[JobRequest], default_limit: float) -> Asked:
    """`Asked` of `jobs`: a share by memory takes part of one GPU, whatever it asks; a time
    limit of None or 0 is `default_limit`. The passes are over attribute getters, C speed."""
    need = min(map(attrgetter("gpus"), jobs), default=float("inf"))
    need = min(need, min(filter(partial(is_not, None), map(attrgetter("min_gpus"), jobs)), default=need))
    if need >= 1 and any(map(partial(is_not, None), map(attrgetter("gpu_memory_mb"), jobs))):
        need = 0.5
    stated = list(filter(None, map(attrgetter("time_limit_s"), jobs)))
    shortest = min(stated, default=default_limit)
    if len(stated) < len(jobs):
        shortest = min(shortest, default_limit)
    loose = any(map(_loose, jobs))
    return Asked(need, shortest, loose, tuple(sorted({g for g in map(attrgetter("gpus"), jobs) if g >= 1})))


def _loose(job: JobRequest) -> bool:
    return (job.nodes is not None and job.nodes > 1) or (job.min_gpus is not None and job.min_gpus < job.gpus)


class QueueIndex:
    def __init__(self, told: bool = False) -> None:
        self.rebuilds = 0  # full builds (first use, or the policy's classes changed): for tests
        self.diffs = 0  # updates that diffed the whole queue (told: first use, or a count mismatch)
        self._told = told  # the caller reports each job that enters or leaves (`add`, `remove`)
        self._changes: list[tuple[bool, JobRequest]] = []  # (entered?, job) since the last update
        # What entered and left, as applied, for one follower (core/rank_book.py; `follow`):
        # None while nobody follows, and once a rebuild made it no full record or it grew past
        # MOVES_LIMIT (a follower that stopped asking: a head whose policy left Gittins ranks,
        # or whose plans were handed another queue): recording stops until `follow` again.
        self._moves: list[tuple[bool, JobRequest]] | None = None
        # Its lines split by guarantee, kept across cycles (with quotas: `scheduler._Cycle.run`).
        self.split = KeptSplit()
        self._reset(None)

    def follow(self) -> None:
        """Start recording the jobs that enter and leave (`take_moves`), for one follower."""
        self._moves = []

    def take_moves(self) -> list[tuple[bool, JobRequest]] | None:
        """(entered?, job) for each job that entered or left since `follow` or the last call, in
        order, or None when they are not known (nobody followed, or the index was rebuilt)."""
        moves = self._moves
        if moves is None:
            return None
        self._moves = []
        return moves

    def _reset(self, priorities: bool | None) -> None:
        self._moves = None  # no full record from here: the follower starts again
        self._jobs: dict[int, JobRequest] = {}  # id(job) -> job, every job of the last update
        self._priorities = priorities  # whether classes split the lines it keeps
        self._plain = _ByAge()  # plain jobs
        self._lines: dict[tuple[int, str], _ByAge] = {}  # (level, team) -> its plain jobs
        self._odd: dict[int, JobRequest] = {}  # id(job) -> a requeued or held-back job
        # The odd jobs sorted in, with the policy and the span of `now` it holds for (see `_odd_in`).
        self._odd_sorted: tuple[Policy, float, float, Sorted] | None = None
        # What `_Cycle._least_asked` bounds, over every queued job, as counts per value.
        self._gpus: Counter[float] = Counter()
        self._min_gpus: Counter[int] = Counter()
        self._limits: Counter[float | None] = Counter()
        self._memory = 0  # jobs asking for a share by memory
        self._loose = 0  # jobs `Asked.loose` counts
        self._classes: Counter[int] = Counter()  # priority classes, for `highest_class`
        # `_part`'s lists by line (None: the aged), with what each was made from.
        self._parts: dict[tuple[int, str] | None, tuple[int, int, Sequence[JobRequest], list[JobRequest]]] = {}

    # ---- keeping up -------------------------------------------------------------------------

    def update(self, queued: Sequence[JobRequest], policy: Policy) -> None:
        """Bring the index to these queued jobs: the changes the caller reported (told), or the
        difference with the last call (`_diff`), then one insertion or removal per job."""
        if policy.priorities != self._priorities:
            self._reset(policy.priorities)
            self.rebuilds += 1
            self._changes.clear()  # the diff below builds everything from `queued`
        elif self._told:
            self._apply_changes()
            if len(self._jobs) == len(queued):
                return
        self.diffs += 1
        self._diff(queued)

    def add(self, job: JobRequest) -> None:
        """A told index: `job` entered the caller's queue (applied at the next `update`)."""
        if self._told:
            self._changes.append((True, job))

    def remove(self, job: JobRequest) -> None:
        """A told index: `job` (this very object) left the caller's queue."""
        if self._told:
            self._changes.append((False, job))

    def _apply_changes(self) -> None:
        """The changes the caller reported, in order; an object entered twice or leaving while
        never in is ignored (the count check in `update` then sends a wrong report to the diff).
        Only entries (a head's first plan after a start: every queued job, told by
        `ClusterState.build`): each sorted list takes its jobs at once (`_ByAge.add_all`)."""
        jobs = self._jobs
        if len(self._changes) > _FEW_ADDS and all(entered for entered, _ in self._changes):
            pending: dict[_ByAge, list[JobRequest]] = {}
            for _, job in self._changes:
                key = id(job)
                if key not in jobs:
                    jobs[key] = job
                    self._add(key, job, pending)
            for line, new in pending.items():
                line.add_all(new)
            self._changes.clear()
            return
        for entered, job in self._changes:
            key = id(job)
            if entered:
                if key not in jobs:
                    jobs[key] = job
                    self._add(key, job)
            elif jobs.get(key) is job:
                self._remove(key, jobs.pop(key))
        self._changes.clear()

    def _diff(self, queued: Sequence[JobRequest]) -> None:
        """The jobs that came or went since the last update, found by identity at C speed."""
        ids = set(map(id, queued))
        jobs = self._jobs
        for key in jobs.keys() - ids:
            self._remove(key, jobs.pop(key))
        came = ids - jobs.keys()
        if came:
            # Callers append what they add (the simulator's queue is a dict in arrival order),
            # so new jobs are looked for from the end, and the scan stops once all are found.
            left = len(came)
            pending: dict[_ByAge, list[JobRequest]] | None = {} if left > _FEW_ADDS else None
            for job in reversed(queued):
                key = id(job)
                if key in came and key not in jobs:
                    jobs[key] = job
                    self._add(key, job, pending)
                    left -= 1
                    if not left:
                        break
            for line, new in (pending or {}).items():
                line.add_all(new)

    def _level(self, job: JobRequest) -> tuple[int, str]:
        return (int(job.priority) if self._priorities else 0, job.team)

    def _record(self, entered: bool, job: JobRequest) -> None:
        moves = self._moves
        if moves is not None:
            if len(moves) < MOVES_LIMIT:
                moves.append((entered, job))
            else:
                self._moves = None  # nobody keeps up with them: `take_moves` says so

    def _add(self, key: int, job: JobRequest, pending: dict[_ByAge, list[JobRequest]] | None = None) -> None:
        """`job` into the index; with `pending`, its sorted lists take it later (`add_all`)."""
        self._count(job, 1)
        if self._moves is not None:
            self._record(True, job)
        # A job whose queue entry is its submit (the head's store records `queued_at` at submit)
        # ages and sorts as one without it (`queueing.sort_in`), so it is plain: otherwise every
        # job at the head was odd, and sorted again at each change.
        entered = job.queued_at
        if (entered is not None and entered != job.submitted_at) or job.not_before is not None:
            self._odd[key] = job
            self._odd_sorted = None
            return
        line = self._lines.get(self._level(job))
        if line is None:
            line = self._lines[self._level(job)] = _ByAge()
        if pending is None:
            self._plain.add(job)
            line.add(job)
        else:
            pending.setdefault(self._plain, []).append(job)
            pending.setdefault(line, []).append(job)

    def _remove(self, key: int, job: JobRequest) -> None:
        self._count(job, -1)
        if self._moves is not None:
            self._record(False, job)
        if self._odd.pop(key, None) is not None:
            self._odd_sorted = None
            return
        self._plain.drop(job)
        line = self._lines[self._level(job)]
        line.drop(job)
        if not line.jobs:
            del self._lines[self._level(job)]
            self._parts.pop(self._level(job), None)

    def _count(self, job: JobRequest, sign: int) -> None:
        bump(self._gpus, job.gpus, sign)
        bump(self._limits, job.time_limit_s, sign)
        bump(self._classes, int(job.priority), sign)
        if job.min_gpus is not None:
            bump(self._min_gpus, job.min_gpus, sign)
        if job.gpu_memory_mb is not None:
            self._memory += sign
        if _loose(job):
            self._loose += sign

    # ---- one cycle --------------------------------------------------------------------------

    def sorted_in(self, policy: Policy, now: float) -> Sorted:
        """`queueing.sort_in_plain(queued, policy, now)` for the jobs of the last `update`.
        The lists are the index's (kept for the next cycle, `_part`): the caller reads them."""
        held, aged, levels = self.sorted_lazily(policy, now)
        return held, aged, {level: per for level in levels if (per := levels[level])}

    def sorted_lazily(self, policy: Policy, now: float) -> tuple[list[JobRequest], list[JobRequest], YoungLines]:
        """`sorted_in`, but each level's lines are cut and copied only when first asked for
        (`YoungLines`), and a level may map to no line at all (its jobs all aged).

        Why: `queueing.TeamQueues` enters a level only when its walk reaches it, and about a
        third of whole Philly's cycles reach none (an aged job first in line that stops the
        walk); cutting every line each cycle was ~3% of the run."""
        held: list[JobRequest] = []
        odd_aged: Sequence[JobRequest] = _NO_JOBS
        odd_buckets: dict[int, dict[str, list[JobRequest]]] = {}
        if self._odd:
            odd_held, odd_aged, odd_buckets = self._odd_in(policy, now)
            held = list(odd_held)
        plain = self._plain
        starvation = policy.starvation_age_s
        aged = self._part(None, plain, plain.young_from(now, starvation), odd_aged)
        return held, aged, YoungLines(self, now, starvation, odd_buckets)

    def _young(
        self, level: int, now: float, starvation: float, odd_buckets: dict[int, dict[str, list[JobRequest]]]
    ) -> dict[str, list[JobRequest]]:
        """The young part of each of `level`'s lines, by team (`sorted_in`'s lists of that level)."""
        out: dict[str, list[JobRequest]] = {}
        odd_level = odd_buckets.get(level, {})
        for (at, team), line in self._lines.items():
            if at != level:
                continue
            cut = line.young_from(now, starvation)
            odd = odd_level.get(team, _NO_JOBS)
            if cut < len(line.jobs) or odd:
                out[team] = self._part((level, team), line, cut, odd)
        for team, jobs in odd_level.items():  # lines of odd jobs alone
            if (level, team) not in self._lines:
                out[team] = jobs
        return out

    def _part(self, key: tuple[int, str] | None, line: _ByAge, cut: int, odd: Sequence[JobRequest]) -> list[JobRequest]:
        """The aged part of the plain jobs (`key` None: before `cut`) or the young part of a
        line (after `cut`), with the odd jobs of it merged in by age; the list made last time
        while the line, the cut and the odd jobs (the very list `_odd_in` kept) are the same.
        Why: each cycle copied every line and merged the odd jobs in again (under `las` on
        whole Philly ~150 requeued jobs a cycle, a sort of their lines: 5% of the run; under
        `default` the aged jobs, thousands, copied each cycle), though a cycle changes a line
        or two."""
        kept = self._parts.get(key)
        # The aged part is the line's first `cut` jobs: the same unless a job came or went
        # before it (new jobs are young: they come at the end); a young part, any change.
        same = kept is not None and kept[1] == cut and kept[2] is odd
        if kept is not None and same and (line.low >= cut if key is None else kept[0] == line.version):
            return kept[3]
        if key is None:
            line.low = _NO_CHANGE
        part = line.jobs[:cut] if key is None else line.jobs[cut:]
        if odd:
            # Many odd jobs go into a line by one sort of the two sorted runs (Timsort finds
            # them, at C speed; ~150 requeued jobs a cycle under `las` on whole Philly made 22 M
            # insorts), a few by an insort each (a sort reads every job's key: on the default
            # policy's long lines it cost more). Keys are unique (job ids): the same order either way.
            _merge(part, odd)
        self._parts[key] = (line.version, cut, odd, part)
        return part

    def _odd_in(self, policy: Policy, now: float) -> Sorted:
        """`sort_in` of the odd jobs, kept while they stay the same and `now` stays inside the
        span over which no job's held-back or aged state flips. Why: they are sorted in every
        cycle, with Python code per job, and on Philly the requeued jobs are tens each cycle.
        The span ends a little before each flip (a margin far above float rounding), so the
        kept lists are only ever those `sort_in` gives at `now`; past it they are sorted again."""
        kept = self._odd_sorted
        if kept is not None and kept[0] is policy and kept[1] <= now < kept[2]:
            return kept[3]
        got = sort_in(self._odd.values(), policy, now, None)
        starvation = policy.starvation_age_s
        until = float("inf")
        for job in self._odd.values():
            if job.not_before is not None and job.not_before > now:
                until = min(until, job.not_before)  # held while not_before > now: exact
            ages_at = (job.submitted_at if job.queued_at is None else job.queued_at) + starvation
            if ages_at > now:
                until = min(until, ages_at - 1e-6 - 1e-12 * abs(ages_at))
        self._odd_sorted = (policy, now, until, got)
        return got

    def highest_class(self) -> int | None:
        """The highest priority class of the jobs of the last `update` (None: no job)."""
        return max(self._classes, default=None)

    def gpus_asked(self) -> Counter[float]:
        """GPUs asked -> how many of the jobs of the last `update` ask that many (a new Counter)."""
        return self._gpus.copy()

    def least_asked(self, default_limit: float) -> Asked:
        """`least_asked` of the jobs of the last `update`, from counts kept per value."""
        need = min(self._gpus, default=float("inf"))
        need = min(need, min(self._min_gpus, default=need))
        if need >= 1 and self._memory:
            need = 0.5
        limits = [t or default_limit for t in self._limits]
        sizes = tuple(sorted(g for g in self._gpus if g >= 1))
        return Asked(need, min(limits, default=default_limit), self._loose > 0, sizes)


def _merge(line: list[JobRequest], jobs: Sequence[JobRequest]) -> None:
    """Put `jobs` (by age) into `line` (by age), keeping it by age."""
    if len(jobs) * 16 > len(line):
        line.extend(jobs)
        line.sort(key=_age)
    else:
        for job in jobs:
            insort(line, job, key=_age)


class _ByAge:
    """Plain jobs by age (`_age`), with their submission times in a list alongside. Why: each
    cycle finds where each line's aged jobs end, and a bisection over plain floats runs at C
    speed where one with a key function calls Python per step (tens of lines a cycle)."""

    __slots__ = ("jobs", "low", "times", "version")

    def __init__(self) -> None:
        self.jobs: list[JobRequest] = []
        self.times: list[float] = []
        self.version = 0  # changes with the jobs (`QueueIndex._part`)
        self.low = _NO_CHANGE  # the first place a job came or went since `_part` last reset it

    def add(self, job: JobRequest) -> None:
        i = bisect_right(self.jobs, _age(job), key=_age)  # where `insort` would put it
        self.jobs.insert(i, job)
        self.times.insert(i, job.submitted_at)
        self.version += 1
        self.low = min(self.low, i)

    def add_all(self, jobs: list[JobRequest]) -> None:
        """`add` each of `jobs`, in order. Many (an eighth of the list or more): appended and
        the list sorted once, which gives the same list (a stable sort keeps equal ages in the
        order `add`, inserting after its equals, would give). Why: an insertion moves every job
        after it, so a first update that adds a whole queue one by one was quadratic (a head's
        first plan after a start at 100,000 queued: the update took 3.2 CPU-s, now 0.45; bench/RESULTS.md)."""
        if len(jobs) * 8 < len(self.jobs):
            for job in jobs:
                self.add(job)
            return
        self.jobs += jobs
        self.jobs.sort(key=_age)
        self.times = list(map(_SUBMITTED, self.jobs))
        self.version += 1
        self.low = 0

    def drop(self, job: JobRequest) -> None:
        """Remove `job` (ages are unique: the job id breaks ties)."""
        jobs = self.jobs
        i = bisect_left(jobs, _age(job), key=_age)
        while jobs[i] is not job:  # another object with the same age (not in a valid queue)
            i += 1
        del jobs[i]
        del self.times[i]
        self.version += 1
        self.low = min(self.low, i)

    def young_from(self, now: float, starvation: float) -> int:
        """Where the young jobs begin: the first with `now - submitted_at < starvation`, the
        test `queueing.sort_in` makes. The bisection on `now - starvation` lands next to it
        (float rounding may differ by a step), and the exact test settles it: it only ever
        turns from false to true along the list."""
        times = self.times
        i = bisect_right(times, now - starvation)
        while i > 0 and now - times[i - 1] < starvation:
            i -= 1
        while i < len(times) and not now - times[i] < starvation:
            i += 1
        return i


class YoungLines(Mapping[int, dict[str, list[JobRequest]]]):
    """A cycle's young lines by level (`QueueIndex.sorted_lazily`): every level that has a
    line, each level's {team: jobs} worked out on first look-up and kept. Valid until the
    index's next `update` (the cycle's own lifetime)."""

    __slots__ = ("_done", "_index", "_now", "_odd", "_starvation")

    def __init__(
        self, index: QueueIndex, now: float, starvation: float, odd: dict[int, dict[str, list[JobRequest]]]
    ) -> None:
        self._index, self._now, self._starvation, self._odd = index, now, starvation, odd
        self._done: dict[int, dict[str, list[JobRequest]]] = {}

    def __getitem__(self, level: int) -> dict[str, list[JobRequest]]:
        got = self._done.get(level)
        if got is None:
            if level not in self._odd and all(at != level for at, _ in self._index._lines):
                raise KeyError(level)
            got = self._done[level] = self._index._young(level, self._now, self._starvation, self._odd)
        return got

    def __iter__(self) -> Iterator[int]:
        return iter({*(level for level, _ in self._index._lines), *self._odd})

    def __len__(self) -> int:
        return len({*(level for level, _ in self._index._lines), *self._odd})


def highest_queued_class(queued: Sequence[JobRequest], index: QueueIndex | None) -> int | None:
    """The highest priority class among `queued` (None: no job): the told index's count where it
    is given (kept up to date with `queued` by its `update`), else one pass over the jobs."""
    highest = index.highest_class() if index is not None else None
    if highest is None and queued:
        highest = int(max(map(_PRIORITY, queued)))
    return highest
