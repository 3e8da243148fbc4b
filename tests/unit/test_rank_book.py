"""The Gittins ranks kept across cycles (core/rank_book.py) are `gittins_ranks`'s, whatever came before."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucluster.core import queue_index, rank_book
from gpucluster.core.attained import Ordering, gittins_ranks
from gpucluster.core.attained import ranks as attained_ranks
from gpucluster.core.policy import Policy, las_gittins_policy
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.queueing import RankedLines, TeamQueues
from gpucluster.core.rank_book import Logged, RankBook
from gpucluster.core.runtime_predict import RunDistribution
from gpucluster.core.types import JobRequest

from .builders import job

H = 3600.0
POLICY = las_gittins_policy()
LAS = Ordering(mode="las", preempt=True, promote_after_s=24 * H, runtime_model="gittins")
PLAIN = replace(LAS, runtime_model="none")  # plain LAS: the book ranks by queue alone
DISTS = [
    RunDistribution.of([60.0, 90.0, 120.0]),
    RunDistribution.of([5000.0, 7000.0, 9000.0]),
    RunDistribution.of([30.0, 3 * H, 3 * H, 40 * H]),
    RunDistribution.of([0.5, 1.0, 1.0]).scaled(2 * H),
]

# One step of a history: (what, job id, a number the step reads).
_STEP = st.tuples(
    st.sampled_from(["arrive", "leave", "requeue", "attain", "dist", "forget", "time", "back", "ordering", "cycle"]),
    st.integers(0, 11),
    st.integers(0, 40),
)


def _job(job_id: int, at: float, gpus: float, queued_at: float | None, classes: bool = False) -> JobRequest:
    """Of one of three teams (ranks read no team; the book's kept lines are per team);
    `classes`: of one of two priority classes too (each its own level of lines)."""
    built = job(job_id).at(at).gpus(gpus).team("abc"[job_id % 3])
    if classes:
        built = built.priority(("low", "high")[job_id // 3 % 2])
    return replace(built.build(), queued_at=queued_at)


class _World:
    """A caller's queue, attained and learned maps, and clock, changed one step at a time;
    `index`: none, one told what enters and leaves (the simulator's), or one left to diff."""

    def __init__(self, index: str = "none", base: Ordering = LAS, classes: bool = False) -> None:
        self.index = None if index == "none" else QueueIndex(told=index == "told")
        self.classes = classes
        self.queued: dict[int, JobRequest] = {}
        self.attained: Logged[float] = Logged()
        self.dists: Logged[RunDistribution] = Logged()
        self.now = 100 * H
        self.base = self.ordering = base

    def step(self, what: str, jid: int, n: int) -> None:
        if what == "arrive" and jid not in self.queued:
            # Some submitted over `promote_after` ago; a few stamped before their submission.
            queued_at = None if n % 3 else self.now - n * H / 2
            self._enter(_job(jid, self.now - n * 2 * H, (1, 2, 8, 0.5)[n % 4], queued_at, self.classes))
        elif what == "leave" and jid in self.queued:
            self._leave(jid)
        elif what == "requeue" and jid in self.queued:
            old = self._leave(jid)
            self._enter(replace(old, queued_at=self.now))
        elif what == "attain":
            self.attained[jid] = self.attained.get(jid, 0.0) + n * 0.37 * H
        elif what == "dist":
            self.dists[jid] = DISTS[n % len(DISTS)]
        elif what == "forget":
            self.dists.pop(jid, None)
            if n % 5 == 0:
                self.dists.update(dict.fromkeys(range(0, 12, 2), DISTS[n % len(DISTS)]))
        elif what == "time":
            self.now += n * n * 0.29 * H  # up to ~19 days: jobs cross `promote_after`
        elif what == "back":
            self.now -= n * H  # a probe at an earlier time
        elif what == "ordering":
            self.ordering = replace(self.base, queues=(H, (8 + n % 3) * H)) if n % 2 else self.base

    def _enter(self, job: JobRequest) -> None:
        self.queued[job.job_id] = job
        if self.index is not None:
            self.index.add(job)

    def _leave(self, jid: int) -> JobRequest:
        job = self.queued.pop(jid)
        if self.index is not None:
            self.index.remove(job)
        return job

    def want(self) -> dict[int, float]:
        queued = list(self.queued.values())
        if not self.ordering.gittins:  # plain LAS: `attained.ranks`, which reads no distribution
            got = attained_ranks(queued, self.ordering, dict(self.attained), {}, self.now)
            return {k: v for k, v in got.items() if v}  # (all of them unless nothing attained ranks above 0)
        return gittins_ranks(queued, self.ordering, self.attained, self.dists, self.now)

    def popped(
        self, book: RankBook, policy: Policy, most: int | None = None
    ) -> tuple[list[JobRequest], list[JobRequest]]:
        """A cycle's order (at most `most` jobs): `TeamQueues` on the book's live ranks and
        kept lines, and on a fresh ranking (`want`)."""
        queued = tuple(self.queued.values())
        if self.index is not None:
            self.index.update(queued, policy)
        live = book.ranks(queued, self.ordering, self.attained, self.dists, self.now, self.index)
        presorted = self.index.sorted_in(policy, self.now) if self.index is not None else None
        got = _popped(TeamQueues(queued, policy, {}, self.now, None, presorted, live, book.lines), most)
        return got, _popped(TeamQueues(queued, policy, {}, self.now, ranks=self.want()), most)

    def got(self, book: RankBook) -> dict[int, float]:
        queued = tuple(self.queued.values())
        if self.index is not None:
            self.index.update(queued, POLICY)  # as `decide` does before it ranks
        return book.ranks(queued, self.ordering, self.attained, self.dists, self.now, self.index)


@pytest.mark.parametrize(
    ("few", "index", "base"),
    [
        (0, "none", LAS),
        (8, "none", LAS),
        (0, "told", LAS),
        (8, "told", LAS),
        (8, "diff", LAS),
        (8, "none", PLAIN),
        (8, "told", PLAIN),
        (8, "diff", PLAIN),
    ],
)
@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_STEP, max_size=80))
def test_the_book_answers_as_gittins_ranks_after_any_history(
    few: int, index: str, base: Ordering, steps: list[tuple[str, int, int]]
) -> None:
    """`few`: jobs ranked again one by one up to this many, else through `gittins_ranks`;
    `index`: the book follows a queue index's moves, or compares the queue itself. Under plain
    LAS (`base`) the answer is `attained.ranks`', the very dict (only ranks above 0 named)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rank_book, "_FEW", few)
        world, book = _World(index, base), RankBook()
        for what, jid, n in steps:
            world.step(what, jid, n)
            if what == "cycle" or n % 2:
                assert world.got(book) == world.want()
        assert world.got(book) == world.want()


@pytest.mark.parametrize(("index", "base"), [("none", LAS), ("told", LAS), ("none", PLAIN), ("told", PLAIN)])
@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_STEP, max_size=80))
def test_lines_sorted_by_the_books_ranks_order_as_a_fresh_sort(
    index: str, base: Ordering, steps: list[tuple[str, int, int]]
) -> None:
    """`TeamQueues` on the book's live ranks and its kept lines (`RankedLines`, told which teams'
    ranks changed, so an unchanged line is not read) pops the jobs, the very objects, in the order
    a fresh sort by `gittins_ranks` gives, whatever the book saw before (`told`: the lines are the
    index's, handed back as the same lists while unchanged; plain LAS: lines no ranked job is
    in are left by age)."""
    world, book = _World(index, base), RankBook()
    policy = replace(POLICY, fair_share=False)
    for what, jid, n in steps:
        world.step(what, jid, n)
        got, want = world.popped(book, policy)
        assert [id(j) for j in got] == [id(j) for j in want]


@pytest.mark.parametrize(("index", "base"), [("none", LAS), ("told", LAS), ("told", PLAIN)])
@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_STEP, max_size=80))
def test_lines_a_cycle_did_not_reach_are_kept_valid_for_the_next(
    index: str, base: Ordering, steps: list[tuple[str, int, int]]
) -> None:
    """As above, but some cycles pop only the first few jobs (or none), over two
    priority classes: `TeamQueues` asks for a level's lines only when the walk reaches it, so
    a line may go unasked for many cycles while its team's ranks change, and must then be
    sorted again, not handed back as kept (a `RankedLines` that trusted a line unless its
    team was stamped in the very cycle it is asked in passes the test above, not this one)."""
    world, book = _World(index, base, classes=True), RankBook()
    policy = replace(POLICY, fair_share=False)
    for what, jid, n in steps:
        world.step(what, jid, n)
        got, want = world.popped(book, policy, (0, None, 1, 3)[n % 4])  # none, all, or the first few
        assert [id(j) for j in got] == [id(j) for j in want]


def test_a_line_not_asked_for_while_its_ranks_changed_is_sorted_again() -> None:
    """Team a's low line (jobs 0 and 6, behind its high job 3; job 6 in queue 1) is sorted, then
    a cycle pops only the high job (the low line not asked for) while job 0 gains attained
    service (queue 2), then a cycle walks every job: job 0 must now come after job 6."""
    world, book = _World("told", PLAIN, classes=True), RankBook()
    policy = replace(POLICY, fair_share=False)
    for jid in (0, 3, 6):
        world.step("arrive", jid, 1)
    world.step("attain", 6, 4)

    def popped(most: int | None) -> list[int]:
        got, want = world.popped(book, policy, most)
        assert got == want
        return [j.job_id for j in got]

    assert popped(None) == [3, 0, 6]
    world.step("attain", 0, 40)  # stamps team a in a cycle that does not reach its low line
    assert popped(1) == [3]
    assert popped(None) == [3, 6, 0]


def test_a_kept_line_follows_a_promotion_a_probe_back_in_time_and_a_new_rank() -> None:
    """A promotion (no input of the job changed, only `now`), a start again (a probe at an
    earlier time) and a job's new attained service change ranks: the kept lines must not be
    told they are unchanged."""
    world, book = _World(), RankBook()
    policy = replace(POLICY, fair_share=False)
    world.queued[3] = _job(3, world.now - 23 * H, 1, None)  # two jobs of team "a"
    world.queued[6] = _job(6, world.now - H, 1, None)
    world.attained[3] = 2 * H  # in queue 1: after job 6 until it is promoted
    world.dists.update({3: DISTS[1], 6: DISTS[1]})

    def popped() -> list[int]:
        queued = tuple(world.queued.values())
        live = book.ranks(queued, world.ordering, world.attained, world.dists, world.now)
        got = _popped(TeamQueues(queued, policy, {}, world.now, ranks=live, lines=book.lines))
        assert got == _popped(TeamQueues(queued, policy, {}, world.now, ranks=world.want()))
        return [j.job_id for j in got]

    assert popped() == [6, 3]
    world.now += 2 * H
    assert popped() == [3, 6]  # job 3 promoted
    world.now -= 2 * H
    assert popped() == [6, 3] and book.rebuilds == 2
    world.attained[6] = 9 * H  # in queue 2: after job 3
    assert popped() == [3, 6] and book.rebuilds == 2


@pytest.mark.parametrize("base", [LAS, PLAIN])
@settings(max_examples=50, deadline=None)
@given(steps=st.lists(_STEP, max_size=60))
def test_a_lost_log_starts_the_book_again(base: Ordering, steps: list[tuple[str, int, int]]) -> None:
    """A log that overflowed (or a map cleared) says nothing of what changed: the book ranks
    everything again rather than trust what it kept."""
    world, book = _World(base=base), RankBook()
    for what, jid, n in steps:
        world.step(what, jid, n)
        assert world.got(book) == world.want()
        if n % 7 == 0:
            world.dists.clear()
        elif n % 11 == 0:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(rank_book, "LOG_LIMIT", 0)
                world.attained[jid] = world.attained.get(jid, 0.0) + H  # overflows: lost
    assert world.got(book) == world.want()


@pytest.mark.parametrize("index", ["none", "told", "diff"])
def test_only_the_jobs_whose_inputs_changed_are_ranked_again(index: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the book: a cycle ranks the jobs that entered, were requeued, or whose
    attained service or distribution changed, not the whole queue."""
    ranked: list[int] = []

    def counting(queued: Sequence[JobRequest], *args: object) -> dict[int, float]:
        ranked.extend(j.job_id for j in queued)
        return gittins_ranks(queued, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(rank_book, "gittins_ranks", counting)
    monkeypatch.setattr(rank_book, "_FEW", 0)  # every job ranked again goes through `gittins_ranks`
    world, book = _World(index), RankBook()
    for jid in range(10):
        world.step("arrive", jid, 5)
        world.step("dist", jid, jid)
    world.attained[3] = 2 * H
    assert world.got(book) == world.want() and book.rebuilds == 1
    ranked.clear()
    world.step("time", 0, 1)
    assert world.got(book) == world.want() and ranked == []  # nothing changed: nothing ranked
    world.step("arrive", 11, 1)
    world.step("requeue", 4, 0)
    world.step("dist", 7, 1)
    world.step("leave", 2, 0)
    world.dists[20] = DISTS[0]  # not queued: nothing to rank
    assert world.got(book) == world.want()
    assert sorted(ranked) == [4, 7, 11] and book.rebuilds == 1


def test_plain_maps_are_ranked_whole_each_time() -> None:
    """A caller whose maps do not log gets `gittins_ranks` itself."""
    queued = [_job(1, 0.0, 1, None), _job(2, H, 2, None)]
    dists = {1: DISTS[0], 2: DISTS[2]}
    book = RankBook()
    assert book.ranks(queued, LAS, {2: H}, dists, 2 * H) == gittins_ranks(queued, LAS, {2: H}, dists, 2 * H)
    assert book.rebuilds == 0


def test_logged_notes_every_write() -> None:
    m: Logged[float] = Logged()
    m[1] = 1.0
    m.update({2: 2.0}, **{})
    m.setdefault(3, 3.0)
    m.pop(1)
    del m[2]
    m |= {4: 4.0}
    assert sorted(m.take() or []) == [1, 1, 2, 2, 3, 4] and m.take() == []
    m.clear()
    assert m.take() is None and m.take() == []


def test_a_probe_at_an_earlier_time_is_not_promoted_by_a_later_one() -> None:
    """Promotion, once crossed, stays crossed only while time goes forward: a plan asked for an
    earlier `now` (an estimate, a probe) is ranked afresh."""
    world, book = _World(), RankBook()
    world.queued[1] = _job(1, world.now - 23 * H, 1, None)
    world.dists[1] = DISTS[1]
    early = dict(world.got(book))  # the answer itself changes at the next call
    assert early == world.want() and early[1] > 0.0
    world.now += 2 * H
    assert world.got(book) == world.want() == {1: 0.0}  # promoted
    world.now -= 2 * H
    assert world.got(book) == world.want() == early


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.integers(0, 9), st.sampled_from([0.0, 1.0, 2.5, H])), max_size=12))
def test_assign_makes_the_map_equal_and_logs_only_what_changed(reads: list[dict[int, float]]) -> None:
    """The head reads its attained map whole each plan and keeps one `Logged` map of it
    (head/kept_ranks.py): each read is written as its differences, and the log names exactly the
    keys whose value changed, came or went."""
    m: Logged[float] = Logged()
    last: dict[int, float] = {}
    for fresh in reads:
        assert m.assign(fresh) is m
        assert dict(m) == fresh
        changed = {k for k in fresh.keys() | last.keys() if fresh.get(k) != last.get(k)}
        assert set(m.take() or []) == changed
        last = dict(fresh)


