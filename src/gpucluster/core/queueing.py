"""The order jobs are considered in: aged jobs, then priority class, then fair share, then age.

Each team has its own FIFO queue; within a priority class the next job comes from the team
furthest below its fair share (decayed usage divided by its entitled share). A job started in
this cycle charges its team at once, so one cycle interleaves teams instead of handing every
free GPU to whichever team was lowest when the cycle began.

This runs once per queued job per cycle (100,000 times at scale), so the hot path avoids
per-job allocations it can: a team's fair-share ratio is kept until it changes, and a team put
back in line is compared with the heap's top before touching the heap (while nothing starts,
the same team stays first and the heap is never reordered).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, count, groupby, repeat
from operator import and_, attrgetter, is_, ne, not_

from gpucluster.core.policy import Policy
from gpucluster.core.types import JobRequest

# How much a start charges its team, in GPU-seconds per GPU, when the job has no time limit.
CHARGE_HORIZON_S = 3600.0

# (fair-share ratio, head's rank, head's submitted_at, head's job_id, team); the rank is 0 but
# with an attained-service ordering (core/attained.py), where it breaks ties of fair share.
_Entry = tuple[float, float, float, int, str]


def by_age(jobs: Iterable[JobRequest]) -> list[JobRequest]:
    """Oldest first, ties by job id. Two stable sorts on one plain number each, not one on a
    (submitted_at, job_id) tuple: the same order, three times faster at 100,000 jobs (no
    tuple per job, and the job-id pass costs nothing when the jobs come in id order)."""
    return sorted(sorted(jobs, key=attrgetter("job_id")), key=attrgetter("submitted_at"))


_job_id = attrgetter("job_id")
_DEMAND = attrgetter("demand")


def _by_rank(jobs: list[JobRequest], ranks: Mapping[int, float]) -> list[JobRequest]:
    """`jobs` (by age) stably sorted by rank, a job `ranks` does not name ranking 0."""
    return _by_keys(jobs, list(map(ranks.get, map(_job_id, jobs), repeat(0.0))))


def _by_keys(jobs: list[JobRequest], keys: list[float]) -> list[JobRequest]:
    """`jobs` stably sorted by `keys` (one per job, in the same order)."""
    return list(map(jobs.__getitem__, sorted(range(len(jobs)), key=keys.__getitem__)))


# A cycle's request under attained-service preemption (`scheduler._Cycle.run`): (demand, queue).
Request = tuple[tuple[object, ...], float]
# Distinct requests a `RankedLines` numbers before it starts again (`RequestIds`): a head meets a
# few thousand; this bounds a long-lived one's table should requests keep changing.
REQUEST_IDS_LIMIT = 1 << 18


class RequestIds(dict[Request, int]):
    """Request -> a number of its own, given on first look-up (one table, kept across cycles
    by `RankedLines`). Why: the cycle answers most jobs from an earlier one with the same request
    (`scheduler._AfterPreemptor.skip_same`), and looking up a request made of a job's demand and
    rank cost ~2 us a job (the job, its demand and its rank read, a 12-field tuple hashed and
    compared): a number per job kept with its line is a C-speed look-up in an int dict."""

    __slots__ = ()

    def __missing__(self, key: Request) -> int:
        got = self[key] = len(self)
        return got


# A sorted line's requests' numbers, job ids and queues, in line order, and the table numbering
# them. Queues as ints: a request (demand, 1) is the request (demand, 1.0) the cycle looks up
# (equal, and hashed alike), and small ints are shared objects, not one float made per job.
LineRequests = tuple[list[int], list[int], list[int], RequestIds]
# A sorted line's job ids and queues, in line order.
_Known = tuple[list[int], list[int]]


def numbered(
    line: list[JobRequest], ranks: Mapping[int, float], ids: RequestIds, known: _Known | None = None
) -> LineRequests:
    """The number (in `ids`) of each job's request in `line` under `ranks`, its id and its queue
    (`known`: the ids and queues, from the sort that made `line`)."""
    jids, queues = known if known is not None else _ids_and_queues(line, ranks)
    return list(map(ids.__getitem__, zip(map(_DEMAND, line), queues, strict=True))), jids, queues, ids


def _ids_and_queues(line: list[JobRequest], ranks: Mapping[int, float]) -> _Known:
    jids = list(map(_job_id, line))
    return jids, list(map(int, map(ranks.get, jids, repeat(0.0))))


def _renumbered(
    line: list[JobRequest],
    ranks: Mapping[int, float],
    ids: RequestIds,
    was: list[JobRequest],
    then: LineRequests,
    known: _Known | None,
) -> LineRequests:
    """`RankedLines.requests` of `line`, from those of `was` (`then`): a job of `was` (the same
    object) keeps its id, and its number while its queue is the one it had; the others are read.
    `known`: the ids and queues of `line`, from the sort that made it (no rank looked up)."""
    where = dict(zip(map(id, was), count()))
    at = list(map(where.get, map(id, line), repeat(-1)))  # -1: not in `was` (read below)
    new = list(compress(count(), map((-1).__eq__, at)))
    if known is not None:
        jids, queues = known
    else:
        jids = list(map(then[1].__getitem__, at))
        for i in new:
            jids[i] = line[i].job_id
        queues = list(map(int, map(ranks.get, jids, repeat(0.0))))
    numbers = list(map(then[0].__getitem__, at))
    for i in {*new, *compress(count(), map(ne, queues, map(then[2].__getitem__, at)))}:
        numbers[i] = ids[(line[i].demand, queues[i])]
    return numbers, jids, queues, ids


class RankedLines:
    """Each team line sorted by rank, kept across cycles by the caller (core/rank_book.py's
    book holds one): a line whose jobs (the same objects, by age) and ranks are those of the
    last cycle is the list sorted then. Why: under `runtime_model: gittins` every line holds
    ranked jobs and was sorted again each cycle (~5 CPU-s of whole Philly), yet ~5 in 6 were
    unchanged (a few jobs come, go or are ranked again a cycle). Not thread-safe; the lists it
    hands out are read only (`TeamQueues` copies them into its deques).

    Ranks the owner's book handed out (`tell`) are known unchanged for a team's jobs while its
    stamp is older than the line's sort, so such a line is checked by identity alone (a pass
    over pointers, no job read). Why: reading every queued job's rank each cycle to compare the
    lines (a dict look-up per job, the jobs scattered in memory) was ~7% of whole Philly under
    `las-gittins`, more than the sorts it saved."""

    __slots__ = ("_lines", "_requests", "_sorted", "_told", "request_ids")

    def __init__(self) -> None:
        # (level, team) -> (the line by age, its ranks in that order, the line by rank, the
        # book's clock when it was sorted, or -1: ranks not from the book)
        self._lines: dict[tuple[int, str], tuple[list[JobRequest], list[float], list[JobRequest], int]] = {}
        # (level, team) -> (the line by rank, its `requests`): kept while that line is handed out.
        self._requests: dict[tuple[int, str], tuple[list[JobRequest], LineRequests]] = {}
        # (level, team) -> (the line `sort` made last, its job ids and ranks in that order), for
        # `requests`: what the sort read, so the requests look up no rank again.
        self._sorted: dict[tuple[int, str], tuple[list[JobRequest], list[int], list[float]]] = {}
        self.request_ids = RequestIds()
        # (the ranks the book handed out last, team -> the book's clock when a rank of one of
        # its queued jobs last changed, the clock then, the clock of its last start again)
        self._told: tuple[Mapping[int, float], Mapping[str, int], int, int] | None = None

    def tell(self, ranks: Mapping[int, float], stamps: Mapping[str, int], clock: int, since: int) -> None:
        """The book's answer of this cycle, `ranks` (the very object it handed out); `stamps[team]`:
        the last value of `clock` at which a rank of one of `team`'s queued jobs may have
        changed (a team not named: none since `since`, when the book last started again)."""
        self._told = (ranks, stamps, clock, since)

    def line(self, level: int, team: str, jobs: list[JobRequest], ranks: Mapping[int, float]) -> list[JobRequest]:
        """`jobs` itself when `ranks` names none of them (all rank 0: sorting changes nothing),
        else `sort`. A line the book has named no rank of since it was last handed out (the very
        list, its team not stamped since) is that answer again, without reading a job.

        Why: under plain `las` most lines hold no job that ran before, and finding that out
        read every queued job's id each cycle (the set test over each line: ~4% of whole
        Philly under `default`), though the lines and their ranks rarely change between cycles.
        Exact: a line's answer reads only its jobs and their ranks; the same jobs are the very
        objects in the same order (by identity, as `sort` compares them: a list the queue index
        hands out again is never mutated, and ~9 in 10 new lists hold the same jobs, the index
        having merged its requeued jobs in again), and an unstamped team's queued jobs have the
        ranks they had (`RankBook`'s stamps)."""
        kept = self._lines.get((level, team))
        told = self._told
        clock = -1
        if told is not None and told[0] is ranks:
            clock = told[2]
            if (
                kept is not None
                and told[3] <= kept[3]
                and told[1].get(team, -1) <= kept[3]
                and (kept[0] is jobs or (len(kept[0]) == len(jobs) and all(map(is_, kept[0], jobs))))
            ):
                if kept[0] is not jobs:  # the list handed out now: next time, known by identity
                    self._lines[(level, team)] = (jobs, *kept[1:])
                return kept[2]
        if not ranks.keys().isdisjoint(map(_job_id, jobs)):
            return self.sort(level, team, jobs, ranks)
        # Keys of rank 0: what `sort` would compare the same jobs' keys with (and sort them as).
        self._lines[(level, team)] = (jobs, [0.0] * len(jobs), jobs, clock)
        return jobs

    def numbering(self) -> RequestIds:
        """The table `requests` numbers by, for one cycle (each cycle asks once, before any
        `requests`): numbered afresh past `REQUEST_IDS_LIMIT`, every kept number dropped with it."""
        if len(self.request_ids) > REQUEST_IDS_LIMIT:
            self.request_ids = RequestIds()
            self._requests.clear()
        return self.request_ids

    def requests(self, level: int, team: str, line: list[JobRequest], ranks: Mapping[int, float]) -> LineRequests:
        """The number (`request_ids`) of each job's request in `line` (as `line` or `sort` handed
        it out for `level` and `team` this cycle, ranked by `ranks`) and its job id, in line order.

        Why kept: at 100,000 queued half the team lines are the very lists of the last cycle
        (`line` and `sort` hand a list back only for the same jobs with the same ranks, so the
        same requests), and in the other half most jobs are the same objects with the same
        queue (a few jobs come, go or are ranked again a cycle). Those are matched to the
        numbers worked out last time by identity (`id`, which reads no job: the kept line
        holds its jobs, so no address is reused meanwhile) and checked by their queue now; only
        the rest are read (a job's demand read and hashed was ~2 us, most of it cache misses)."""
        key = (level, team)
        ids = self.request_ids
        kept = self._requests.get(key)
        if kept is not None and kept[0] is line and kept[1][3] is ids:
            return kept[1]
        made = self._sorted.pop(key, None)
        known = (made[1], list(map(int, made[2]))) if made is not None and made[0] is line else None
        if kept is not None and kept[1][3] is ids and kept[0]:
            got = _renumbered(line, ranks, ids, kept[0], kept[1], known)
        else:
            got = numbered(line, ranks, ids, known)
        self._requests[key] = (line, got)
        return got

    def sort(self, level: int, team: str, jobs: list[JobRequest], ranks: Mapping[int, float]) -> list[JobRequest]:
        """`_by_rank(jobs, ranks)`."""
        kept = self._lines.get((level, team))
        # Identity, not `==`: another object equal to a kept one is not the one to hand back.
        same = kept is not None and len(kept[0]) == len(jobs) and (kept[0] is jobs or all(map(is_, kept[0], jobs)))
        told = self._told
        clock = -1
        if told is not None and told[0] is ranks:
            clock = told[2]
            if same and kept is not None and told[3] <= kept[3] and told[1].get(team, -1) <= kept[3]:
                return kept[2]  # the same jobs, none of them ranked again since that sort
        jids = list(map(_job_id, jobs))
        keys = list(map(ranks.get, jids, repeat(0.0)))
        if same and kept is not None and kept[1] == keys:
            if clock != kept[3]:
                self._lines[(level, team)] = (*kept[:3], clock)
            return kept[2]
        order = sorted(range(len(jobs)), key=keys.__getitem__)  # `_by_keys`
        out = list(map(jobs.__getitem__, order))
        self._lines[(level, team)] = (jobs, keys, out, clock)
        self._sorted[(level, team)] = (out, list(map(jids.__getitem__, order)), list(map(keys.__getitem__, order)))
        return out


Sorted = tuple[list[JobRequest], list[JobRequest], dict[int, dict[str, list[JobRequest]]]]
# What `TeamQueues` reads of one: a level's lines are looked up only when its walk gets there
# (`queue_index.YoungLines`), and a level may have none.
Presorted = tuple[list[JobRequest], list[JobRequest], Mapping[int, dict[str, list[JobRequest]]]]


def sort_in(
    queued: Iterable[JobRequest], policy: Policy, now: float, guaranteed: Callable[[JobRequest], bool] | None
) -> Sorted:
    """The queued jobs sorted in: (held back, aged, {level: {team: jobs}}), each list by age.

    Levels: guaranteed demand first (quota is reclaimed from borrowers whatever their class),
    then priority class within each. The jobs are put into their lists in the order they are
    stored in and sorted after, not before: the same order (stable sorts on the same key), but
    this pass reads them in memory order, not scattered by age (cache misses were half its cost).
    """
    aged: list[JobRequest] = []
    held: list[JobRequest] = []
    buckets: dict[int, dict[str, list[JobRequest]]] = {}
    starvation = policy.starvation_age_s
    priorities = policy.priorities
    for job in queued:
        if job.not_before is not None and job.not_before > now:
            held.append(job)
            continue
        entered = job.queued_at
        if now - (job.submitted_at if entered is None else entered) >= starvation:
            aged.append(job)
            continue
        level = int(job.priority) if priorities else 0
        if guaranteed is not None and guaranteed(job):
            level += GUARANTEED_LEVEL
        teams = buckets.get(level)
        if teams is None:
            teams = buckets[level] = {}
        jobs = teams.get(job.team)
        if jobs is None:
            jobs = teams[job.team] = []
        jobs.append(job)
    return (
        by_age(held),
        by_age(aged),
        {level: {team: by_age(jobs) for team, jobs in per.items()} for level, per in buckets.items()},
    )


# Where a guaranteed job's level is put: above every class (`sort_in`).
GUARANTEED_LEVEL = 10


def sort_in_plain(queued: Sequence[JobRequest], policy: Policy, now: float) -> Sorted:
    """`sort_in` without quotas, with no Python code run per job for the plain ones (never
    requeued, not held back): thousands of them are sorted in every cycle, and a loop over them
    was the largest cost of a simulated cycle once the scheduler stopped early. The passes are
    attribute getters, `compress`, sorts and `groupby`, all at C speed:
    - plain jobs entered the queue when submitted, so sorted by age the aged ones are a prefix
      (`now - submitted_at` only shrinks along it), found by bisection;
    - the rest are grouped by (class, team) with one stable sort, which keeps each group by age.
    The few others go through `sort_in` and are merged by age. Same lists as `sort_in`."""
    plain_mask = list(
        map(
            and_,
            map(is_, map(attrgetter("queued_at"), queued), repeat(None)),
            map(is_, map(attrgetter("not_before"), queued), repeat(None)),
        )
    )
    plain = by_age(compress(queued, plain_mask))
    starvation = policy.starvation_age_s
    cut = bisect_left(plain, True, key=lambda j: now - j.submitted_at < starvation)
    aged, rest = plain[:cut], plain[cut:]
    held: list[JobRequest] = []
    odd = list(compress(queued, map(not_, plain_mask)))
    if odd:
        held, odd_aged, odd_buckets = sort_in(odd, policy, now, None)
        if odd_aged:
            aged = by_age(aged + odd_aged)
        others = [j for per in odd_buckets.values() for jobs in per.values() for j in jobs]
        if others:
            rest = by_age(rest + others)
    buckets: dict[int, dict[str, list[JobRequest]]] = {}
    if policy.priorities:
        rest.sort(key=attrgetter("priority", "team"))
        for (priority, team), group in groupby(rest, attrgetter("priority", "team")):
            buckets.setdefault(int(priority), {})[team] = list(group)
    elif rest:
        rest.sort(key=attrgetter("team"))
        buckets[0] = {team: list(group) for team, group in groupby(rest, attrgetter("team"))}
    return held, aged, buckets


class TeamQueues:
    def __init__(
        self,
        queued: Iterable[JobRequest],
        policy: Policy,
        usage: Mapping[str, float],
        now: float,
        guaranteed: Callable[[JobRequest], bool] | None = None,
        presorted: Presorted | None = None,
        ranks: Mapping[int, float] | None = None,
        lines: RankedLines | None = None,
    ) -> None:
        """`guaranteed`: jobs that fit within their team's guaranteed quota go before any
        borrower, so a guarantee is met in the cycle its demand appears (None: no quotas).
        `presorted`: what `sort_in_plain` would give for `queued`, from a `QueueIndex` (a
        level may map to no line: it is passed over).
        `ranks`: job id -> rank inside its team's line (core/attained.py), lower first, ties by
        age, a job it does not name ranking 0; None (`age` ordering): by age alone, and no
        per-job work here. `lines`: the lines sorted by rank in earlier cycles, kept by the caller."""
        self.policy = policy
        self.usage = dict(usage)
        jobs = queued if isinstance(queued, (list, tuple)) else list(queued)
        if presorted is not None:
            held, aged, buckets = presorted
        elif guaranteed is None:
            held, aged, buckets = sort_in_plain(jobs, policy, now)
        else:
            held, aged, buckets = sort_in(jobs, policy, now, guaranteed)
        self.held = held  # not to be considered yet (`not_before` in the future)
        self._ranks = ranks or None
        # Each team's line is by age; a stable sort by rank keeps age within a rank. The aged
        # jobs stay by age: the starvation age goes before any ranking. A line with no job
        # `ranks` names (all of rank 0) is left as it is: sorting it changes nothing. New
        # lists: `presorted`'s belong to the caller's QueueIndex. Done per level when the walk
        # reaches it (`_next_level`), not here: see `_ranked`.
        self._rank_line = lines.line if ranks and lines is not None else None
        # With kept lines, each line's requests numbered (`front_requests`); the cycle's table.
        self._line_requests = lines.requests if ranks and lines is not None else None
        self.request_ids = lines.numbering() if ranks and lines is not None else None
        self._requests: dict[str, LineRequests] = {}  # the current level's, by team, once asked
        # A team's line is copied into a deque (`pop` takes from its front) only when it is
        # first popped from (`_line`): most cycles pop from a few teams' lines, and copying
        # every line, each cycle, was ~1% of whole Philly under `las`.
        self._aged = deque(aged)
        self._buckets = buckets
        self._levels = sorted(buckets, reverse=True)
        self._lines: dict[str, list[JobRequest]] = {}  # the current level's, by team (the caller's)
        self._queues: dict[str, deque[JobRequest]] = {}  # ... those popped from, as they are now
        self._heap: list[_Entry] = []
        self._level = -1
        self._shares: dict[str, float] = {}
        self._ratios: dict[str, float] = {}  # usage / share, dropped when the team is charged
        # Until the first level is reached: team -> its ratio when its entry would have been
        # made, had that level been entered here (see `_next_level`).
        self._frozen: dict[str, float] | None = {}
        self._popped_team: str | None = None  # the team of the last job popped: not in the heap
        self._done = False  # `done` was called for that job

    def _ratio(self, team: str) -> float:
        if not self.policy.fair_share:
            return 0.0
        share = self._shares.get(team)
        if share is None:
            share = self._shares[team] = max(self.policy.share(team), 1e-9)
        return self.usage.get(team, 0.0) / share

    def _entry(self, team: str, head: JobRequest, ratio: float | None = None) -> _Entry:
        """`team`'s place in the heap with `head` first in its line; `ratio`: its ratio as of
        an earlier charge (`_frozen`), else its current one."""
        if ratio is None:
            ratio = self._ratios.get(team)
            if ratio is None:
                ratio = self._ratios[team] = self._ratio(team)
        ranks = self._ranks
        return (ratio, ranks.get(head.job_id, 0.0) if ranks else 0.0, head.submitted_at, head.job_id, team)

    def _next_level(self) -> bool:
        """Enter the next level that has a job: its team lines (`_ranked`) and its heap.

        Why here, not in `__init__`: about half the cycles of whole Philly consider one job (an
        aged one that cannot start, reserves its model, and no one after it can pass:
        `scheduler._Cycle._settled`) and never reach a level, yet ranking every level's lines
        and heaping the first was a large part of each such cycle. Exact: a line reads only its
        jobs and `ranks`, fixed for the cycle. The first level's entries are those `__init__`
        would have made: a team charged since (`done` of an aged job that started, which
        renews no entry) keeps its ratio of then (`_frozen`), one `charge` renewed is made anew.
        """
        frozen = self._frozen
        self._frozen = None
        while self._level + 1 < len(self._levels):
            self._level += 1
            level = self._levels[self._level]
            self._lines = lines = self._ranked(level, self._buckets[level])
            self._queues = {}
            self._requests = {}
            entry = self._entry
            if frozen:
                entries = [entry(team, q[0], frozen.get(team)) for team, q in lines.items() if q]
            else:
                entries = [entry(team, q[0]) for team, q in lines.items() if q]
            if entries:
                # Entries are unique (job ids), so the heap's layout decides no order.
                heap = self._heap  # (empty: `pop` holds it)
                heap.extend(entries)
                heapq.heapify(heap)
                return True
        return False

    def _ranked(self, level: int, per: dict[str, list[JobRequest]]) -> dict[str, list[JobRequest]]:
        """A level's team lines, each sorted by rank (see `__init__`)."""
        ranks = self._ranks
        if ranks is None:
            return per
        line = self._rank_line
        if line is not None:
            return {team: line(level, team, jobs, ranks) for team, jobs in per.items()}
        named = ranks.keys()
        return {
            team: jobs if named.isdisjoint(map(_job_id, jobs)) else _by_rank(jobs, ranks) for team, jobs in per.items()
        }

    def pop(self) -> JobRequest | None:
        """The next job to consider; call `done` with it before the next `pop`."""
        if self._aged:
            self._popped_team = None
            return self._aged.popleft()
        team = self._popped_team
        heap = self._heap
        if team is not None and self._done:
            # The last job's team is back in line but not in the heap. Below every other team's
            # ratio it stays first (the ratio leads the entry, and ties are left to the heap), so
            # no entry is built: while nothing starts, a team's jobs come one after another.
            q = self._queues[team]
            if q:
                ratio = self._ratios.get(team)
                if ratio is None:
                    ratio = self._ratios[team] = self._ratio(team)
                if not heap or ratio < heap[0][0]:
                    self._done = False
                    return q.popleft()
                team = heapq.heappushpop(heap, self._entry(team, q[0]))[4]
                self._popped_team = team
                self._done = False
                return self._line(team).popleft()
        while not heap:
            if not self._next_level():
                self._popped_team = None
                return None
        team = heapq.heappop(heap)[4]
        self._popped_team = team
        self._done = False
        return self._line(team).popleft()

    def _line(self, team: str) -> deque[JobRequest]:
        """`team`'s line of the current level as a deque of its own (made on first use)."""
        q = self._queues.get(team)
        if q is None:
            q = self._queues[team] = deque(self._lines[team])
        return q

    def front(self) -> deque[JobRequest] | None:
        """The line the next `pop` certainly takes its job from, or None when that is not known
        without popping (a tie with another team, a team not put back by `done`, a new level).

        A caller may take jobs off its front itself, each then counting as popped and put back
        by `done(job, False)`: the next `pop` would take the same line, and a job that did not
        start charges no one, so the line stays first. Why: a cycle answers most jobs from an
        earlier one with the same request (`scheduler._Cycle.run`), and each such job went
        through `pop` and `done` (16.6 M on whole Philly under `default`, most of them aged,
        where the walk's own cost was about a quarter of the run's)."""
        if self._aged:
            return self._aged  # the aged go first, by age; every pop before took from them too
        team = self._popped_team
        if team is None or not self._done:
            return None
        q = self._queues[team]
        if not q:
            return None
        ratio = self._ratios.get(team)
        if ratio is None:
            ratio = self._ratios[team] = self._ratio(team)
        heap = self._heap
        return q if not heap or ratio < heap[0][0] else None  # `pop`'s own test

    def front_requests(self) -> tuple[deque[JobRequest], list[int], list[int], int] | None:
        """`front`'s line when it is a team line sorted by kept lines (`RankedLines`), with its
        requests' numbers and job ids (`RankedLines.requests`, in the order of the line as
        handed out) and where the line as popped so far starts in them; else None."""
        get = self._line_requests
        q = self.front()
        if get is None or q is None or q is self._aged:
            return None
        team = self._popped_team
        assert team is not None  # `front` found its line
        got = self._requests.get(team)
        if got is None:
            assert self._ranks is not None  # kept lines are read with ranks only
            got = self._requests[team] = get(self._levels[self._level], team, self._lines[team], self._ranks)
        return q, got[0], got[1], len(got[0]) - len(q)

    def done(self, job: JobRequest, started: bool) -> None:
        """Put the job's team back in line, charged for the job if it started."""
        if started:
            self._charge(job)
        self._done = True

    def charge(self, job: JobRequest) -> None:
        """Charge the team for a job that started out of turn: one put back in line (`done`)
        earlier and considered later (a preempted job waits for its preemptor, `scheduler`).
        Its team may already be in the heap with its old ratio; that entry is renewed."""
        self._charge(job)
        team = job.team
        if self._frozen is not None:
            self._frozen.pop(team, None)  # no level entered yet: its entry will be renewed then
            return
        if team == self._popped_team:
            return  # not in the heap: `pop` reads its ratio afresh
        for i, (*_, name) in enumerate(self._heap):
            if name == team:
                q = self._queues.get(team)
                self._heap[i] = self._entry(team, q[0] if q is not None else self._lines[team][0])
                heapq.heapify(self._heap)
                return

    def _charge(self, job: JobRequest) -> None:
        frozen = self._frozen
        if frozen is not None and job.team not in frozen:
            # No level entered yet (`_next_level`): the team's entry keeps the ratio it has now.
            ratio = self._ratios.get(job.team)
            frozen[job.team] = self._ratio(job.team) if ratio is None else ratio
        limit = job.time_limit_s or CHARGE_HORIZON_S
        self.usage[job.team] = self.usage.get(job.team, 0.0) + job.gpus * min(limit, CHARGE_HORIZON_S)
        self._ratios.pop(job.team, None)
