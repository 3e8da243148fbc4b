"""`decide(snapshot, policy, now) -> Plan`: the one scheduling decision, live and simulated.

For each queued job, in the order of `queueing.TeamQueues` (aged, priority class, fair share,
age): filter the GPU models it accepts, check its team's quota, and place it (best fit, fewest
nodes, topology) without taking GPUs reserved for a job ahead of it unless it would end before
that job's reserved start (EASY backfill). A job that cannot start may preempt cheaper jobs
(`preempt`); otherwise the first such job per GPU model gets a reservation (`backfill`) and every
other waits with a named reason. The plan is only a proposal: the head commits it.

`reasons=False` asks for the starts and preemptions alone (the simulator, which reads no wait
reason): the cycle stops as soon as no job still in line could add either (`_Cycle._settled`),
so its cost no longer grows with the queued jobs that cannot start. The starts and preemptions
are those of the full cycle; `waiting` then names only the jobs considered before it stopped,
and a wait for busy GPUs or a reservation carries its reason but not its numbers.
"""

from __future__ import annotations

import gc
from bisect import bisect_left, bisect_right, insort
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from functools import partial
from itertools import chain, compress, count, islice, repeat, takewhile
from operator import attrgetter, is_not, itemgetter, lt, not_
from typing import Any, TypeVar, cast

from gpucluster.core import attained
from gpucluster.core.admission import admit, explain_drains
from gpucluster.core.backfill import EndTimes, Reservation, reserve, reserve_host
from gpucluster.core.limits import within_limits
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy
from gpucluster.core.pools import with_pools
from gpucluster.core.preempt import CostKey, Guarantees, VictimChoice, choose_victims
from gpucluster.core.queue_index import Asked, highest_queued_class, least_asked
from gpucluster.core.queueing import Presorted, TeamQueues
from gpucluster.core.quota import QuotaBook
from gpucluster.core.reasons import NO_FACTS, WaitFacts, WaitReason
from gpucluster.core.selection import Selection, unmatched_facts
from gpucluster.core.shrink import shrink_first
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Plan, Preemption, RunningJob, Start, Wait
from gpucluster.core.victim_pool import Adders, Columns, ModelPool, gpus_held, rank_pool

DEFAULT_POLICY = Policy()
# The wait of a job whose GPUs are busy when no numbers are asked for (`reasons=False`).
_BUSY = Wait(WaitReason.RESOURCES)
# Likewise for a job whose GPUs are free but not its CPUs or host memory; the waits of such jobs.
_HOST_BUSY = Wait(WaitReason.CPUS)
_HOST_REASONS = (WaitReason.CPUS, WaitReason.MEMORY)
# Not looked up yet (`_Cycle._standing`): no job's standing (queues count from 0).
_UNSEEN: attained.Standing = (-1, 0.0)
# `_victim_pool`'s bounds when it has none: above every class, and no class.
_ANY_CLASS, _NO_CLASS = 1 << 30, -1
_CHECKPOINT, _SLICES, _FIRST, _SHARE, _GPUS = (
    attrgetter("last_checkpoint_at"),
    attrgetter("allocation.slices"),
    itemgetter(0),
    attrgetter("share"),
    attrgetter("gpus"),
)
_ID, _NEED, _DEMAND = attrgetter("job_id"), attrgetter("need"), attrgetter("demand")
_MIN_GPUS = attrgetter("min_gpus")
_T = TypeVar("_T")  # what `_AfterPreemptor._answered_front` answers a job with


def decide(snapshot: Snapshot, policy: Policy | None = None, now: float = 0.0, *, reasons: bool = True) -> Plan:
    """The plan for this snapshot. `reasons=False`: the same starts and preemptions, but the
    wait of every job is not worked out (see the module docstring).

    The cycle's tentative starts go to a working copy of the free capacity that lives inside
    one trial scope: with a kept index (`snapshot.capacity`) its end undoes them from an undo
    log, so the index is as it was whatever happens in the cycle. Whether the garbage
    collector runs meanwhile is the caller's choice (`gc_paused`): it is process-wide, and a
    head's API threads share it.

    Drained nodes and held teams (`snapshot.drained`, `snapshot.holds`) are admitted first
    (core/admission.py): a held job waits with a BUDGET wait and its hold's reason. Then
    per-user and per-class limits (core/limits.py): a job beyond one waits with its own reason."""
    snapshot, held = _admitted(snapshot, policy or DEFAULT_POLICY, now)
    if held:
        plan = decide(snapshot, policy, now, reasons=reasons)
        return replace(plan, waiting={**plan.waiting, **held})
    policy = policy or DEFAULT_POLICY
    snapshot = with_pools(snapshot, policy.pools)
    with _trial(snapshot) as cap:
        plan = _Cycle(snapshot, policy, now, reasons, cap).run()
    return explain_drains(plan, snapshot, now) if reasons else plan


def certainly_idle(snapshot: Snapshot, policy: Policy | None = None, now: float = 0.0) -> bool:
    """Whether `decide` would certainly start and preempt nothing on this snapshot: no GPU
    model has room for the smallest queued request and no queued job could preempt anyone
    (`_Cycle._nothing_can_change`, the plan-only cycle's first test), known in O(models) and,
    under LAS preemption, O(running), without ordering the queue.

    Why: while every GPU is busy, each burst of submissions woke the head for a full cycle
    that ordered and answered thousands of queued jobs to find nothing to start (18 ms of a
    head's CPU per burst at 3,600 queued: a third of its CPU while submissions streamed in).
    The head skips those cycles' waits and estimates until its next periodic replan."""
    policy = policy or DEFAULT_POLICY
    snapshot = with_pools(_admitted(snapshot, policy, now)[0], policy.pools)
    index = snapshot.capacity
    # Read only, so the kept capacity itself: a trial's fork cost as much as the test (16 ms at
    # 1,000 nodes), and `decide` would make its own.
    cap = index.current(snapshot.nodes, snapshot.running) if index else Capacity(snapshot.nodes, snapshot.running)
    if snapshot.queue_index is not None:
        snapshot.queue_index.update(snapshot.queued, policy)  # `decide` then finds it up to date
    return _Cycle(snapshot, policy, now, False, cap)._nothing_can_change()


def _admitted(snapshot: Snapshot, policy: Policy, now: float) -> tuple[Snapshot, dict[int, Wait]]:
    """The snapshot after admission (core/admission.py: drained nodes, held teams) and limits
    (core/limits.py), and the wait of every job either holds back: `decide` plans on it, and
    `certainly_idle` asks of it."""
    snapshot, held = admit(snapshot)
    if not snapshot.limited:
        snapshot, over = within_limits(snapshot, policy, now)
        if over:
            held = {**held, **over}
    return snapshot, held


def _trial(snapshot: Snapshot) -> AbstractContextManager[Capacity]:
    """The cycle's working copy of the free capacity: the kept index's trial scope (its end
    undoes the cycle's takes), or a fresh build."""
    index = snapshot.capacity
    if index:
        return index.trial(snapshot.nodes, snapshot.running)
    return nullcontext(Capacity(snapshot.nodes, snapshot.running))


class gc_paused:
    """Hold the cyclic garbage collector off around a caller's own call of `decide` (the
    simulator's, the head's loop's). Why: a cycle allocates hundreds of thousands of
    short-lived tuples that reference counting frees anyway, and the collector's passes over
    the (large, long-lived) snapshot cost a third of a cycle at 100,000 queued jobs
    (bench/bench_core_cycle.py). It is switched back on at once, even on error, and only if it
    was on. A class, not a `@contextmanager` generator: 0.3 against 1.3 us a cycle, paid by
    each of whole Philly's ~143,000 cycles."""

    __slots__ = ("_was",)

    def __enter__(self) -> None:
        self._was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was:
            gc.enable()


# The fields that decide which GPU models could ever host a job, read as one tuple at C speed:
# `_Cycle._guaranteed` asks it of every queued job a cold cycle sorts in, and `_models` of each
# job considered (a Python function building it was ~3% of a cold cycle at 100,000 queued).
_SHAPE_FIELDS = ("gpus", "gpu_types", "gpu_memory_mb", "min_gpu_memory_mb", "nodes", "selection", "cpus", "mem_mb")
_shape: Callable[[JobRequest], tuple[object, ...]] = attrgetter(*_SHAPE_FIELDS)
# ... with the team first: what `_Cycle._guaranteed` is answered per.
_TEAM_SHAPE: Callable[[JobRequest], tuple[object, ...]] = attrgetter("team", *_SHAPE_FIELDS)