def test_moves_nobody_takes_stop_being_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An index whose follower stopped asking (a head whose policy left Gittins ranks, or whose
    plans were handed a part of the queue) stops recording past MOVES_LIMIT instead of growing
    without end; a follower that asks then starts again (None: not known)."""
    monkeypatch.setattr(queue_index, "MOVES_LIMIT", 5)
    index, book = QueueIndex(told=True), RankBook()
    jobs = [_job(j, 0.0, 1, None) for j in range(20)]
    queued: list[JobRequest] = []
    for j in jobs[:2]:
        index.add(j)
        queued.append(j)
    index.update(queued, POLICY)
    attained: Logged[float] = Logged()
    dists: Logged[RunDistribution] = Logged()
    assert book.ranks(queued, LAS, attained, dists, H, index) == gittins_ranks(queued, LAS, {}, {}, H)
    assert book.rebuilds == 1
    for j in jobs[2:]:  # many cycles of arrivals nobody ranks
        index.add(j)
        queued.append(j)
        index.update(queued, POLICY)
        assert index._moves is None or len(index._moves) <= 5
    got = book.ranks(queued, LAS, attained, dists, H, index)  # the same maps: only the moves were lost
    assert got == gittins_ranks(queued, LAS, {}, {}, H) and book.rebuilds == 2


@settings(max_examples=150, deadline=None)
@given(
    cycles=st.lists(
        st.tuples(
            st.lists(st.integers(0, 15), max_size=12, unique=True),  # the queued jobs, by id
            st.dictionaries(st.integers(0, 15), st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5])),  # ranks
            st.lists(st.integers(0, 15), max_size=3),  # jobs replaced by an equal new object
        ),
        max_size=12,
    )
)
def test_lines_kept_across_cycles_order_as_a_fresh_sort(
    cycles: list[tuple[list[int], dict[int, float], list[int]]],
) -> None:
    """`TeamQueues` with the book's kept lines (`RankedLines`) pops the jobs, the very objects,
    in the order it pops them sorting every line afresh, whatever the lines were before: jobs
    that came or left, ranks that changed, a job replaced by an equal object (a kept line of
    the old one must not be handed back)."""
    lines = RankedLines()
    objects = {jid: replace(_job(jid, float(jid % 5), 1, None), team=("a", "b")[jid % 2]) for jid in range(16)}
    policy = replace(POLICY, fair_share=False)
    for ids, ranks, replaced in cycles:
        for jid in replaced:
            objects[jid] = replace(objects[jid])  # equal, not the same
        queued = [objects[jid] for jid in ids]
        want = _popped(TeamQueues(queued, policy, {}, H, ranks=ranks or None))
        got = _popped(TeamQueues(queued, policy, {}, H, ranks=ranks or None, lines=lines))
        assert [id(j) for j in got] == [id(j) for j in want]


def _popped(queues: TeamQueues, most: int | None = None) -> list[JobRequest]:
    """The jobs `queues` hands out, in order (`most`: at most this many)."""
    out: list[JobRequest] = []
    while len(out) != most and (job := queues.pop()) is not None:
        out.append(job)
        queues.done(job, False)
    return out


def test_a_line_no_ranked_job_was_in_is_sorted_once_one_of_its_jobs_is_ranked() -> None:
    """Plain LAS, the index's lines: a team line that no ranked job is in is handed out by age,
    and again, unread, while nothing of its team changes (`RankedLines.line`); once one of its
    jobs has attained service (the very same list from the index), it is sorted by rank. A line
    handed back on its identity alone, its team's stamp not asked, would keep job 1 first."""
    world, book = _World("told", PLAIN), RankBook()
    policy = replace(POLICY, fair_share=False)
    world.step("arrive", 1, 1)  # team "b", then job 4 of team "b" after it
    world.step("arrive", 4, 1)
    world.step("arrive", 3, 1)  # team "a", ranked: the cycle's ranks are never empty
    world.attained[3] = 2 * H

    def popped() -> list[int]:
        queued = tuple(world.queued.values())
        assert world.index is not None
        world.index.update(queued, policy)
        live = book.ranks(queued, world.ordering, world.attained, world.dists, world.now, world.index)
        presorted = world.index.sorted_in(policy, world.now)
        got = _popped(TeamQueues(queued, policy, {}, world.now, None, presorted, live, book.lines))
        assert got == _popped(TeamQueues(queued, policy, {}, world.now, ranks=world.want()))
        return [j.job_id for j in got]

    assert popped() == [1, 4, 3]
    assert popped() == [1, 4, 3]  # unchanged: handed back
    world.attained[1] = 2 * H  # queue 1 now: after job 4
    assert world.want() == {1: 1.0, 3: 1.0}
    assert popped() == [4, 1, 3]
