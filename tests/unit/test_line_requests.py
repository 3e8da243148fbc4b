"""The requests of the kept team lines, numbered once and kept across cycles
(`queueing.RankedLines.requests`), and the cycle that answers jobs by those numbers
(`scheduler._AfterPreemptor.skip_same`): a line's numbers are a fresh numbering of its jobs'
requests whatever the line was before, and plans made with them are the plans made without
any kept state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.policy import Policy, las_policy
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.queueing import RankedLines, by_age
from gpucluster.core.rank_book import Logged, RankBook
from gpucluster.core.runtime_predict import RunDistribution
from gpucluster.core.scheduler import _AfterPreemptor, decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Wait

from .builders import job
from .test_scheduler_attained_fast import EXAMPLES, las_scenarios
from .test_scheduler_plan_only import _fragmented
from .test_scheduler_properties import NOW, TEAMS

H = 3600.0


def _fresh(lines: RankedLines, line: list[JobRequest], ranks: dict[int, float]) -> tuple[list[int], list[int]]:
    """What `requests` must give: each job's (demand, queue) numbered by the same table."""
    table = lines.request_ids
    return [table[(j.demand, float(int(ranks.get(j.job_id, 0.0))))] for j in line], [j.job_id for j in line]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sets(st.integers(0, 15)),  # the jobs queued
            st.dictionaries(st.integers(0, 15), st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.25])),  # ranks
            st.lists(st.integers(0, 15), max_size=3),  # jobs replaced by another object ...
            st.booleans(),  # ... asking the same (else another GPU count: another demand)
            st.booleans(),  # team b's line reached by the walk (else not asked for its requests)
        ),
        max_size=12,
    )
)
def test_kept_numbers_are_a_fresh_numbering_whatever_the_line_was(
    cycles: list[tuple[set[int], dict[int, float], list[int], bool, bool]],
) -> None:
    """Over any history of two teams' lines (jobs that come and go, ranks that move a job to
    another queue or within one, jobs replaced by an object asking the same or asking more, a
    line the walk did not reach), each line's kept numbers and job ids equal a fresh numbering
    of the line handed out. A number kept for a job whose queue changed, matched by job id
    rather than by the object, or read from a sort of another line, gives another number."""
    lines = RankedLines()
    objects = {jid: job(jid).at(float(jid % 5)).gpus(1 + jid % 3).team("ab"[jid % 2]).build() for jid in range(16)}
    for present, ranks, replaced, same, reached in cycles:
        for jid in replaced:
            old = objects[jid]
            objects[jid] = replace(old) if same else replace(old, gpus=old.gpus + 8)
        queued = by_age(objects[jid] for jid in present)
        for team in "ab":
            line = lines.line(0, team, [j for j in queued if j.team == team], ranks)
            if team == "b" and not reached:
                continue
            numbers, ids, *_ = lines.requests(0, team, line, ranks)
            assert (numbers, ids) == _fresh(lines, line, ranks)


