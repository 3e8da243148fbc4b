"""Gittins ranks kept across scheduling cycles: each cycle ranks again only the queued jobs
whose inputs changed (issues 15 and 25).

Why: under `runtime_model: gittins` every queued job was ranked every cycle
(`attained.gittins_ranks`): on whole Philly ~260 queued jobs, ~160 of which ran before, ~160 us
a cycle over ~143 k cycles, 26 of `las-gittins`'s ~86 CPU-s (`las` ranks: 8). Yet between two
cycles a few jobs come or go, a few similarity keys learn a run, a few jobs cross
`promote_after`. A queued job's rank is a function of its request (GPUs, submission and requeue
times), its attained GPU-seconds, its distribution, the ordering, and `now`; `now` enters only
through promotion, which, once crossed, stays crossed while time goes forward. So the book keeps
each queued job's rank, and each cycle:
- learns the jobs that entered, left or were replaced by another object from the snapshot's
  queue index (`QueueIndex.take_moves`: what its last updates applied), else by comparing the
  queue with what it kept (C-speed passes: 3-4 CPU-s of whole Philly, the moves ~0.5);
- reads whose attained service or distribution changed from those mappings' own logs
  (`Logged`: the head's and the simulator's maps are, head/kept_ranks.py and sim/learned.py,
  both through core/learned_kinds.py; a caller handing plain mappings gets
  `attained.gittins_ranks` every cycle, the same answer);
- ranks only those again (a few one by one, more through `gittins_ranks`: a job's rank reads
  only its own inputs). On whole Philly that is still ~40 jobs a cycle, 5.7 M in all: a
  finished run gives its key a new distribution, and every queued job of that key is ranked
  again (~750 k of them had run before; a new distribution reads the index of each whose
  attained time no new run exceeds from the last one, core/runtime_predict.py's `_Samples`,
  so ~250 k indexes are worked out);
- promotes, from a heap by the time each job entered the queue, the jobs now `promote_after`
  past it (`attained._promote`'s test, the same float operations).
The answer equals `attained.gittins_ranks` on the same inputs whatever the book saw before
(a time going back, another ordering, other mappings, or a log that overflowed: the book starts
again from `gittins_ranks`); tests/unit/test_rank_book.py checks that over random histories.

Caller-owned, like core/queue_index.py: one book per caller, per pair of mappings and per
index (`Logged` and the index's moves have one reader: the book takes them), not thread-safe;
`decide` only reads through it, so a trial plan needs no undo (every state it leaves is a valid
cache of what it saw).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import compress, count
from operator import attrgetter, is_not
from typing import Any, TypeVar

from gpucluster.core.attained import Ordering, _kind_rank, entered_queue, gittins_ranks
from gpucluster.core.attained import ranks as attained_ranks
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.queueing import RankedLines
from gpucluster.core.runtime_predict import RunDistribution
from gpucluster.core.types import JobRequest

V = TypeVar("V")
_JOB_ID = attrgetter("job_id")
_TEAM = attrgetter("team")
# A log longer than this is dropped and its reader told to start again (`Logged.take`): a map
# nobody reads (the simulator's attained map under plain `las`) must not grow without end.
LOG_LIMIT = 1 << 16
# Up to this many jobs to rank again are ranked one by one; more, through `gittins_ranks` (its
# per-call set-up, ~10 us, pays for itself over its C-speed passes beyond about this many).
_FEW = 8
_MISSING = object()


class Logged(dict[int, V]):
    """A dict that notes each key written or removed, for one reader kept across cycles
    (`RankBook`), so that reader learns what changed without comparing every entry. Reads are
    the dict's own, at C speed; every mutating method is overridden to log (a write that
    bypassed them, `dict.__setitem__(m, ...)`, would go unseen: none does)."""

    def __init__(self) -> None:
        super().__init__()
        self._log: list[int] = []
        self._lost = False  # the log overflowed or the map was cleared since the last `take`

    def _note(self, key: int) -> None:
        log = self._log
        if len(log) >= LOG_LIMIT:
            log.clear()
            self._lost = True
        elif not self._lost:
            log.append(key)

    def take(self) -> list[int] | None:
        """The keys changed since the last call (in any order, repeats possible), or None when
        the log was lost (the reader must read everything again). Empties the log."""
        if self._lost:
            self._lost = False
            self._log.clear()
            return None
        out = self._log
        self._log = []
        return out

    def __setitem__(self, key: int, value: V) -> None:
        self._note(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: int) -> None:
        self._note(key)
        super().__delitem__(key)

    def pop(self, key: int, *default: Any) -> Any:
        self._note(key)
        return super().pop(key, *default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        new: dict[int, V] = dict(*args, **kwargs)
        if not self._lost:  # `_note` for each key, at C speed (a key's jobs come in thousands)
            log = self._log
            log.extend(new)
            if len(log) > LOG_LIMIT:
                log.clear()
                self._lost = True
        super().update(new)

    def setdefault(self, key: int, default: Any = None) -> Any:
        self._note(key)
        return super().setdefault(key, default)

    def popitem(self) -> tuple[int, V]:
        key, value = super().popitem()
        self._note(key)
        return key, value

    def clear(self) -> None:
        self._lost = True
        self._log.clear()
        super().clear()

    def __ior__(self, other: Any) -> Logged[V]:  # type: ignore[override,misc]
        self.update(other)
        return self

    def assign(self, fresh: Mapping[int, V]) -> Logged[V]:
        """Make this map equal `fresh`, writing (so logging) only the keys whose value differs
        (`!=`: identity for distributions) or that left. Why: a caller that reads the whole map
        anew each cycle (the head's attained service, from the store) keeps one `Logged` map,
        so its reader learns the few keys that changed; itself, for chaining."""
        get = self.get
        changed = {k: v for k, v in fresh.items() if get(k, _MISSING) != v}
        if changed:
            self.update(changed)
        if len(self) != len(fresh):
            for key in self.keys() - fresh.keys():
                del self[key]
        return self


# Plain LAS's distributions: none (never written; `RankBook.ranks` reads it in place of the
# snapshot's, so a plain ordering ranks by queue alone whatever the caller hands).
_NO_DISTS: Logged[RunDistribution] = Logged()


class RankBook:
    """Ranks of the queued jobs under `runtime_model: gittins`, kept across cycles (see the module)."""

    def __init__(self) -> None:
        self.rebuilds = 0  # times it started again from `gittins_ranks` (for tests)
        # The team lines sorted by these ranks, kept across cycles for `queueing.TeamQueues`.
        self.lines = RankedLines()
        # One tick per answer; team -> the tick at which a rank of one of its queued jobs last
        # changed (`RankedLines.tell`: a line of a team not stamped since it was sorted is not read).
        self._clock = 0
        self._stamps: dict[str, int] = {}
        self._reset()

    def _reset(self) -> None:
        self._ordering: Ordering | None = None
        self._attained: Logged[float] | None = None
        self._dists: Logged[RunDistribution] | None = None
        self._now = float("-inf")
        self._jobs: dict[int, JobRequest] = {}  # job id -> the queued object last seen
        self._out: dict[int, float] = {}  # job id -> its rank (promoted: 0)
        # (entered the queue, tie, job id, job) of the jobs not promoted yet; stale entries
        # (the job left or was replaced) are skipped when they come up.
        self._waiting: list[tuple[float, int, int, JobRequest]] = []
        self._seq = count()
        self._index: QueueIndex | None = None  # the queue index whose moves it follows
        self._since = self._clock  # the tick it last started again at: every rank may differ since

    def ranks(
        self,
        queued: Sequence[JobRequest],
        ordering: Ordering,
        attained: Mapping[int, float],
        dists: Mapping[int, RunDistribution],
        now: float,
        index: QueueIndex | None = None,
    ) -> Mapping[int, float]:
        """`attained.gittins_ranks(queued, ordering, attained, dists, now)`; under plain LAS (no
        `runtime_model`) `attained.ranks(queued, ordering, attained, {}, now)`'s ranks above 0
        (a job not named ranks 0, as readers take it: the very dict when nothing attained is
        queue 0, `attained.ranks`' exact case), `dists` unread.
        `index`: the snapshot's queue index, just brought to `queued` (`QueueIndex.update`): the
        book follows what enters and leaves it rather than compare `queued` with what it kept.
        The answer is read only and valid until the next call, which may change it (`_answer`).

        Why plain LAS too: `attained.ranks` looked at every queued job that ran before, each
        cycle (~92 of ~470 on whole Philly, 141 k cycles: ~11% of `las`'s profile), yet only a
        requeue, a start or a promotion changes one; and the ranks the book hands out tell the
        kept team lines which teams' ranks changed (`RankedLines.tell`), so an unchanged line is
        checked by identity alone."""
        plain = not ordering.gittins
        if plain:
            dists = _NO_DISTS  # plain LAS reads no distribution (`attained.ranks`)
        if ordering.mode != "las" or not isinstance(attained, Logged) or not isinstance(dists, Logged):
            if plain:
                return attained_ranks(queued, ordering, attained, {}, now)
            return gittins_ranks(queued, ordering, attained, dists, now)
        self._clock += 1
        changed_a, changed_d = attained.take(), dists.take()
        moves = index.take_moves() if index is not None and index is self._index else None
        if (
            changed_a is None
            or changed_d is None
            or attained is not self._attained
            or dists is not self._dists
            or index is not self._index
            or (index is not None and moves is None)
            or ordering != self._ordering
            or now < self._now
        ):
            return self._rebuild(queued, ordering, attained, dists, now, index)
        self._now = now
        jobs, out = self._jobs, self._out
        # Entered, or replaced by another object (a requeue): ranked again, and waiting for its
        # promotion (one heap entry per object: its entry time is the object's), as are those
        # whose attained service or distribution changed (ranked again only).
        new = self._moved(moves) if moves is not None else self._compared(queued)
        if len(jobs) != len(queued):  # the index did not hold `queued`: not to be followed
            return self._rebuild(queued, ordering, attained, dists, now, None)
        entered = set(map(_JOB_ID, new))
        # The logs' keys that are queued (the attained map logs running jobs, and the learned map
        # the jobs that left the queue): a pass over each log, not a set of the whole queue each cycle.
        queued_now = jobs.__contains__
        todo = set(filter(queued_now, changed_a))
        todo.update(filter(queued_now, changed_d))
        # The teams of the jobs ranked again that were in line before: their lines may sort
        # otherwise. (A line a job entered is not the line kept: `RankedLines` sees it by identity.)
        stamps, clock = self._stamps, self._clock
        for team in set(map(_TEAM, map(jobs.__getitem__, todo - entered))):
            stamps[team] = clock
        todo |= entered
        promote = ordering.promote_after_s
        again = list(map(jobs.__getitem__, todo))
        if plain:
            self._plain_ranks(again, ordering, attained, now)
        elif len(again) > _FEW:
            # A job's rank reads only its own inputs: these are ranked as `gittins_ranks` ranks a queue.
            out.update(gittins_ranks(again, ordering, attained, dists, now))
        else:  # a few (most cycles: an arrival, a start): one by one, without its set-up
            for job in again:
                jid = job.job_id
                if promote is not None and _promoted(job, now, promote):
                    out[jid] = 0.0
                else:
                    out[jid] = _kind_rank(ordering, dists.get(jid), job.gpus, attained.get(jid, 0.0))
        if promote is not None:
            if not plain:
                waiting, seq = self._waiting, self._seq
                for job in new:
                    heapq.heappush(waiting, (entered_queue(job), next(seq), job.job_id, job))
            self._promote_due(now, promote, plain)
        return self._answer()

    def _plain_ranks(
        self, again: Sequence[JobRequest], ordering: Ordering, attained: Mapping[int, float], now: float
    ) -> None:
        """Plain LAS (`attained.ranks`): only a rank above 0 is kept (a job that never ran is in
        queue 0, promoted or not, so most of a queue is never named: the answer handed out each
        cycle is small, and a team line no ranked job is in is left by age, `TeamQueues`), and
        only such a job waits for its promotion."""
        out, promote, queues = self._out, ordering.promote_after_s, ordering.queues
        for job in again:
            jid = job.job_id
            if promote is not None and _promoted_plain(job, now, promote):
                out.pop(jid, None)
                continue
            rank = float(bisect_right(queues, attained.get(jid, 0.0)))  # `Ordering.queue_of`
            if not rank:
                out.pop(jid, None)
                continue
            out[jid] = rank
            if promote is not None:
                heapq.heappush(self._waiting, (entered_queue(job), next(self._seq), jid, job))

    def _answer(self) -> Mapping[int, float]:
        """The ranks, as the kept lines are told of them: the book's own dict, which the caller
        reads and does not keep, for the next `ranks` changes it in place (`_Cycle.run` reads it
        for one cycle). Why not a copy: copying every queued job's rank each cycle was ~2% of
        whole Philly under `las-gittins`; nor a read-only view: a `MappingProxyType`'s `get`
        calls the dict's by name, 2.5x a dict's own, and the cycle reads a rank per job it passes."""
        self.lines.tell(self._out, self._stamps, self._clock, self._since)
        return self._out

    def _moved(self, moves: list[tuple[bool, JobRequest]]) -> list[JobRequest]:
        """Apply the index's moves, in order; the jobs that entered and are still in."""
        jobs, out = self._jobs, self._out
        for entered, job in moves:
            jid = job.job_id
            if entered:
                jobs[jid] = job
            elif jobs.get(jid) is job:
                del jobs[jid]
                out.pop(jid, None)  # none if it entered since the last cycle
        return [job for entered, job in moves if entered and jobs.get(job.job_id) is job]

    def _compared(self, queued: Sequence[JobRequest]) -> list[JobRequest]:
        """Without an index: the jobs that entered (or were replaced) found by identity at C
        speed, and those that left looked for only when the count says some did."""
        jobs, out = self._jobs, self._out
        new = list(compress(queued, map(is_not, queued, map(jobs.get, map(_JOB_ID, queued)))))
        jobs.update(zip(map(_JOB_ID, new), new, strict=True))
        if len(jobs) != len(queued):
            for jid in jobs.keys() - set(map(_JOB_ID, queued)):  # left the queue
                del jobs[jid]
                out.pop(jid, None)  # (under plain LAS only ranks above 0 are kept)
        return new

    def _promote_due(self, now: float, promote: float, plain: bool) -> None:
        """Rank 0 for the waiting jobs promoted by now. `_promoted` holds for a prefix of the jobs
        by entry time (now - entered only shrinks along it) save for the submission test, which
        `entered_queue` (never before the submission) makes hold whenever the entry test does
        but for rounding; a job held back by rounding alone is looked at again next cycle."""
        waiting, jobs, out = self._waiting, self._jobs, self._out
        back: list[tuple[float, int, int, JobRequest]] = []
        while waiting and now - waiting[0][0] >= promote:
            item = heapq.heappop(waiting)
            job = item[3]
            if jobs.get(item[2]) is not job:
                continue  # left, or replaced (its new object has its own entry)
            if plain:  # the heap's own test is `_promoted_plain`
                if out.pop(item[2], None) is not None:
                    self._stamps[job.team] = self._clock
            elif _promoted(job, now, promote):
                out[item[2]] = 0.0
                self._stamps[job.team] = self._clock
            else:
                back.append(item)
        for item in back:
            heapq.heappush(waiting, item)

    def _rebuild(
        self,
        queued: Sequence[JobRequest],
        ordering: Ordering,
        attained: Logged[float],
        dists: Logged[RunDistribution],
        now: float,
        index: QueueIndex | None,
    ) -> Mapping[int, float]:
        self.rebuilds += 1
        self._reset()
        self._ordering, self._attained, self._dists, self._now = ordering, attained, dists, now
        self._index = index
        if index is not None:
            index.follow()
        promote = ordering.promote_after_s
        self._jobs.update(zip(map(_JOB_ID, queued), queued, strict=True))
        if not ordering.gittins:
            self._plain_ranks(queued, ordering, attained, now)
            return self._answer()
        for job in queued:
            jid = job.job_id
            self._out[jid] = _kind_rank(ordering, dists.get(jid), job.gpus, attained.get(jid, 0.0))
            if promote is not None:
                heapq.heappush(self._waiting, (entered_queue(job), next(self._seq), jid, job))
        if promote is not None:
            self._promote_due(now, promote, False)
        return self._answer()


def _promoted_plain(job: JobRequest, now: float, promote: float) -> bool:
    """`attained.rank_of`'s promotion test, under plain LAS (`attained.ranks` reads it so)."""
    return now - entered_queue(job) >= promote


def _promoted(job: JobRequest, now: float, promote: float) -> bool:
    """`attained._promote`'s test for one job: submitted by `now - promote`, and `now` at least
    `promote` after it entered the queue (the same float operations)."""
    return now - promote >= job.submitted_at and promote <= now - entered_queue(job)
