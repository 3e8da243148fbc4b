"""The queue index's team lines split by guarantee (`queueing.sort_in`'s levels), kept across
cycles by the index's caller (`QueueIndex.split`).

Why: with quotas every cycle splits every line of the index by whether each job is within its
team's guaranteed quota, and that read each job's demand and looked it up (a 12-field tuple
hashed and compared, the job, its demand and the fields read from memory: ~0.7 us a job, ~8%
of a kept `las-gittins` cycle at 100,000 queued). Yet between two cycles a line keeps most of
its jobs (the very objects), and whether a job is guaranteed depends on its demand alone.

So each line keeps its jobs' distinct demands (with a job asking each) and, per job, which of
them it asks (a slot). Each cycle asks `guaranteed` once per distinct demand, as the split
always did; a job of the line before keeps its slot, matched by identity (`id`, which reads no
job: the kept line holds its jobs, so no address is reused meanwhile), and only new jobs are
read. A line that is the very list of before, whose demands are answered as before, is split
as before: the same lists, handed out again.

Exact: each job goes to the side `guaranteed` gives for its demand now, in line order, as a
fresh split puts it (which asks the first job of each demand: `guaranteed` reads a job's team
and shape alone, `scheduler._Cycle._guaranteed`, so any job of that demand answers alike).
tests/unit/test_split_kept.py checks it against a fresh split (tests/unit/guaranteed_split.py)
over random histories.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import attrgetter, not_

from gpucluster.core.queueing import GUARANTEED_LEVEL, Presorted, Sorted
from gpucluster.core.types import JobRequest

_DEMAND = attrgetter("demand")
Demand = tuple[object, ...]


@dataclass
class _Line:
    """One line as split last: the line, its distinct demands (a slot each) with a job asking
    each, each job's slot, the answers per slot, and the two sides."""

    line: list[JobRequest]
    slot_of: dict[Demand, int]
    askers: list[JobRequest]
    slots: list[int]
    answers: list[bool]
    ours: list[JobRequest]
    rest: list[JobRequest]


class KeptSplit:
    """The split by guarantee, kept across cycles (see the module). Not thread-safe."""

    def __init__(self) -> None:
        self._lines: dict[tuple[int, str], _Line] = {}

    def split(self, presorted: Presorted, guaranteed: Callable[[JobRequest], bool]) -> Sorted:
        """`presorted` split by `guaranteed` (`sort_in`'s levels), its lists those of the last call where a
        line and its answers are the same."""
        held, aged, levels = presorted
        out: dict[int, dict[str, list[JobRequest]]] = {}
        memo: dict[Demand, bool] = {}  # this call's answers, by demand

        def ask(demand: Demand, job: JobRequest) -> bool:
            hit = memo.get(demand)
            if hit is None:
                hit = memo[demand] = guaranteed(job)
            return hit

        kept: dict[tuple[int, str], _Line] = {}
        for level in list(levels):
            for team, line in levels[level].items():
                got = kept[(level, team)] = _split(line, self._lines.get((level, team)), ask)
                if got.ours:
                    out.setdefault(level + GUARANTEED_LEVEL, {})[team] = got.ours
                if got.rest:
                    out.setdefault(level, {})[team] = got.rest
        self._lines = kept
        return held, aged, out


def _split(line: list[JobRequest], was: _Line | None, ask: Callable[[Demand, JobRequest], bool]) -> _Line:
    """`line` split by the answers of now, from `was` (the same line's last split) where it can."""
    if was is not None and was.line is line:
        answers = list(map(ask, was.slot_of, was.askers))
        if answers == was.answers:
            return was
        slot_of, askers, slots = was.slot_of, was.askers, was.slots
    else:
        slot_of, askers, slots = _slots(line, was)
        answers = list(map(ask, slot_of, askers))
    mask = list(map(answers.__getitem__, slots))
    ours = list(compress(line, mask))
    if not ours:
        rest = line
    elif len(ours) == len(line):
        rest = []
    else:
        rest = list(compress(line, map(not_, mask)))
    return _Line(line, slot_of, askers, slots, answers, ours, rest)


def _slots(line: list[JobRequest], was: _Line | None) -> tuple[dict[Demand, int], list[JobRequest], list[int]]:
    """The distinct demands of `line` (slot -> a job asking it) and each job's slot: a job of
    `was` (the same object) keeps its slot, a new one is read. Slots of demands no job asks any
    more are dropped when they outnumber the rest (a line asked afresh)."""
    if was is not None and len(was.slot_of) <= 2 * len(line) + 8:
        where = dict(zip(map(id, was.line), was.slots, strict=True))
        slots = list(map(where.get, map(id, line), repeat(-1)))
        new = list(compress(count(), map((-1).__eq__, slots)))
        if len(new) * 4 < len(line):  # most jobs kept: their slots, and the few new ones read
            slot_of, askers = dict(was.slot_of), list(was.askers)
            for i in new:
                job = line[i]
                slot = slot_of.get(job.demand)
                if slot is None:
                    slot = slot_of[job.demand] = len(askers)
                    askers.append(job)
                slots[i] = slot
            return slot_of, askers, slots
    demands = list(map(_DEMAND, line))
    first = dict(zip(reversed(demands), reversed(line), strict=True))  # a job asking each: the first in line
    slot_of = dict(zip(first, count()))
    return slot_of, list(first.values()), list(map(slot_of.__getitem__, demands))