# A cycle's changes to a LAS cluster's queue: a job leaves, one is requeued (a new object, its
# attained service grown), a queued job's learned kind changes, the clock moves.
_STEP = st.tuples(st.sampled_from(["leave", "requeue", "attain", "dist", "time"]), st.integers(0, 40))
DIST = RunDistribution.of([60.0, 4 * H, 30 * H])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(las_scenarios(), st.lists(st.lists(_STEP, max_size=4), min_size=2, max_size=5))
def test_plans_with_kept_numbered_lines_are_plans_without_kept_state(
    scenario: tuple[Snapshot, Policy], history: list[list[tuple[str, int]]]
) -> None:
    """Cycle after cycle of a crowded LAS cluster whose queue changes, `decide` with the kept
    state a head hands it (its queue index, a rank book and its kept lines, the numbered
    requests they answer jobs by, logged maps) against `decide` on the plain snapshot: the same
    starts, preemptions and waits, in order. A job answered from a request number off by one
    place in its line, or from a stale number, waits otherwise or is considered again."""
    snap, policy = scenario
    queued = {j.job_id: j for j in snap.queued}
    attained, dists = dict(snap.attained), dict(snap.runtime_dist)
    book, index, now = RankBook(), QueueIndex(), NOW
    logged_attained: Logged[float] = Logged()
    logged_dists: Logged[RunDistribution] = Logged()
    for steps in history:
        for what, n in steps:
            ids = sorted(queued)
            jid = ids[n % len(ids)] if ids else None
            if what == "leave" and jid is not None:
                del queued[jid]
            elif what == "requeue" and jid is not None:
                queued[jid] = replace(queued[jid], queued_at=now)
                attained[jid] = attained.get(jid, 0.0) + n * 0.5 * H
            elif what == "attain" and jid is not None:
                attained[jid] = attained.get(jid, 0.0) + n * 0.3 * H
            elif what == "dist" and jid is not None and policy.ordering.gittins:
                dists[jid] = DIST
            elif what == "time":
                now += n * 60.0
        plain = replace(snap, queued=tuple(queued.values()), attained=dict(attained), runtime_dist=dict(dists))
        kept = replace(
            plain,
            queue_index=index,
            rank_book=book,
            attained=logged_attained.assign(attained),
            runtime_dist=logged_dists.assign(dists),
        )
        got = decide(kept, policy, now)
        want = decide(plain, policy, now)
        assert got.starts == want.starts
        assert got.preemptions == want.preemptions
        assert list(got.waiting.items()) == list(want.waiting.items())
        # Plan only (the simulator's cycle): jobs whose request changed nothing are kept across
        # starts and skipped by number too (`skip_kept`).
        got, want = decide(kept, policy, now, reasons=False), decide(plain, policy, now, reasons=False)
        assert (got.starts, got.preemptions) == (want.starts, want.preemptions)


def test_jobs_asking_what_an_earlier_one_asked_are_answered_by_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three GPUs free on each of three nodes under `las`; the 8-GPU job first in line reserves
    one, then 400 jobs of 5 and 4 GPUs in turn, of one team (every tenth ran before: queue 1,
    after the rest), with a 2-GPU job that fits halfway. With a rank book the jobs asking what
    an earlier one asked are answered by their requests' numbers, in the first cycle and in the
    next (the kept line), and each plan is the plan made without a book. After the 2-GPU job
    starts, a 5-GPU job answered by a number of before (not dropped with the answers of before)
    would say that nine GPUs are free, not seven."""
    nodes_, runs = _fragmented(3, free=3)
    sizes = [5, 4] * 100 + [2, 4, 4] + [5, 4] * 100
    line = tuple(job(10 + k).gpus(n).team(TEAMS[0]).at(float(k)).build() for k, n in enumerate(sizes))
    queue = (job(5).gpus(8).team(TEAMS[0]).at(-1.0).build(), *line)
    attained = {j.job_id: 2 * H for j in line[::10] if j.gpus != 2}
    policy = las_policy()
    plain = Snapshot(nodes_, runs, queue, attained=attained)
    kept = replace(plain, rank_book=RankBook(), attained=Logged[float]().assign(attained), runtime_dist=Logged())
    skip, numbered_front = _AfterPreemptor.skip_same, _AfterPreemptor._numbered_front
    answered: list[int] = []  # jobs answered by number, per `skip_same` that read numbers
    by_number = [False]

    def front(self: _AfterPreemptor) -> Any:
        got = numbered_front(self)
        by_number[0] = got is not None
        return got

    def spy(self: _AfterPreemptor, same: Mapping[Any, Wait], waiting: dict[int, Wait], *rest: Any) -> None:
        by_number[0] = False
        before = len(waiting)
        skip(self, same, waiting, *rest)
        if by_number[0]:
            answered.append(len(waiting) - before)

    monkeypatch.setattr(_AfterPreemptor, "_numbered_front", front)
    monkeypatch.setattr(_AfterPreemptor, "skip_same", spy)
    want = decide(plain, policy, NOW)
    assert not answered  # no book: no numbers
    for _ in range(2):
        answered.clear()
        got = decide(kept, policy, NOW)
        assert (got.starts, got.preemptions, list(got.waiting.items())) == (
            want.starts,
            want.preemptions,
            list(want.waiting.items()),
        )
        assert [s.job_id for s in got.starts] == [10 + 200]
        assert sum(answered) > len(line) * 9 // 10
