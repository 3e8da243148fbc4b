"""`TeamQueues` enters a level (ranks its team lines, heaps its teams) only when the walk
reaches it, not when it is built; the order it hands out must be the one an eager build gave,
whatever started, and was charged out of turn, before the walk got there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucluster.core.policy import Policy
from gpucluster.core.queueing import RankedLines, TeamQueues
from gpucluster.core.types import Priority

from .builders import job

NOW = 100.0
POLICY = replace(Policy(), starvation_age_s=60.0)  # a job submitted before t=40 is aged
TEAMS = "abc"


class _Eager(TeamQueues):
    """The build before levels were entered lazily: the first level entered in `__init__`."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._next_level()


_JOB = st.tuples(
    st.sampled_from(TEAMS),
    st.sampled_from([Priority.LOW, Priority.NORMAL, Priority.HIGH]),
    st.integers(0, 99),  # submitted at (below 40: aged)
    st.sampled_from([1.0, 2.0, 8.0]),
    st.sampled_from([None, 0.0, 1.0, 2.0]),  # rank (None: not named)
)
# Per step: start the job popped?, and a job of this team charged out of turn first (None: none).
_STEP = st.tuples(st.booleans(), st.sampled_from([None, *TEAMS]))


def _walk(queues: TeamQueues, steps: list[tuple[bool, str | None]]) -> list[int | None]:
    out: list[int | None] = []
    for i, (started, late) in enumerate(steps):
        if late is not None:
            queues.charge(job(1000 + i).team(late).gpus(4.0).build())
        popped = queues.pop()
        out.append(None if popped is None else popped.job_id)
        if popped is None:
            break
        queues.done(popped, started)
    return out


@settings(max_examples=400, deadline=None)
@given(
    jobs=st.lists(_JOB, max_size=14),
    usage=st.tuples(*(st.sampled_from([0.0, 3600.0, 7200.0, 30000.0]) for _ in TEAMS)),
    steps=st.lists(_STEP, max_size=18),
    fair=st.booleans(),
    kept=st.booleans(),
)
def test_levels_entered_lazily_hand_out_the_eager_order(
    jobs: list[tuple[str, Priority, int, float, float | None]],
    usage: tuple[float, ...],
    steps: list[tuple[bool, str | None]],
    fair: bool,
    kept: bool,
) -> None:
    """Aged jobs that start charge their team before any level is entered; an eager build had
    the first level's entries made with the ratios of before (and renewed only on `charge`),
    so a lazy build that made them with the ratios of when it got there orders otherwise.
    `kept`: the lines through a `RankedLines` (how a line is ranked is test_rank_book.py's)."""
    policy = replace(POLICY, fair_share=fair)
    queued = [
        job(i).team(t).priority(p).at(float(at)).gpus(g).build() for i, (t, p, at, g, _) in enumerate(jobs, start=1)
    ]
    ranks: Mapping[int, float] = {i: r for i, (*_, r) in enumerate(jobs, start=1) if r is not None}
    shares = dict(zip(TEAMS, usage, strict=True))

    def build(kind: type[TeamQueues]) -> TeamQueues:
        lines = RankedLines() if kept else None
        return kind(queued, policy, shares, NOW, ranks=ranks or None, lines=lines)

    assert _walk(build(TeamQueues), steps) == _walk(build(_Eager), steps)


def test_a_team_charged_for_an_aged_start_keeps_its_first_level_place() -> None:
    """Team a (usage 0) is ahead of b (1 GPU-hour) in the first level. Its aged job starts
    (charged 8 GPU-hours: now far over b) before the walk reaches that level; the eager build
    had made a's entry before, so a's normal job still comes first there. A `charge` (a job
    started out of turn) renews the entry: then b comes first."""
    aged = job(1).team("a").at(0.0).gpus(8.0).build()
    a2, b3 = job(2).team("a").at(50.0).build(), job(3).team("b").at(60.0).build()
    usage = {"a": 0.0, "b": 3600.0}
    for out_of_turn, first in ((False, a2), (True, b3)):
        queues = TeamQueues([aged, a2, b3], POLICY, usage, NOW)
        assert queues.pop() is aged
        queues.done(aged, True)
        if out_of_turn:
            queues.charge(job(9).team("a").build())
        assert queues.pop() is first