class _AfterPreemptor:
    """The cycle's order (`TeamQueues`), but a job that preempted others and still waits comes
    first, and a job preempted for a job still queued comes only after that job
    (`Snapshot.preempted_for`).

    Why the preemptor first: it was first in line for those GPUs when it stopped their jobs, and
    the order can change under it in the next cycle (a team's jobs within its guaranteed quota
    rank above its borrowing ones, so a low job within the quota outranked the normal 2-GPU job
    that had just stopped two low jobs for its GPUs; the GPUs went to the low jobs and the normal
    job stopped them again, found by the no-repeated-preemption property test).

    Why: a preempted job goes back to the queue and may rank ahead of its preemptor (a team
    back under its guaranteed quota is served first). It then took back the GPUs it had just
    freed, the preemptor stopped it again, and so on (a victim restarted 55 times in 45 s while
    its preemptor never started). Considered after its preemptor, it finds those GPUs taken, or
    held for the preemptor by its reservation; it may still start on any other free GPUs.
    Without preemptions pending this is `TeamQueues` unchanged (one dict test per job).
    """

    def __init__(self, snapshot: Snapshot, queues: TeamQueues, now: float) -> None:
        self.queues = queues
        self.held_for: Mapping[int, int] = {}
        if snapshot.preempted_for:
            queued = {j.job_id for j in snapshot.queued}
            self.held_for = {v: p for v, p in snapshot.preempted_for.items() if v in queued and p in queued}
        self.preemptors = set(self.held_for.values())
        self._seen: set[int] = set()  # preemptors considered so far
        # Waiting preemptors, considered before anything else (in class, then arrival order);
        # when the queues reach them again they are skipped. Not one still backing off.
        # Looked for only with a preemptor waiting: a pass over every queued job, 32 ms a cycle
        # of the head at 100,000 queued.
        first: list[JobRequest] = []
        if self.preemptors:
            ready = [j for j in snapshot.queued if j.job_id in self.preemptors]
            first = [j for j in ready if j.not_before is None or j.not_before <= now]
        first.sort(key=lambda j: (-int(j.priority), j.submitted_at, j.job_id))
        self._first: deque[JobRequest] = deque(first)
        self._early: set[int] = {j.job_id for j in first}
        self._waiting: dict[int, list[JobRequest]] = {}  # preemptor -> its victims put aside
        self._next: deque[JobRequest] = deque()  # victims to consider now, out of turn
        self._late = False  # the job last popped came from `_next`
        # GPUs asked -> how many jobs a later `pop` may still return ask that many (a job put
        # aside for its preemptor still counts), when the caller asks (`left_sizes`).
        self.left: Counter[float] | None = None
        # Jobs `pop` does more with than hand out: `skip_*` stops before them.
        self._special: set[int] = {*self.held_for, *self.preemptors, *self._early}

    def count_left(self, asked: Counter[float]) -> None:
        """Keep `left` from `asked`: the GPUs every queued job asks, counted (taken over)."""
        for job in self.queues.held:  # never popped
            asked[job.gpus] -= 1
        self.left = asked

    def left_sizes(self) -> list[float]:
        """The GPU counts still asked by a job a later `pop` may return, ascending."""
        assert self.left is not None
        return sorted(k for k, n in self.left.items() if n > 0)

    def pop(self) -> JobRequest | None:
        """The next job to consider; call `done` with it before the next `pop`."""
        held = self.held_for
        while True:
            if self._first:
                job = self._first.popleft()
                self._late = True
                self._seen.add(job.job_id)
                if self.left is not None:
                    self.left[job.gpus] -= 1
                return job
            if self._next:
                job = self._next.popleft()
                self._late = True
            else:
                popped = self.queues.pop()
                if popped is None:
                    if not self._waiting:
                        return None
                    # Preemptors never reached (held back by a backoff): their victims go last.
                    for victims in self._waiting.values():
                        self._next.extend(victims)
                    self._waiting.clear()
                    continue
                job = popped
                self._late = False
                if job.job_id in self._early:  # considered first already
                    self.queues.done(job, False)
                    continue
                if held:
                    p = held.get(job.job_id)
                    if p is not None and p not in self._seen:
                        self.queues.done(job, False)  # out of line until its preemptor was considered
                        self._waiting.setdefault(p, []).append(job)
                        continue
            if job.job_id in self.preemptors:
                self._seen.add(job.job_id)
            if self.left is not None:
                self.left[job.gpus] -= 1
            return job

    def _front(self) -> deque[JobRequest] | None:
        """The queues' line the next `pop` would hand out the head of as it is, or None."""
        if self._first or self._next:
            return None
        return self.queues.front()

    def _numbered_front(self) -> tuple[deque[JobRequest], list[int], list[int], int] | None:
        """`_front`'s line with its requests' numbers and job ids, where the kept lines number
        them (`TeamQueues.front_requests`), else None."""
        if self._first or self._next:
            return None
        return self.queues.front_requests()

    def skip_kept(
        self,
        kept: AbstractSet[object],
        ranks: Mapping[int, float] | None = None,
        numbered: AbstractSet[int] | None = None,
    ) -> None:
        """Take off the line, as `pop` then `done(job, False)` would, the jobs next in line
        whose `need` is in `kept` (with `ranks`, attained-service preemption: whose request and
        queue, `_requests`): the cycle answers them without a look (`_Cycle.run`).
        `numbered`: `kept` by the requests' numbers, read where the line has them numbered
        (`_numbered_front`, as `skip_same` reads them): no job is read then.

        Why: that answer changes nothing, so they only cost the walk, one `pop` and `done` each
        (~0.75 us: 15.4 M of the 16.6 M jobs popped on whole Philly under `default`, most aged,
        so in one line by age); here a few passes over the line's front at C speed. It stops
        before a job `pop` treats apart (a preemptor, a job held for one) and where `pop`
        would go to another line."""
        front = self._answered_front(
            kept.__contains__, _NEED, ranks, numbered.__contains__ if numbered is not None else None
        )
        if front is None:
            return
        line, answered, ids = front
        n = self._cut(ids, next(compress(count(), map(not_, answered)), len(line)))
        if n:
            self._drop(line, n)

    def skip_same(
        self,
        same: Mapping[tuple[object, ...], Wait],
        waiting: dict[int, Wait],
        ranks: Mapping[int, float] | None,
        numbered: Mapping[int, Wait] | None = None,
    ) -> None:
        """`skip_kept` for jobs whose request has an answer in `same`, each then waiting as
        it says (what `_Cycle.run` does with them). The request is `job.demand`, with
        `ranks` (attained-service preemption) the job's queue too (`_Cycle._queue_rank`).
        `numbered`: `same` by the requests' numbers (`TeamQueues.request_ids`), read where the
        line has its requests numbered (`_numbered_front`): no job is read then."""
        front = self._answered_front(same.get, _DEMAND, ranks, numbered.get if numbered is not None else None)
        if front is None:
            return
        line, answers, front_ids = front
        # The answers up to the first job without one (`takewhile` drops every None).
        waits = cast(list[Wait], list(takewhile(partial(is_not, None), answers)))
        ids = list(islice(front_ids, len(waits)))
        n = self._cut(ids, len(waits))
        if n:
            waiting.update(zip(ids[:n], waits, strict=False))  # n <= len(waits)
            self._drop(line, n)

    def _answered_front(
        self,
        answer: Callable[[Any], _T],
        request: Callable[[JobRequest], object],
        ranks: Mapping[int, float] | None,
        numbered: Callable[[int], _T] | None,
    ) -> tuple[deque[JobRequest], Iterator[_T], Iterable[int]] | None:
        """The line `pop` takes from next (`_front`), each of its jobs' answer and its job
        id, in line order: by the request's number (`numbered`) where the line has its requests
        numbered (`_numbered_front`), reading no job; else by the request (`answer` of
        `request(job)`, or with `ranks` of the job's request and queue, `_requests`). None when
        that line is not known without popping. `skip_kept` and `skip_same` read it alike."""
        if numbered is not None and (numbered_front := self._numbered_front()) is not None:
            line, requests, ids, at = numbered_front
            return line, map(numbered, islice(requests, at, None)), islice(ids, at, None)
        front = self._front()
        if front is None:
            return None
        keys = map(request, front) if ranks is None else _requests(front, ranks)
        return front, map(answer, keys), map(_ID, front)

    def _cut(self, ids: Iterable[int], n: int) -> int:
        """`n`, or fewer: up to the first of the job ids `ids` (the line's, from its front)
        that `pop` treats apart."""
        special = self._special
        if special and n:
            n = next(compress(count(), map(special.__contains__, islice(ids, n))), n)
        return n

    def _drop(self, line: deque[JobRequest], n: int) -> None:
        """Take the first `n` jobs off `line`, counted out of `left` as `pop` counts them."""
        left = self.left
        if left is not None:
            for gpus in map(_GPUS, islice(line, n)):  # (`Counter.subtract` costs more for a few)
                left[gpus] -= 1
        deque(map(deque.popleft, repeat(line, n)), maxlen=0)

    def done(self, job: JobRequest, started: bool) -> None:
        if self._late:
            if started:
                self.queues.charge(job)
        else:
            self.queues.done(job, started)
        victims = self._waiting.pop(job.job_id, None) if self._waiting else None
        if victims:
            self._next.extendleft(reversed(victims))


def _requests(line: Iterable[JobRequest], ranks: Mapping[int, float]) -> Iterator[tuple[object, ...]]:
    """Each job's request under attained-service preemption, at C speed: its demand and its
    queue (`_Cycle._queue_rank`), as `_Cycle.run` keys the answers it shares."""
    queues = map(float, map(int, map(ranks.get, map(_ID, line), repeat(0.0))))
    return zip(map(_DEMAND, line), queues, strict=True)


class _Cycle:
    # Answer a job from the wait of an earlier one with the same request while nothing changed
    # (see `run`). Off only in the tests that check it changes no plan.
    share_waits = True
    # ... and take the jobs next in line answered so off the line in one loop, not one `pop`
    # each (`_AfterPreemptor.skip_kept`). Off only in the tests that check it changes no plan.
    skip_answered = True
    # Rank only the running jobs of a class below the asker when it can take nothing else (see
    # `_victim_pool`). Off only in the tests that check it changes no plan.
    pool_by_class = True
    # Under attained-service preemption, leave out of the victim pool the asker's class's jobs
    # no asker may take, and work out each running job's standing once a cycle (see
    # `_victim_pool`, `_candidates_for`). Off only in the tests that check it changes no plan.
    las_pool_filter = True

    def __init__(
        self, snapshot: Snapshot, policy: Policy, now: float, reasons: bool = True, cap: Capacity | None = None
    ) -> None:
        self.s = snapshot
        self.reasons = reasons
        self.policy = policy
        self.now = now
        # The cycle's working copy (see `decide`); a fresh build when none is given (tests).
        self.cap = cap if cap is not None else Capacity(snapshot.nodes, snapshot.running)
        self.quotas = QuotaBook(policy, snapshot.running, self.cap.gpus)
        self.reservations: dict[str, Reservation] = {}
        # The reservations that hold CPUs or memory too (`reserve_host`), by model: a later job
        # asking for them keeps off their nodes on every model (`_host_off`).
        self._host_reserved: dict[str, Reservation] = {}
        self._mixed: bool | None = None  # see `_mixed_nodes`
        self.starts: list[Start] = []
        self._start_ends: list[float] = []  # expected end of each start, by its own time limit
        self.preemptions: list[Preemption] = []
        self.waiting: dict[int, Wait] = {}
        self._stopping: list[RunningJob] | None = None  # see `_stopping_jobs`
        self._pools: dict[str, ModelPool] | None = None
        self._pool_below: int | None = None  # the pool holds only classes below this (None: all)
        self._any_share_running: bool | None = None  # see `_shares_running`
        self._pool_rank: float | None = None  # ... and of the class just below, LAS victims of this rank
        self._shared_pool: set[str] = set()  # models whose pool holds a job sharing a GPU
        # model -> ids of the victims this cycle, all of its pool (no candidates of another model).
        self._preempted: dict[str, set[int]] = {}
        self._fits: dict[tuple[object, ...], list[str]] = {}
        self._waits: dict[tuple[object, ...], Wait] = {}
        self._shared_end: dict[tuple[str, int], tuple[str, float]] = {}
        self._shared_listed = False  # whether `_shared_end` is in `_ends` (see `_end_times`)
        self._ends: EndTimes | None = None
        self._fair_ratio: dict[str, float] = {}
        # Free capacity only shrinks within a cycle (starts take GPUs; preemptions free them
        # only in a later cycle), so a shape that found no place on a model never finds one
        # later in the same cycle: (model, shape, behind a reservation?) that failed.
        self._no_fit: set[tuple[object, ...]] = set()
        self._fit_at: dict[tuple[object, ...], int] = {}  # (model, shape) -> cap.version it fitted at
        self._guaranteed_memo: dict[tuple[object, ...], bool] = {}
        self._bare_free: dict[tuple[object, ...], tuple[int, str | None]] = {}  # see `_gpus_free_for`
        self._behind: dict[str, Wait] = {}  # model -> the wait of jobs behind its reservation
        self._least: Asked | None = None  # see `_least_asked`
        self._lowest_class: int | None = None  # see `_may_have_victims`
        # Node selection: per (selection, model) the nodes of the model it may not use, and for an
        # exclusive job those and the busy ones, at the capacity version they were found at.
        self._off_static: dict[tuple[Selection, str], frozenset[str]] = {}
        self._off_busy: dict[tuple[Selection, str], tuple[int, frozenset[str]]] = {}
        # Pool quotas (core/pools.py): the pools that have any, their nodes, each (pool, team)'s
        # GPUs held there (built on first use, then kept up by `_start`), and per (team, GPUs
        # asked) the nodes a job may not take for them, at the version of that use.
        self._any_elastic: bool | None = None  # see `_elastic_runs`
        self._quota_pools = tuple(p for p in policy.pools if p.quotas)
        self._pool_nodes: dict[str, frozenset[str]] = {}
        self._pool_used: dict[tuple[str, str], float] | None = None
        self._pool_version = 0
        self._pool_full_memo: dict[tuple[str, float], tuple[int, frozenset[str], WaitFacts | None]] = {}
        # Attained-service ordering (core/attained.py): each queued job's rank, worked out in
        # `run` only when the policy ranks jobs; `_las` whether it also preempts for it.
        self._ranks: Mapping[int, float] = {}
        self._las = policy.preempts_for_attained_service
        # Running job id -> its `attained.standing` this cycle (see `_standing_of`).
        self._standing: dict[int, attained.Standing | None] = {}

    def run(self) -> Plan:
        index = self.s.queue_index
        if index is not None:
            index.update(self.s.queued, self.policy)
        if not self.reasons and self._nothing_can_change():
            return Plan(starts=(), preemptions=(), waiting={})
        guaranteed = self._guaranteed if self.quotas.has_quotas else None
        presorted: Presorted | None = None
        if index is not None:
            presorted = index.sorted_lazily(self.policy, self.now)
            if guaranteed is not None:  # the index's lines by age, split by quota (`sort_in`'s levels)
                presorted = index.split.split(presorted, guaranteed)
        ordering = self.policy.ordering
        if ordering.ranked:
            book, dists = self.s.rank_book, self.s.runtime_dist
            # `attained.ranks`, kept across cycles: under Gittins ranks once distributions are
            # learned, under plain LAS always (the book ranks by queue alone then).
            if book is not None and ordering.mode == "las" and (dists or not ordering.gittins):
                self._ranks = book.ranks(self.s.queued, ordering, self.s.attained, dists, self.now, index)
            else:
                self._ranks = attained.ranks(
                    self.s.queued, ordering, self.s.attained, self.s.expected_runtime, self.now, dists
                )
        lines = self.s.rank_book.lines if self.s.rank_book is not None else None  # kept across cycles
        queues = TeamQueues(
            self.s.queued, self.policy, self.s.usage, self.now, guaranteed, presorted, self._ranks or None, lines
        )
        waiting, starts, reservations, preemptions = self.waiting, self.starts, self.reservations, self.preemptions
        # Jobs that could not start, by request, since the cycle's state last changed. Why: a
        # job that cannot start changes nothing (no GPUs, quota, reservation or victims), and
        # what happens to a job depends only on that state and on `job.demand`. So
        # the next job asking the same gets the same wait without being considered again. The
        # state only ever grows within a cycle (starts, reservations, preemptions are never
        # taken back), so the sum of their counts says whether it changed. Fair share brings
        # one team's jobs in long runs while nothing starts: at 100,000 queued jobs four in
        # five are answered here.
        same: dict[tuple[object, ...], Wait] = {}
        state = -1
        settle = not self.reasons
        # Requests that changed nothing, kept across later starts (not across reservations or
        # preemptions) when only the starts and preemptions are asked for and the policy has no
        # quotas or borrowing limits. Why this is exact: a start only takes free GPUs; it adds no
        # reservation (nothing newly excluded), no victim, and no quota use anyone is refused
        # or reclaimed by. A job that could not be placed then cannot be placed on less; one that
        # found no victims finds none with less free; and a job that could not start while its
        # model had no reservation would have got one (a node with enough free GPUs takes it,
        # and on the others all GPUs come back in time), so it did not reach this set. Jobs
        # answered from it are not named in `waiting`: their wait could differ (e.g. busy GPUs
        # rather than behind a reservation). On Philly each start cleared the answers and the
        # next jobs of every request were considered again: most of a cycle's work. Without
        # quotas or borrowing limits the team takes no part in the answer either (only in the
        # place in line, and victims are ranked by their own teams), so it is kept by `need`.
        keep = (
            settle
            and self.share_waits
            and not self.quotas.has_quotas
            and self.quotas.unlimited
            and not self._quota_pools  # a pool's quota is a team's, like a quota
        )
        # With attained-service preemption two jobs asking the same may meet different fates
        # (whom each may preempt depends on its rank, and with fair share on its team): answers
        # are shared per (request, queue), the team being part of the request, and so are those
        # kept across starts. The argument above holds per asker: a start adds no victim (the
        # pool is the running jobs; a job's standing reads the snapshot and `now`) and takes
        # no one's share of fair share (`_over_share` reads the snapshot's usage), so an asker
        # that found no victims finds none with less free. Why: under `las` every start
        # cleared the answers, and each (request, queue) was considered again after each start
        # (~7 jobs considered a cycle on whole Philly, ~40% of the run).
        las = self._las
        if keep and self.policy.preemption.enabled and self._shares_in_play():
            # Preemption counted GPU by GPU (core/preempt_shapes.py) is not monotone in the free
            # capacity the way the argument above needs: after starts, a job may find that
            # stopping shares now free enough and take a reservation it could not before
            # (tests/unit/test_scheduler_queue_index.py found one). So with shares on the
            # cluster or in line, only the exact per-state answers (`same`) are kept.
            keep = False
        kept: set[tuple[object, ...]] = set()
        kept_at = 0  # reservations + preemptions when `kept` was last cleared
        after = _AfterPreemptor(self.s, queues, self.now)
        if settle and las:
            after.count_left(index.gpus_asked() if index is not None else Counter(map(_GPUS, self.s.queued)))
        ranks_of = self._ranks.get
        # `same` and `kept` by the requests' numbers, where the kept lines number them
        # (`skip_same`, `skip_kept`).
        # (`skip_same` runs only without `keep`, `skip_kept` only with it: one of the two.)
        numbering = queues.request_ids if las and self.skip_answered else None
        numbered: dict[int, Wait] | None = {} if numbering is not None and not keep else None
        kept_numbers: set[int] | None = set() if numbering is not None and keep else None
        while (job := after.pop()) is not None:
            now_state = len(starts) + len(reservations) + len(preemptions)
            if now_state != state:
                same.clear()
                if numbered is not None:
                    numbered.clear()
                state = now_state
                if keep and len(reservations) + len(preemptions) != kept_at:
                    kept.clear()
                    if kept_numbers is not None:
                        kept_numbers.clear()
                    kept_at = len(reservations) + len(preemptions)
                if settle and self._settled(job, after):
                    break  # no job left in line can change the plan; only waits would follow
            request: tuple[object, ...]
            if las:  # `_queue_rank` inline: this runs for every job the walk passes (13 M on Philly)
                rank = ranks_of(job.job_id)
                request = (job.demand, 0.0 if rank is None else float(int(rank)))
            else:
                request = job.demand
            answer = request if las else job.need  # what `kept` knows it by
            if keep and answer in kept:
                after.done(job, False)
                if self.skip_answered:  # the jobs next in line answered the same way
                    after.skip_kept(kept, self._ranks if las else None, kept_numbers)
                continue
            wait = same.get(request)
            if wait is not None and self.share_waits:
                waiting[job.job_id] = wait
                after.done(job, False)
                if self.skip_answered and not keep:  # (with `keep`, `kept` answers first, naming none)
                    after.skip_same(same, waiting, self._ranks if las else None, numbered)
                continue
            started = self._consider(job)
            after.done(job, started)
            if not started and len(starts) + len(reservations) + len(preemptions) == state:
                wait = same[request] = waiting[job.job_id]
                if numbered is not None and numbering is not None:
                    numbered[numbering[cast(tuple[tuple[object, ...], float], request)]] = wait
                if keep and wait.reason not in _HOST_REASONS:
                    # Not a job that waits for CPUs or memory beside free GPUs: it took no
                    # reservation only because its GPUs were free, and once starts take them it
                    # would (the argument above needs "no reservation: none possible").
                    kept.add(answer)
                    if kept_numbers is not None and numbering is not None:
                        kept_numbers.add(numbering[cast(tuple[tuple[object, ...], float], answer)])
        if settle:
            return Plan(starts=tuple(starts), preemptions=tuple(preemptions), waiting=waiting)
        for job in queues.held:  # last in line: they may not start yet
            assert job.not_before is not None
            begin = job.begin is not None and job.not_before <= job.begin
            reason = WaitReason.BEGIN if begin else WaitReason.BACKOFF
            self._wait(job, reason, WaitFacts(until=job.not_before), job.not_before)
        return Plan(starts=tuple(self.starts), preemptions=tuple(self.preemptions), waiting=self.waiting)

    def _shares_in_play(self) -> bool:
        """Whether a share of a GPU is queued (the smallest request is below one GPU: the cycle's
        cached bound, `_least_asked`) or running on a GPU with room left (`Capacity.partial`):
        O(models), so a cluster of whole-GPU jobs (Philly's) keeps its shortcut at no cost."""
        return self._least_asked().need < 1 or any(self.cap.partial.values())

    # ---- settling (reasons=False) -------------------------------------------------------------

    def _settled(self, job: JobRequest, after: _AfterPreemptor) -> bool:
        """Whether no job still in line can add a start or a preemption to the plan.

        Why this is exact: with every GPU model reserved, no later job preempts or reserves
        (`_try_preempt` and `_reserve_or_wait` skip reserved models). It can then only start,
        by placement, which needs as many free GPUs (a share, below one GPU) of a model as it
        asks: without backfill a reservation lets no one pass; with backfill a job that ends
        before the shadow time may use any free GPU, any other only those off the reserved
        nodes. Within a cycle free capacity only shrinks and a reservation is never taken back,
        so once no remaining request could pass, none will. The bounds (the smallest request,
        the shortest time limit) are first over every queued job, then over the jobs still in
        line (`_AfterPreemptor.left`, under LAS preemption), so a remaining job asks no less.
        Checked only when the plan grew (a start, reservation or preemption)."""
        if len(self.reservations) < len(self.cap.model_memory) or self._least_asked().need == 0:
            return False  # ... or a CPU-only job is queued: no GPU reservation holds it back
        if not self.policy.backfill or not self._may_pass(self._least_asked()):
            return True
        # Some queued job could pass, but perhaps none of those still in line (`job`, just
        # popped, and those the walk has not reached): under LAS a preemptor's reservation
        # holds one node, GPUs stay free elsewhere that no remaining request fits, and the
        # walk went to the end of the queue (13.7 M jobs on Philly). The sizes they ask are
        # counted down as the walk pops (`_AfterPreemptor.left`), under LAS preemption only:
        # elsewhere the count cost more than it saved (`default` on whole Philly, 42 -> 45
        # CPU-s). A share or an elastic job in the queue is not bounded by its size alone, and
        # then the queue's bound stands.
        least = self._least_asked()
        if after.left is None or least.need < 1 or least.loose:
            return False
        sizes = after.left_sizes()
        if job.gpus not in sizes:
            insort(sizes, job.gpus)
        return not self._may_pass(least._replace(need=sizes[0], sizes=tuple(sizes)))

    def _may_pass(self, least: Asked) -> bool:
        """Whether a job asking what `least` bounds (`least_asked`) could pass a reservation:
        end before its start, or find room off its nodes."""
        shortest = least.shortest
        for model, res in self.reservations.items():
            if self.now + shortest <= res.shadow and self._has_room(model, least, frozenset()):
                return True
            if self._has_room(model, least, res.nodes):
                return True
        return False

    def _nothing_can_change(self) -> bool:
        """Whether the plan is certainly empty, known before the queue is ordered: no model has
        room for the smallest request, and no queued job could preempt anyone (see
        `_may_have_victims`). Why: while the cluster is full every arrival asks for a plan, and
        ordering thousands of queued jobs (O(queue) a cycle) to find nothing was most of the
        simulator's time on Philly."""
        least = self._least_asked()
        if least.need == 0:  # a CPU-only job is queued: it may start without any GPU free
            return False
        if any(self._has_room(m, least, frozenset()) for m in self.cap.model_memory):
            return False
        if not self.policy.preemption.enabled or not self.s.queued:
            return True
        if self.policy.preemption.reclaim_quota and self.quotas.has_quotas:
            return False
        if self.policy.priorities:
            # A queued job may preempt a running one of a lower class. Asked before the LAS
            # pass below (O(1) with the kept indexes, and on Philly a lower class nearly always
            # runs): that pass, a standing per running job until one may be taken, was ~5% of
            # each cycle that plans nothing under `las`.
            highest = highest_queued_class(self.s.queued, self.s.queue_index)
            if highest is not None and self._lower_class_runs(highest):
                return False
        if self._las:
            # A queued job may preempt one of its own class with more attained service: not
            # nothing only if some running job could be taken (O(running), not O(queue)).
            ordering, standing_of = self.policy.ordering, self._standing_of
            if any(attained.may_be_taken_standing(standing_of(v), ordering) for v in self.s.running if not v.stopping):
                return False
        return True

    def _least_asked(self) -> Asked:
        """`least_asked` over every queued job, once per cycle."""
        if self._least is None and self.s.queue_index is not None:
            self._least = self.s.queue_index.least_asked(self.policy.default_time_limit_s)
        if self._least is None:
            self._least = least_asked(self.s.queued, self.policy.default_time_limit_s)
        return self._least

    def _has_room(self, model: str, least: Asked, off: frozenset[str]) -> bool:
        """Whether `model` has what a job asking what `least` bounds (`least_asked`) needs at
        the least to be placed outside the nodes `off`: for a share any free or shared GPU
        (`Capacity.place` looks nowhere else); for whole GPUs that many free, and on one node
        unless a larger job could use them. Why one node: a job asking no more than a node has
        is placed on one (`Capacity.place`), so 4 GPUs free over four nodes hold no job of 2 or
        more; under LAS a preemptor's reservation left such leftovers, and the walk (which
        stops once no one can pass, `_settled`) went on to the end of the queue."""
        need = least.need
        cap = self.cap
        free = cap.free[model]
        if not off:
            whole = cap.total_free[model]
        elif len(off) >= len(free) and all(nd in off for nd in free):
            whole = 0
        else:
            whole = cap.total_free[model] - sum(len(free.get(nd, ())) for nd in off)
        if need < 1:
            return whole >= 1 or any(key[0] not in off for key in cap.partial[model])
        if whole < need:
            return False
        if least.loose:
            return True  # a part of a job on one node may be less than any size it asks
        size = cap.node_size[model]
        if need <= size and cap.most_free_off(model, off) >= need:
            return True  # the smallest job fits on one node
        # Else only a job larger than a node could be placed (over several, on any free GPUs).
        return any(size < n <= whole for n in least.sizes)

    # ---- one job ----------------------------------------------------------------------------

    def _guaranteed(self, job: JobRequest) -> bool:
        """Called while the queues are built, before anything starts, so it is cached per team
        and shape: quota use does not change meanwhile. The whole shape `_models` reads (a node
        selection, CPUs and host memory too): keyed on less, a job limited to nodes outside the
        quota's models answered for a job of the same GPU count that may use them."""
        key = _TEAM_SHAPE(job)
        hit = self._guaranteed_memo.get(key)
        if hit is None:
            hit = self._guaranteed_memo[key] = any(
                self.quotas.within_quota(job.team, m, job.gpus) for m in self._models(job)
            )
        return hit

    def _models(self, job: JobRequest) -> list[str]:
        """Models that could ever host the job; many jobs share a shape, so cached per cycle."""
        shape = _shape(job)
        models = self._fits.get(shape)
        if models is None:
            sel = job.selection
            allowed = self.cap.allowed(sel) if sel is not None and sel.filters else None
            models = [m for m in self.cap.acceptable_models(job) if self.cap.could_ever_fit(job, m, allowed)]
            self._fits[shape] = models
        return models

    def _off(self, job: JobRequest, model: str) -> frozenset[str]:
        """The nodes of `model` a job with a selection may not be placed on now: those its
        selection excludes and, for an exclusive job, those where anything runs. Free capacity
        only shrinks within a cycle, so the busy ones are found again only when it changed."""
        sel = job.selection
        assert sel is not None
        key = (sel, model)
        off = self._off_static.get(key)
        if off is None:
            allowed = self.cap.allowed(sel) if sel.filters else None
            off = self._off_static[key] = (
                frozenset(n for n in self.cap.model_nodes(model) if n not in allowed)
                if allowed is not None
                else frozenset()
            )
        if not sel.exclusive:
            return off
        version = self.cap.version
        busy = self._off_busy.get(key)
        if busy is None or busy[0] != version:
            cap = self.cap
            busy = self._off_busy[key] = (
                version,
                off | frozenset(n for n in cap.model_nodes(model) if n not in off and not cap.idle(n)),
            )
        return busy[1]

    def _consider(self, job: JobRequest) -> bool:
        if job.gpus == 0:
            return self._consider_cpu_only(job)
        if job.min_gpus is not None and job.min_gpus < job.gpus:
            return self._consider_elastic(job, job.min_gpus)
        fits_ever = self._models(job)
        if not fits_ever:
            self._wait(job, WaitReason.NO_FIT, self._no_fit_facts(job))
            return False
        if job.selection is not None and job.selection.exclusive and job.fractional:
            # An exclusive job holds whole nodes; a share of a GPU leaves the rest of it to others.
            self._wait(job, WaitReason.NO_FIT, WaitFacts(variant="exclusive_fraction", gpus=job.gpus))
            return False
        if self.quotas.limits_borrowing(job.team):
            limits = [self.quotas.borrow_refusal(job.team, m, job.gpus) for m in fits_ever]
            if all(r is not None for r in limits):
                # Its team's borrowing limit refuses it whatever is free: say so, and never preempt for it.
                self._wait(job, WaitReason.QUOTA, limits[0] or NO_FACTS)
                return False
        if job.gpus >= 1 and job.gpu_memory_mb is None and all(self.cap.total_free[m] < job.gpus for m in fits_ever):
            # Fast path, same outcome as below: nothing could be placed, whatever quota and
            # reservations say, so go straight to preempting, reserving or waiting.
            if not self._try_preempt(job, fits_ever):
                self._reserve_or_wait(job, fits_ever, None, gpus_busy=True)
            return False
        started, refusal, blocked_by = self._place_now(job, fits_ever)
        if started:
            return True
        if refusal is not None and blocked_by is None and not self._any_model_free_for(job, fits_ever):
            refusal = None  # the real obstacle is that the GPUs are busy, not the quota
        if refusal is not None:
            self._wait(job, WaitReason.QUOTA, refusal)
            return False
        if self._try_preempt(job, fits_ever):
            return False
        self._reserve_or_wait(job, fits_ever, blocked_by)
        return False

    def _consider_cpu_only(self, job: JobRequest) -> bool:
        """A job asking for no GPU (only CPUs and/or host memory): placed by those alone, on
        any node with them left (`Capacity.place_host_only`), in its turn in line.

        The rules (README "CPU-only jobs"): it holds no GPU, so GPU quotas, pool quotas and
        GPU reservations do not apply to it and it never keeps a GPU job off its GPUs; it
        keeps off the nodes where a reservation holds CPUs or memory for a GPU job first in
        line, unless its time limit ends before that reservation's start (with backfill; in
        strict order never). It takes no reservation of its own and preempts no one; being
        holder of no GPU it is never a victim either (preemption frees GPUs). A GPU job short
        of the CPUs it holds waits for its end, which the reservations count."""
        sel = job.selection
        allowed = self.cap.allowed(sel) if sel is not None and sel.filters else None
        shape = ("cpu-only", job.cpus, job.mem_mb, sel)
        fits_ever = self._fits.get(shape)
        if fits_ever is None:
            fits_ever = self._fits[shape] = [""] if self.cap.could_host_only_ever_fit(job, allowed) else []
        if not fits_ever:
            self._wait(job, WaitReason.NO_FIT, self.cap.cpu_only_no_fit(job, allowed is not None))
            return False
        if sel is not None and sel.exclusive:
            self._wait(job, WaitReason.NO_FIT, WaitFacts(variant="cpu_only_exclusive"))
            return False
        exclude: frozenset[str] = frozenset()
        if allowed is not None:
            exclude = frozenset(self.cap.node_gpus).difference(allowed)
        held = frozenset(
            nd
            for res in self._host_reserved.values()
            if not (self.policy.backfill and self._ends_before(job, res))
            for nd in res.nodes
        )
        key = (shape, held)
        if key not in self._no_fit:
            allocation = self.cap.place_host_only(job, exclude | held if held else exclude)
            if allocation is not None:
                self._start(job, allocation)
                return True
            self._no_fit.add(key)
        if self.reasons:
            short = self.cap.host_only_short(job, exclude | held)
            cpus = short == "cpus"
            facts = WaitFacts(
                variant="cpu_only" if cpus else "cpu_only_memory",
                cpus=job.cpus or None,
                mem_mb=job.mem_mb or None,
                reserved=bool(held) or None,
            )
            self._wait(job, WaitReason.CPUS if cpus else WaitReason.MEMORY, facts)
        else:
            self.waiting[job.job_id] = _HOST_BUSY
        return False

    def _place_now(self, job: JobRequest, models: list[str]) -> tuple[bool, WaitFacts | None, Reservation | None]:
        """Start the job now if a model has room that its quota and the reservations allow.

        Returns (started, the first quota refusal, the reservation that blocked it).
        """
        refusal: WaitFacts | None = None
        blocked_by: Reservation | None = None
        quotas = self.quotas
        shape = (job.gpus, job.nodes, job.gpu_memory_mb, job.selection, job.cpus, job.mem_mb)
        full, pool_why = self._pool_full(job) if self._quota_pools else (frozenset(), None)
        for model in models:
            if not quotas.unlimited:
                why = quotas.refusal(job.team, model, job.gpus, self.cap.free_count(model))
                if why is not None:
                    refusal = refusal or why
                    continue
            res = self.reservations.get(model)
            reserved: frozenset[str] = frozenset()
            if res is not None and not self.policy.backfill:
                blocked_by = blocked_by or res  # strict order: nothing passes the first in line
                continue
            if res is not None and not self._ends_before(job, res):
                reserved = res.nodes
            exclude = reserved
            if job.selection is not None:
                off = self._off(job, model)
                exclude = off | reserved if reserved else off
            key: tuple[object, ...] = (model, shape, bool(reserved))
            if full:
                exclude = exclude | full
                key = (*key, full)
            if self._host_reserved and job.host and self._mixed_nodes():
                held = self._host_off(job, model)
                if held:
                    exclude = exclude | held
                    key = (*key, held)
            if key not in self._no_fit:
                holders = self.s.images.get(job.image, ()) if job.image is not None else ()
                allocation = self.cap.place(job, model, exclude, holders)
                if allocation is not None:
                    self._start(job, allocation)
                    return True, None, None
                self._no_fit.add(key)
            # The reservation is the obstacle only if the job would fit without it.
            if reserved and blocked_by is None and self._fits_unreserved(job, model, shape):
                blocked_by = res
        if full and refusal is None and blocked_by is None:
            # A pool's quota is the obstacle if the job would fit on the pool's nodes.
            for model in models:
                off = self._off(job, model) if job.selection is not None else frozenset()
                if self.cap.place(job, model, off) is not None:
                    refusal = pool_why
                    break
        return False, refusal, blocked_by

    def _pool_full(self, job: JobRequest) -> tuple[frozenset[str], WaitFacts | None]:
        """The nodes of the pools where `job`'s team has no room left for it under the pool's
        quota, and the wait that names the first such pool. A job that might land wholly on a
        pool counts wholly against it (never over a quota, sometimes kept off a pool it would
        only partly use). O(pools) per team and size, again only after a start in a pool."""
        key = (job.team, job.gpus)
        hit = self._pool_full_memo.get(key)
        if hit is not None and hit[0] == self._pool_version:
            return hit[1], hit[2]
        used = self._pool_usage()
        off: set[str] = set()
        why: WaitFacts | None = None
        for pool in self._quota_pools:
            quota = pool.quota(job.team)
            if quota is None:
                continue
            have = used.get((pool.name, job.team), 0.0)
            if have + job.gpus > quota + 1e-9:
                off |= self._pool_nodes[pool.name]
                why = why or WaitFacts(
                    variant="pool", team=job.team, pool=pool.name, used=have, limit=quota, asks=job.gpus
                )
        got = (self._pool_version, frozenset(off), why)
        self._pool_full_memo[key] = got
        return got[1], got[2]

    def _pool_usage(self) -> dict[tuple[str, str], float]:
        """(pool, team) -> GPUs the team's running jobs hold on the pool's nodes (shares as
        fractions), for the pools with quotas: one pass over the running jobs, on first use."""
        if self._pool_used is None:
            for pool in self._quota_pools:
                self._pool_nodes[pool.name] = frozenset(n.name for n in self.s.nodes if pool.holds(n))
            self._pool_used = {}
            for j in self.s.running:
                self._add_pool_use(j.team, j.allocation)
        return self._pool_used

    def _add_pool_use(self, team: str, allocation: Allocation) -> None:
        assert self._pool_used is not None
        for pool in self._quota_pools:
            nodes = self._pool_nodes[pool.name]
            held = sum(len(s.gpu_indices) * s.share for s in allocation.slices if s.node in nodes)
            if held:
                key = (pool.name, team)
                self._pool_used[key] = self._pool_used.get(key, 0.0) + held
                self._pool_version += 1

    def _mixed_nodes(self) -> bool:
        """Whether a node has GPUs of more than one model (once per cycle, on first need)."""
        if self._mixed is None:
            self._mixed = any(len(models) > 1 for models in self.cap.node_models.values())
        return self._mixed

    def _host_off(self, job: JobRequest, model: str) -> frozenset[str]:
        """The nodes of `model` where another model's reservation holds CPUs or memory that
        `job` (asking for them) would take, unless it ends before that reservation's start: a
        node with GPUs of two models shares its CPUs and memory between them."""
        off: frozenset[str] = frozenset()
        node_models = self.cap.node_models
        for m, res in self._host_reserved.items():
            if m != model and not self._ends_before(job, res):
                off |= frozenset(nd for nd in res.nodes if model in node_models[nd])
        return off

    def _fits_unreserved(self, job: JobRequest, model: str, shape: tuple[object, ...]) -> bool:
        """Could the job be placed on `model` if no GPUs were held for a reservation."""
        if (model, shape, False) in self._no_fit:
            return False
        if self._fit_at.get((model, shape)) == self.cap.version:
            return True  # nothing was taken since it last fitted
        fits = (
            self.cap.fits(job, model)
            if job.selection is None
            else self.cap.place(job, model, self._off(job, model)) is not None
        )
        if not fits:
            self._no_fit.add((model, shape, False))
            return False
        self._fit_at[(model, shape)] = self.cap.version
        return True

    def _consider_elastic(self, job: JobRequest, min_gpus: int) -> bool:
        """An elastic job starts at the largest size, from `gpus` down, that can start now.

        If none can, it is considered as a job of its minimum size: that is what it waits,
        preempts and holds a reservation for, so it never stops more work than it needs.
        """
        for n in range(int(job.gpus), min_gpus, -1):
            sized = replace(job, gpus=float(n), min_gpus=None)
            models = self._models(sized)
            if any(self.cap.total_free[m] >= n for m in models) and self._place_now(sized, models)[0]:
                return True
        return self._consider(replace(job, gpus=float(min_gpus), min_gpus=None))

    def _ends_before(self, job: JobRequest, res: Reservation) -> bool:
        limit = job.time_limit_s or self.policy.default_time_limit_s
        return self.now + limit <= res.shadow

    def _any_model_free_for(self, job: JobRequest, models: list[str]) -> bool:
        return any(self.cap.free_count(m) >= job.gpus for m in models)

    def _start(self, job: JobRequest, allocation: Allocation) -> None:
        exclusive = job.selection is not None and job.selection.exclusive
        self.cap.take(self.cap.held(allocation, True) if exclusive else allocation)
        self.quotas.add(job.team, allocation)
        if self._pool_used is not None:
            self._add_pool_use(job.team, allocation)
        self.starts.append(Start(job.job_id, allocation))
        end = self.now + (job.time_limit_s or self.policy.default_time_limit_s)
        self._start_ends.append(end)
        if self._ends is not None:
            self._add_end(job.job_id, allocation, end)
            if self._ends.host_by_node is not None and job.host:
                self._ends.add_host(allocation, end)

    # ---- preemption -------------------------------------------------------------------------

    def _try_preempt(self, job: JobRequest, models: list[str]) -> bool:
        """Preempt for the job if it is first in line for a GPU model and cheaper jobs hold it.

        One preemptor per GPU model per cycle (like one reservation per model): the GPUs being
        freed are held for it, and later jobs preempt in the cycles after, once it has started.
        """
        pre = self.policy.preemption
        if not pre.enabled or len(self.reservations) == len(self.cap.model_memory):
            return False
        sel = job.selection
        # Victims only where it may land (its selection, pools); an exclusive job's victims
        # empty whole nodes (`preempt_shapes.for_exclusive`).
        allowed = self.cap.allowed(sel) if sel is not None and sel.filters else None
        if self._quota_pools:
            full = self._pool_full(job)[0]
            if full:  # pools where its team is at its quota: no place to free
                allowed = (allowed if allowed is not None else frozenset(self.cap.node_labels)) - full
        if not self._may_have_victims(job):
            return False
        by_class = self.pool_by_class and not (pre.reclaim_quota and self.quotas.has_quotas)
        # With attained-service preemption the asker's own class is in the pool too.
        rank = self._queue_rank(job) if self._las else None
        pool = self._victim_pool(int(job.priority) + int(self._las) if by_class else None, rank)
        for model in models:
            if model in self.reservations:
                continue
            if self.quotas.borrow_refusal(job.team, model, job.gpus) is not None:
                continue  # its own team's borrowing limit refuses it: stopping others gains nothing
            within = self.quotas.has_quotas and self.quotas.within_quota(job.team, model, job.gpus)
            reclaim = pre.reclaim_quota and within
            candidates, guarantees = self._candidates(job, model, pool.get(model), reclaim, within, allowed)
            stopping = [j for j in self._stopping_jobs() if self.cap.model_of(j.allocation) == model]
            if not candidates and not stopping:
                continue
            shared = model in self._shared_pool or any(s.share < 1 for j in stopping for s in j.allocation.slices)
            choice = None
            if pre.shrink_elastic and candidates and self._elastic_runs():
                choice = shrink_first(
                    job, model, self.cap, candidates, stopping, self._victim_cost, guarantees, shared, allowed
                )
            shrunk = choice is not None
            if choice is None:
                choice = choose_victims(
                    job,
                    model,
                    self.cap,
                    candidates,
                    stopping,
                    self._victim_cost,
                    ranked=True,
                    guarantees=guarantees,
                    shared=shared,
                    allowed=allowed,
                )
            if choice is None:
                continue
            if job.host and not self._host_fits_after(job, model, choice, [*choice.victims, *stopping]):
                # The victims free GPUs but not the CPUs or memory it needs beside them there:
                # stopping them would gain nothing, so it waits (and says for what).
                continue
            if not choice.victims:
                if not candidates:
                    continue  # nothing it may preempt; what is stopping is not being freed for it
                self._wait(job, WaitReason.PREEMPTING, WaitFacts(variant="stopping", model=model, gpus=job.gpus))
            else:
                victims = tuple(v.job_id for v in choice.victims)
                what = "shrinking" if shrunk else "preempting"
                self._wait(
                    job, WaitReason.PREEMPTING, WaitFacts(variant=what, model=model, gpus=job.gpus, victims=victims)
                )
                for v in choice.victims:
                    if self.policy.priorities and v.priority < job.priority:
                        why = f"preempted by job {job.job_id} ({job.priority.label} priority)"
                    elif self._las_victim(job, v):
                        why = f"preempted by job {job.job_id} (less attained service: queue {self._queue_rank(job):g})"
                    else:
                        why = f"preempted: team {job.team} reclaims its guaranteed {model} GPUs"
                    if shrunk:
                        why = (
                            f"resized: shrinking from {v.allocation.gpu_count:g} GPUs ({why}); it restarts at once "
                            f"at the size that fits, at least {v.min_gpus}"
                        )
                    self.preemptions.append(Preemption(v.job_id, job.job_id, why))
                    self.quotas.remove(v.team, v.allocation)
                    self._preempted.setdefault(model, set()).add(v.job_id)
                self._stopping = [*self._stopping_jobs(), *choice.victims]
            everywhere = frozenset(self.cap.node_models) if allowed is None else allowed
            if choice.node:
                nodes = frozenset({choice.node})
            else:
                nodes = choice.nodes if choice.nodes is not None else everywhere
            self.reservations[model] = Reservation(job.job_id, model, self.now + pre.grace_period_s, nodes)
            return True
        return False

    def _elastic_runs(self) -> bool:
        """Whether any running job is elastic (could be shrunk, core/shrink.py): one pass a
        cycle, on first use, so a cluster without elastic jobs never looks for them per job. A
        told capacity index keeps the answer (`CapacityIndex.elastic_running`)."""
        if self._any_elastic is None:
            index = self.s.capacity
            got = index.elastic_running() if index is not None else None
            if got is None:  # at C speed: a generator step per job was ~1 CPU-s of whole Philly
                got = any(map(is_not, map(_MIN_GPUS, self.s.running), repeat(None)))
            self._any_elastic = got
        return self._any_elastic

    def _host_fits_after(self, job: JobRequest, model: str, choice: VictimChoice, gone: list[RunningJob]) -> bool:
        """Whether `job` could be placed on `model` once the jobs `gone` have released
        everything (GPUs, CPUs, memory). When the choice names the one node it lands on, that
        node's CPUs and memory left plus what `gone` holds there; else a full copy of the
        capacity (O(GPUs): a gang or a job over several nodes, once per model per cycle)."""
        if choice.node is not None:
            cpus_left, mem_left = self.cap.free_host(choice.node)
            freed_cpus = freed_mem = 0.0
            for v in gone:
                for s in v.allocation.slices:
                    if s.node == choice.node:
                        freed_cpus += s.cpus
                        freed_mem += s.host_memory_mb
            return (cpus_left is None or cpus_left + freed_cpus + 1e-9 >= job.cpus) and (
                mem_left is None or mem_left + freed_mem >= job.mem_mb
            )
        trial = self.cap.fork()
        for v in gone:
            trial.release(v.allocation)
        return trial.place(job, model) is not None

    def _guarantees(self, job: JobRequest, model: str, within: bool) -> Guarantees | None:
        """What other teams' guaranteed quotas of `model` protect from `job` (see `Guarantees`):
        only a job of a higher class whose team stays within its own guarantee may take a team
        below its quota; None when no other team has a quota of `model`."""
        beyond = self.quotas.beyond_quota(model, job.team)
        if not beyond:
            return None
        by_class, priority, gpus = self.policy.priorities, job.priority, self.cap.gpus

        def limited(v: RunningJob) -> bool:
            return not (within and by_class and v.priority < priority)

        def holds(v: RunningJob) -> float:
            return gpus_held(v.allocation, model, gpus)

        return Guarantees(beyond, limited, holds)

    def _left_by_guarantees(
        self, job: JobRequest, pool: ModelPool, picked: list[int], guarantees: Guarantees, within: bool
    ) -> list[int]:
        """`[i for i in picked if guarantees.allows(pool.jobs[i], {})]`, read from the pool's
        columns: with classes, `limited` spares the lower classes (the pool's prefix) of an
        asker within its own guarantee; every other job of a team in `beyond` must hold no
        more GPUs of the model (`holds`: the pool's `holds` column) than its team has beyond
        its quota. Why: at 10,000 nodes ~14,000 candidates a model, a call each per asker."""
        limit = guarantees.limits()
        spared = 0
        if within and self.policy.priorities:
            spared = bisect_left(picked, pool.bounds(int(job.priority))[0])
        return picked[:spared] + pool.within_room(picked[spared:], limit)

    def _stopping_jobs(self) -> list[RunningJob]:
        """Running jobs stopping, and the cycle's victims so far. Built on first use, not per
        cycle, or read from the running jobs by class where the caller keeps them there
        (`RunningByClass.stopping`, in the same order). Why: it is a pass over every running
        job (0.3 ms a cycle at 100,000 GPUs), and only a cycle that tries to preempt reads it."""
        if self._stopping is None:
            view = self.s.running_by_class
            if view is not None and view.stopping is not None and view.running is self.s.running:
                self._stopping = list(view.stopping)
            else:
                self._stopping = [j for j in self.s.running if j.stopping]
        return self._stopping

    def _may_have_victims(self, job: JobRequest) -> bool:
        """False when no running job could be a candidate for `job` (`_candidates_for`): none
        is of a lower class, and it reclaims no quota (no team has one). Then `_try_preempt`
        could only skip every model, so it returns at once, without ranking every running job
        (`_victim_pool`, O(running) a cycle): on Philly, with one class and no quotas, always."""
        if self.policy.preemption.reclaim_quota and self.quotas.has_quotas:
            return True
        if self._las and self._ranks.get(job.job_id, 0.0) < len(self.policy.ordering.queues):
            return True  # it may have less attained service than a running job of its class
        return self.policy.priorities and self._lower_class_runs(job.priority)

    def _lower_class_runs(self, priority: int) -> bool:
        """Whether any running job is of a lower class than `priority` (one pass a cycle)."""
        if self._lowest_class is None:
            index = self.s.capacity
            lowest = index.lowest_class() if index is not None else None
            if lowest is None:
                lowest = min(map(attrgetter("priority"), self.s.running), default=10**9)
            self._lowest_class = lowest
        return self._lowest_class < priority

    def _candidates(
        self,
        job: JobRequest,
        model: str,
        pool: ModelPool | None,
        reclaim: bool,
        within: bool,
        allowed: frozenset[str] | None,
    ) -> tuple[list[RunningJob], Guarantees | None]:
        """The jobs `job` may preempt on `model` (`_candidates_for`) where it may land
        (`allowed`: None, anywhere), each alone allowed by what other teams' guaranteed quotas
        protect, in pool order; and those guarantees (`_guarantees`: None when no other team
        has a quota of `model`, or no candidate is left to ask them of)."""
        if pool is None:
            return [], None
        picked = self._candidates_for(job, model, pool, reclaim)
        jobs = pool.jobs
        if allowed is not None:
            picked = [i for i in picked if any(s.node in allowed for s in jobs[i].allocation.slices)]
        guarantees = self._guarantees(job, model, within) if picked and self.quotas.has_quotas else None
        if guarantees is not None:
            picked = self._left_by_guarantees(job, pool, picked, guarantees, within)
        return list(map(jobs.__getitem__, picked)), guarantees

    def _candidates_for(self, job: JobRequest, model: str, pool: ModelPool, reclaim: bool) -> list[int]:
        """Positions in `pool` of the jobs `job` may preempt, in pool order: lower class (for a
        service replica, only as `preemption.serving_victims` allows), of its own class for
        attained service (`_las_victim`), or (when it reclaims its quota) another team's while
        that team borrows `model`; none preempted already this cycle.

        The pool is in class order, so each rule reads its segment of it at C speed
        (`ModelPool.pick`): the lower classes, the asker's own, the higher ones. Only the own
        class's jobs that checkpointed are asked one by one, for attained service: one that
        never did is no LAS victim (`attained.standing`). Why: a reclaiming asker's pool holds
        every class (~15,000 jobs a model at 10,000 nodes), and a Python step per job per
        asker was most of preempting in a cold cycle."""
        priority = job.priority
        lo, hi = pool.bounds(int(priority))
        borrowing: frozenset[str] = frozenset()
        if reclaim:
            team, quotas = job.team, self.quotas
            borrowing = frozenset(t for t in pool.team_set if t != team and quotas.borrowing(t, model))
        lower = (False, False)  # taken for its class alone: when checkpointed, when not
        if self.policy.priorities:
            may_take = self.policy.may_preempt_by_class
            lower = (may_take(priority, True), may_take(priority, False))
        picked = list(pool.pick(0, lo, *lower, borrowing))
        if self._las and lo < hi:
            taken = list(map(borrowing.__contains__, islice(pool.teams, lo, hi)))
            jobs = pool.jobs
            if self.las_pool_filter:
                # `_las_victim` inline (one Python call fewer per job asked, every asker).
                rank = self._ranks.get(job.job_id, 0.0)
                allowance = self.policy.ordering.allowance(rank)
                fair = self.policy.fair_share
                mine = self._over_share(job.team) if fair else 0.0
                standing, over = self._standing, self._over_share
            for i in compress(range(lo, hi), pool.checkpointed_in(lo, hi)):
                if taken[i - lo]:
                    continue
                v = jobs[i]
                if not self.las_pool_filter:
                    taken[i - lo] = self._las_victim(job, v)
                    continue
                st = standing.get(v.job_id, _UNSEEN)
                if st is _UNSEEN:
                    st = self._standing_of(v)
                taken[i - lo] = (
                    st is not None and st[0] > rank and st[1] <= allowance and (not fair or over(v.team) >= mine)
                )
            picked += compress(range(lo, hi), taken)
        else:
            picked += pool.pick(lo, hi, False, False, borrowing)
        picked += pool.pick(hi, len(pool.jobs), False, False, borrowing)
        return pool.without(picked, self._preempted.get(model, set()))

    def _las_victim(self, job: JobRequest, v: RunningJob) -> bool:
        """Whether `job` may preempt `v`, of its own class, for attained service alone
        (core/attained.py: a later queue, checkpointed, its minimum slice had, a loss within
        the asker's allowance), and, with fair share, only from a team at least as far over
        its share as the asker's (LAS reorders work; it must not move GPUs to a team that has
        had more than its share from one that has had less)."""
        if not self._las:
            return False
        if not self.las_pool_filter:
            may = attained.may_take(
                self._ranks.get(job.job_id, 0.0), v, self.policy.ordering, self.s.attained, self.now
            )
            return may and (not self.policy.fair_share or self._over_share(v.team) >= self._over_share(job.team))
        standing = self._standing_of(v)
        if standing is None or not attained.takes(self._ranks.get(job.job_id, 0.0), standing, self.policy.ordering):
            return False
        return not self.policy.fair_share or self._over_share(v.team) >= self._over_share(job.team)

    def _queue_rank(self, job: JobRequest) -> float:
        """A queued job's attained-service queue (its rank without a Gittins fraction, see
        core/gittins.py): all that attained-service preemption compares (`attained.takes`), so
        the victim pool and the shared answers are kept per queue, not per index. `run`'s walk
        reads it inline (a method call per job passed was measurable there): change both."""
        return float(int(self._ranks.get(job.job_id, 0.0)))

    def _standing_of(self, v: RunningJob) -> attained.Standing | None:
        """`attained.standing` of a running job, once per cycle: it depends on the job, the
        snapshot's attained service and `now` alone, and every asker of the cycle reads it."""
        standing = self._standing
        if v.job_id in standing:
            return standing[v.job_id]
        got = standing[v.job_id] = attained.standing(v, self.policy.ordering, self.s.attained, self.now)
        return got

    def _victim_pool(self, below: int | None, rank: float | None = None) -> dict[str, ModelPool]:
        """Preemptible running jobs by GPU model, ranked by `_victim_cost`, built once per cycle.

        It looks at every running job (60,000 at scale), so the loop reads each job's fields
        once, in the order the jobs come (near their order in memory), and keeps each part of
        its cost and what an asker reads of it in a column (core/victim_pool.py: `Columns`);
        `rank_pool` then sorts one column at a time and keeps the columns every asker reads
        in pool order (`ModelPool`), so that `_candidates_for` reads them at C speed.

        `below`: when the asking job can take only lower classes (no quota to reclaim), the
        pool need only hold running jobs of a class below it. Why: with filled priorities most
        running jobs are of the asker's class or above, and ranking them was most of the
        pool's cost. `_candidates_for` takes from the pool exactly the jobs below the asker's
        class, in pool order; a ranking of a subset keeps the subset's order in the full
        ranking (the same keys, stable sorts), so the candidates are the same. A later asker
        of a higher class than the pool was built for rebuilds it (None: every class).

        `rank`: the asker's attained-service rank, under LAS preemption. With a class bound the
        asker's own class is in the pool for LAS alone (`_candidates_for`), so of that class
        only the jobs an asker of this rank may take (`attained.takes`; fair share is left to
        `_candidates_for`) are kept, and each one's standing is worked out here, inline, once
        a cycle (`_standing`). Exact by the same subset argument: an asker of a lower class
        takes no job of this class, one of the same class and another rank rebuilds the pool.
        Every running job of the class is still looked at for a shared GPU (`_shared_pool`).
        Why: most running jobs are of the asker's class and are no LAS victim of it (a
        checkpoint too long ago for its allowance, no checkpoint yet, their slice not had), and
        ranking them, then asking each per asker, was most of a `las` cycle on Philly.
        """
        built = self._pool_below
        if self._pools is not None and (
            built is None or (below is not None and (below < built or (below == built and rank == self._pool_rank)))
        ):
            return self._pools
        self._pool_below, self._pool_rank = below, rank
        pre = self.policy.preemption
        protected, min_runtime, now, gpus = pre.protected_classes, pre.min_runtime_s, self.now, self.cap.gpus
        own = below - 1 if self._las and self.las_pool_filter and below is not None and rank is not None else None
        ordering, attained_s, cache = self.policy.ordering, self.s.attained, self._standing
        queues, min_slice, restart = ordering.queues, ordering.min_slice_s, ordering.restart_cost_s
        asked = rank if rank is not None else 0.0
        allowance = ordering.allowance(asked)
        shared = self._shared_pool = set()
        pools: dict[str, Columns] = {}
        adders: dict[str, Adders] = {}  # model -> its columns' `append`s (one lookup a job, not eight)
        # The GPUs each job holds are read only by the guarantees' filter (`_left_by_guarantees`),
        # which runs only under quotas. Why not always: whole Philly (no quotas) builds ~100,000
        # small pools, and summing each multi-node job's slices for them cost ~2% of its run.
        with_holds = self.quotas.has_quotas
        running: Iterable[RunningJob] = self.s.running
        # A job of the asker's class that has not checkpointed is no LAS victim, and when no
        # job shares a GPU it adds nothing to `_shared_pool` either: passed over first thing.
        # Why: on whole Philly under `las` ~120 of the ~226 running jobs a normal job's pool
        # looked at were such, each taken through every test below before being dropped.
        bare = own is not None and not self._shares_running()
        view = self.s.running_by_class
        if view is not None and view.running is self.s.running and below is not None:
            # The caller keeps the running jobs by class: only the classes below the bound, and
            # of the asker's own those that checkpointed when that is all the loop would keep
            # (the same jobs the tests below keep: the pool's order does not depend on the order
            # they come in, its last key being the job id).
            # Of the asker's own class, none when no queue is later than the asker's (no job
            # of it is a LAS victim then: `takes`), else by GPUs and newest checkpoint first,
            # only those up to the first in each group whose loss is over the allowance
            # (`_recent`). Why: on Philly under `las-gittins` ~33 of the class's checkpointed
            # jobs were looked at per pool (half the pools' asker in the last queue) to keep ~0.4.
            recent, parts = view.recent, list[Iterable[RunningJob]]()
            for cls, (checkpointed, never) in view.classes.items():
                if cls >= below:
                    continue
                if not (bare and cls == own):
                    parts += (checkpointed.values(), never.values())
                elif asked < len(queues):
                    groups = recent.get(cls) if recent is not None else None
                    parts.append(
                        _recent(groups, now, restart, allowance) if groups is not None else checkpointed.values()
                    )
            running = chain.from_iterable(parts)
        elif bare and own is not None and not self._lower_class_runs(own):
            # Every job the pool could hold is of the asker's class: those are left out at C
            # speed, before the loop.
            running = compress(running, map(is_not, map(_CHECKPOINT, running), repeat(None)))
        limit = below if below is not None else _ANY_CLASS
        mine = own if own is not None else _NO_CLASS
        for j in running:
            priority = j.priority
            if priority >= limit:
                continue
            checkpoint = j.last_checkpoint_at
            if priority == mine and checkpoint is None and bare:
                continue
            started = j.started_at
            if j.stopping or priority in protected or not now - started >= min_runtime:
                continue
            slices = j.allocation.slices
            first = slices[0]
            if priority == mine:
                # `attained.standing` and `attained.takes`, inline (the same float operations).
                if checkpoint is None or now - started < min_slice:
                    st = None
                else:
                    st = cache.get(j.job_id, _UNSEEN)
                    if st is _UNSEEN:
                        n = len(slices[0].gpu_indices) * first.share if len(slices) == 1 else j.allocation.gpu_count
                        loss = n * (now - checkpoint + restart)
                        if loss > allowance:
                            # Not this asker's to take whatever its queue (most running jobs:
                            # a checkpoint too long ago), so no queue looked up; its standing
                            # is left to `_standing_of`, should an asker of another queue ask.
                            st = None
                        else:
                            q = bisect_right(queues, attained_s.get(j.job_id, 0.0) + n * max(0.0, now - started))
                            st = cache[j.job_id] = (q, loss)
                if st is None or not (st[0] > asked and st[1] <= allowance):
                    if first.share < 1:
                        gpu = gpus.get((first.node, first.gpu_indices[0]))
                        if gpu is not None:
                            shared.add(gpu.model)
                    continue
            try:  # no test on the way in: this loop runs over every running job (zero-cost `try`)
                gpu = gpus.get((first.node, first.gpu_indices[0]))
            except IndexError:
                continue  # a CPU-only job holds no GPU: preemption (which frees GPUs) never takes it
            if gpu is None:
                continue
            if first.share < 1:
                shared.add(gpu.model)  # counted GPU by GPU when preempted for (`choose_victims`)
            adds = adders.get(gpu.model)
            if adds is None:
                adds = adders[gpu.model] = pools.setdefault(gpu.model, Columns()).adders()
            add_job, add_class, add_team, add_lost, add_start, add_id, add_checkpointed, add_held = adds
            add_job(j)
            add_class(priority)
            add_team(j.team)
            add_lost(now - (checkpoint if checkpoint is not None else started))
            add_start(-started)
            add_id(j.job_id)
            add_checkpointed(checkpoint is not None)
            if not with_holds:
                continue
            # Whole GPUs on one node (the first slice, on this model): `gpus_held`'s one term, as
            # the int it equals (a shared small int, not a float made per job).
            if first.share == 1 and len(slices) == 1:
                add_held(len(first.gpu_indices))
            else:
                add_held(gpus_held(j.allocation, gpu.model, gpus))
        over = {team: -self._over_share(team) for c in pools.values() for team in set(c.teams)}
        teams = frozenset(over)
        self._pools = {model: rank_pool(c, over, teams) for model, c in pools.items()}
        return self._pools

    def _shares_running(self) -> bool:
        """Whether a running job's first slice is a share of a GPU (once a cycle): a told
        capacity index keeps the answer (`CapacityIndex.shares_running`); else a pass at C speed."""
        if self._any_share_running is None:
            index = self.s.capacity
            got = index.shares_running() if index is not None else None
            if got is None:
                firsts = map(_FIRST, map(_SLICES, self.s.running))
                got = any(map(lt, map(_SHARE, firsts), repeat(1)))
            self._any_share_running = got
        return self._any_share_running

    def _victim_cost(self, v: RunningJob) -> CostKey:
        lost = self.now - (v.last_checkpoint_at if v.last_checkpoint_at is not None else v.started_at)
        return (int(v.priority), -self._over_share(v.team), lost, -v.started_at, v.job_id)

    def _over_share(self, team: str) -> float:
        if team not in self._fair_ratio:
            self._fair_ratio[team] = self.s.usage.get(team, 0.0) / max(self.policy.share(team), 1e-9)
        return self._fair_ratio[team]

    # ---- waiting ----------------------------------------------------------------------------

    def _reserve_or_wait(
        self, job: JobRequest, models: list[str], blocked_by: Reservation | None, gpus_busy: bool = False
    ) -> None:
        """Reserve GPUs for the job or give it its wait. `gpus_busy`: no model has as many free
        GPUs as it asks (then it cannot be waiting for CPUs or memory beside free ones)."""
        if blocked_by is not None:
            wait = self._behind.get(blocked_by.model)
            if wait is None:
                wait = self._behind[blocked_by.model] = Wait(
                    WaitReason.BEHIND_RESERVATION,
                    WaitFacts(blocked_by=blocked_by.job_id, model=blocked_by.model, reserved_at=blocked_by.shadow),
                )
            self.waiting[job.job_id] = wait
            return
        sel = job.selection
        exclusive = sel is not None and sel.exclusive
        allowed = self.cap.allowed(sel) if sel is not None and sel.filters else None
        if self._quota_pools:
            full = self._pool_full(job)[0]
            if full:
                allowed = (allowed if allowed is not None else frozenset(self.cap.node_labels)) - full
        # CPUs and memory count only where nodes account them; elsewhere any request fits.
        host = job.host and bool(self.cap.node_cpus or self.cap.node_hmem)
        free_on = self._gpus_free_for(job, models) if host and not gpus_busy else None
        if not job.fractional and len(self.reservations) < len(self.cap.model_memory):
            for model in models:
                if model in self.reservations:
                    continue
                if host:
                    # Its GPUs, CPUs and memory all held: backfill never delays it for want
                    # of any of them (also when its GPUs are free now and its CPUs are not).
                    res = reserve_host(job, model, self.cap, self._host_end_times(), self.now, allowed)
                    if res is not None:
                        self._host_reserved[model] = res
                else:
                    res = reserve(job, model, self.cap, self._end_times(), self.now, allowed)
                if res is not None:
                    self.reservations[model] = res
                    if not self.reasons:
                        self.waiting[job.job_id] = Wait(WaitReason.RESERVED, NO_FACTS, res.shadow)
                        return
                    # Short of CPUs or memory alone: its numbers too, as the wait without a reservation has.
                    short = self._host_wait(job, free_on).facts if free_on is not None else NO_FACTS
                    facts = replace(
                        short,
                        variant=short.variant,
                        model=model,
                        gpus=job.gpus,
                        cpus=job.cpus if host and job.cpus else None,
                        mem_mb=job.mem_mb if host and job.mem_mb else None,
                        nodes=tuple(sorted(res.nodes)[:3]),
                        nodes_count=len(res.nodes),
                        reserved_at=res.shadow,
                        selection=sel.describe() if sel is not None else None,
                        exclusive=exclusive or None,
                    )
                    self._wait(job, WaitReason.RESERVED, facts, res.shadow)
                    return
        if free_on is not None:
            # Its GPUs are free but not the CPUs or memory beside them, and no reservation could
            # be made (its model holds one already): it waits, naming for what.
            self.waiting[job.job_id] = self._host_wait(job, free_on) if self.reasons else _HOST_BUSY
            return
        if not self.reasons:
            self.waiting[job.job_id] = _BUSY  # the plan's reader wants no numbers (see `decide`)
            return
        model = models[0]
        if sel is not None:
            self.waiting[job.job_id] = self._selection_wait(job, sel, model)
            return
        most = self.cap.most_free_on_a_node(model)
        key = (model, job.gpus, self.cap.free_count(model), most)
        wait = self._waits.get(key)
        if wait is None:
            spread = job.fractional or int(job.gpus) > self.cap.node_size[model]
            wait = self._waits[key] = Wait(
                WaitReason.RESOURCES,
                WaitFacts(
                    model=model, gpus=job.gpus, free=self.cap.free_count(model), most_on_node=most, spread=spread
                ),
            )
        self.waiting[job.job_id] = wait

    def _gpus_free_for(self, job: JobRequest, models: list[str]) -> str | None:
        """The first of `models` on which the job's GPUs alone could be placed now (its CPUs
        and memory not asked), or None. Whole-GPU answers are kept per GPU shape while no GPU
        is taken (`Capacity.version`): most jobs waiting for CPUs share a few GPU shapes."""
        key = (job.gpus, job.gpu_types, job.gpu_memory_mb, job.min_gpu_memory_mb, job.nodes, job.selection, *models)
        version = self.cap.version
        if not job.fractional:
            hit = self._bare_free.get(key)
            if hit is not None and hit[0] == version:
                return hit[1]
        found = None
        for model in models:
            if job.selection is None:
                free = self.cap.fits(job, model, gpus_only=True)  # whole GPUs: bucket counts only
            else:
                free = self.cap.place(job, model, self._off(job, model), gpus_only=True) is not None
            if free:
                found = model
                break
        if not job.fractional:
            self._bare_free[key] = (version, found)
        return found

    def _host_wait(self, job: JobRequest, model: str) -> Wait:
        """The wait of a job whose GPUs are free on `model` but not its CPUs or host memory
        beside them: "waiting for CPUs: needs 4 CPU(s) beside 1 free H100 GPU(s) on a node; the
        nodes with those GPUs free have at most 2 CPU(s) left"."""
        cap = self.cap
        per = 1 if job.fractional else int(job.gpus) // (job.nodes or 1)
        if not job.fractional and not job.nodes and int(job.gpus) > cap.node_size[model]:
            per = 1
        cpus, mem = cap.host_part(job, per if not job.fractional else job.gpus)
        off = self._off(job, model) if job.selection is not None else frozenset()
        nodes = [nd for nd in cap.nodes_with_free(model, 1 if job.fractional else per) if nd not in off]
        if job.fractional:
            nodes += [key[0] for key in cap.partial[model] if key[0] not in off]
        left = [cap.free_host(nd) for nd in nodes]
        short_cpus = cpus > 0 and all(c is not None and c + 1e-9 < cpus for c, _ in left)
        if short_cpus or not mem:
            most = max((c for c, _ in left if c is not None), default=0.0)
            return Wait(
                WaitReason.CPUS,
                WaitFacts(variant="cpus", model=model, per_node=per, node_cpus=cpus, most_cpus=most),
            )
        most_mem = max((m for _, m in left if m is not None), default=0)
        return Wait(
            WaitReason.MEMORY,
            WaitFacts(variant="memory", model=model, per_node=per, node_mem_mb=mem, most_mem_mb=most_mem),
        )

    def _selection_wait(self, job: JobRequest, sel: Selection, model: str) -> Wait:
        """The wait of a job with a node selection whose GPUs are busy, naming the selection:
        "no free node matches --constraint ib: 2 node(s) match, 2 of them busy ..."."""
        cap = self.cap
        key = (sel, model, job.gpus, job.nodes, cap.version)
        wait = self._waits.get(key)
        if wait is not None:
            return wait
        off = self._off(job, model)
        allowed = cap.allowed(sel) if sel.filters else None
        matching = [n for n in cap.model_nodes(model) if allowed is None or n in allowed]
        free = cap.free[model]
        if job.fractional or (not job.nodes and int(job.gpus) > cap.node_size[model]):
            per = 1
        else:
            per = int(job.gpus) // (job.nodes or 1)
        busy = sum(1 for n in matching if n in off or len(free.get(n, ())) < per)
        most = max((len(free.get(n, ())) for n in matching if n not in off), default=0)
        wait = self._waits[key] = Wait(
            WaitReason.RESOURCES,
            WaitFacts(
                variant="selection",
                selection=sel.describe(),
                model=model,
                gpus=job.gpus,
                nodes_count=len(matching),
                busy=busy,
                most_on_node=most,
                exclusive=sel.exclusive or None,
            ),
        )
        return wait

    def _no_fit_facts(self, job: JobRequest) -> WaitFacts:
        if job.host:
            bare = replace(job, cpus=0.0, mem_mb=0)
            if self._models(bare):
                return self._host_no_fit_facts(job)
        sel = job.selection
        kinds = tuple(job.gpu_types) if job.gpu_types else None
        if sel is not None and sel.filters:
            allowed = self.cap.allowed(sel)
            if not allowed:
                return unmatched_facts(sel, self.cap.node_labels)
            return WaitFacts(
                variant="selection",
                selection=sel.describe(),
                gpus=job.gpus,
                gpu_types=kinds,
                nodes=tuple(sorted(allowed)[:5]),
                nodes_count=len(allowed),
            )
        sizes = tuple((m, n, self.cap.total[m]) for m, n in sorted(self.cap.node_size.items()))
        return WaitFacts(variant="shape", gpus=job.gpus, gpu_types=kinds, sizes=sizes)

    def _host_no_fit_facts(self, job: JobRequest) -> WaitFacts:
        """No node could ever hold the job's CPUs or memory beside its GPUs."""
        most_cpus, most_mem = self.cap.most_host()
        return WaitFacts(
            variant="host",
            gpus=job.gpus,
            cpus=job.cpus or None,
            mem_mb=job.mem_mb or None,
            most_cpus=most_cpus,
            most_mem_mb=most_mem,
        )

    def _wait(self, job: JobRequest, reason: WaitReason, facts: WaitFacts, estimated: float | None = None) -> None:
        self.waiting[job.job_id] = Wait(reason, facts, estimated)

    # ---- expected ends ----------------------------------------------------------------------

    def _end_times(self) -> EndTimes:
        if self._ends is None:
            grace, default = self.policy.preemption.grace_period_s, self.policy.default_time_limit_s
            index = self.s.capacity
            book = index.end_book(self.s.running, default) if index is not None else None
            self._ends = EndTimes(book)
            # With a book kept across cycles only the jobs it holds aside (stopping, sharing a
            # GPU) are worked out here; without one, every running job.
            running = book.aside.values() if book is not None else self.s.running
            for j, end in self._ends.add_running(running, self.cap.gpus, self.now, grace, default):
                self._add_end(j.job_id, j.allocation, end)
            for st, end in zip(self.starts, self._start_ends, strict=True):
                self._add_end(st.job_id, st.allocation, end)
            for (node, _), (model, end) in self._shared_end.items():
                self._ends.add(model, node, end, 1)
            self._shared_listed = True
        return self._ends

    def _host_end_times(self) -> EndTimes:
        """`_end_times` with the ends of CPUs and host memory too (`EndTimes.host_by_node`),
        filled when a job asking for them first needs a reservation: from the book's sorted
        ends plus the jobs it holds aside, or from every running job without a book."""
        ends = self._end_times()
        if ends.host_by_node is None:
            grace, default = self.policy.preemption.grace_period_s, self.policy.default_time_limit_s
            running = ends.book.aside.values() if ends.book is not None else self.s.running
            ends.add_host_running(running, self.now, grace, default)
            for st, end in zip(self.starts, self._start_ends, strict=True):
                ends.add_host(st.allocation, end)
        return ends

    def _add_end(self, job_id: int, allocation: Allocation, end: float) -> None:
        assert self._ends is not None
        for s in allocation.slices:
            if not s.gpu_indices:
                continue  # a CPU-only job's slice: no GPU comes back (its host part: `add_host`)
            model = self.cap.gpus[(s.node, s.gpu_indices[0])].model
            if s.share < 1:
                # A shared GPU comes back whole when its last sharer ends.
                key = (s.node, s.gpu_indices[0])
                was = self._shared_end.get(key)
                if was is not None and was[1] >= end:
                    continue
                self._shared_end[key] = (model, end)
                if self._shared_listed:
                    # A share started after the ends were listed: the GPU comes back when its
                    # last sharer ends, so its listed end moves to this one's (or is listed).
                    if was is not None:
                        self._ends.by_node[(model, s.node)].remove((was[1], 1))
                    self._ends.add(model, s.node, end, 1)
                continue
            self._ends.add(model, s.node, end, len(s.gpu_indices))


def _recent(
    groups: Mapping[float, dict[int, RunningJob]], now: float, restart: float, allowance: float
) -> list[RunningJob]:
    """Of a class's checkpointed jobs by GPUs, each group oldest checkpoint first
    (`RunningByClass.recent`), those whose loss is within a LAS asker's allowance: each group
    newest first, up to the first over it. Exact for `_Cycle._victim_pool` when no GPU is
    shared (`bare`): the loss is worked out as there (`n * (now - checkpoint + restart)`, the
    same floats, `n` the group's GPUs, equal to the pool's), it only grows as the checkpoint
    gets older, and a job over the allowance is passed over there with no effect (no standing
    kept, no shared GPU)."""
    out: list[RunningJob] = []
    for n, group in groups.items():
        for j in reversed(group.values()):
            if n * (now - cast(float, j.last_checkpoint_at) + restart) > allowance:
                break
            out.append(j)
    return out


def usage_now(usage: Mapping[str, float]) -> dict[str, float]:
    return dict(usage)
