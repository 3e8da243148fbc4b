"""One GPU model's victim pool: its preemptible running jobs in cost order, with the columns an
asker's candidates are read from at C speed.

The scheduler decides which running jobs are in a pool (`_Cycle._victim_pool`) and which of them
an asker may take (`_Cycle._candidates_for`); this module holds the ranking and the reading.
The cost order (`preempt.CostKey`) is class first, so the jobs of the classes below an asker
are one prefix of the pool, its own class the next segment and the classes above it the rest
(`ModelPool.bounds`). Within a segment the candidates are every job, or those of some teams (a
reclaiming asker takes from the teams that borrow the model), or those that checkpointed (the
serving class's rule): a slice, or a `compress` over a column, with no Python step per job.

Why: at 10,000 nodes a cold cycle (no running jobs kept by class) ranks all 60,000 running jobs
once for an asker that reclaims its quota, and each asker then walked the whole pool per job
(~15,000 jobs a model) in a Python loop, then again to keep what guaranteed quotas protect.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from operator import le, not_, or_
from typing import TypeVar

from gpucluster.core.types import Allocation, Gpu, RunningJob

_INF = float("inf")
_T = TypeVar("_T")


def gpus_held(allocation: Allocation, model: str, gpus: Mapping[tuple[str, int], Gpu]) -> float:
    """The GPUs of `model` an allocation holds, shares counted: what a team's quota of it counts
    (`preempt.Guarantees.holds`)."""
    return sum(
        len(s.gpu_indices) * s.share for s in allocation.slices if gpus[(s.node, s.gpu_indices[0])].model == model
    )


@dataclass(frozen=True)
class ModelPool:
    """The pool of one GPU model, in cost order, and per job (same positions) its class, team
    and the GPUs of the model it holds (`gpus_held`). Its id and whether it checkpointed are
    kept in the order the jobs came in (`order`: position -> index there), read only for the
    positions asked. Why: a column reordered is a pass over the pool, worth it only for what
    every asker reads. `team_set`: at least every team with a job in the pool. `holds` is
    empty when the policy has no quotas: only the guarantees' filter reads it."""

    jobs: list[RunningJob]
    classes: list[int]
    teams: list[str]
    holds: list[float]
    # Equal pools may have come in orders of their own (the running jobs by class, or a pass).
    order: list[int] = field(compare=False)
    ids: list[int] = field(compare=False)
    checkpointed: list[bool] = field(compare=False)
    team_set: frozenset[str] = field(compare=False)

    def bounds(self, priority: int) -> tuple[int, int]:
        """Where the jobs of class `priority` start and end: below it the lower classes."""
        return bisect_left(self.classes, priority), bisect_right(self.classes, priority)

    def pick(
        self, start: int, stop: int, if_checkpointed: bool, if_not: bool, teams: AbstractSet[str]
    ) -> Iterator[int]:
        """Positions in [start, stop), in order, of the jobs taken by checkpoint (`if_checkpointed`
        for one that checkpointed, `if_not` for one that did not) or of one of `teams`."""
        span = range(start, stop)
        if if_checkpointed and if_not:
            return iter(span)
        flags: Iterable[bool] | None = None
        if if_checkpointed or if_not:
            done = self.checkpointed_in(start, stop)
            flags = done if if_checkpointed else map(not_, done)
        if not teams:
            return compress(span, flags) if flags is not None else iter(())
        theirs = map(teams.__contains__, islice(self.teams, start, stop))
        return compress(span, theirs if flags is None else map(or_, flags, theirs))

    def checkpointed_in(self, start: int, stop: int) -> Iterator[bool]:
        """Whether each job in positions [start, stop) checkpointed, in order."""
        return map(self.checkpointed.__getitem__, islice(self.order, start, stop))

    def without(self, picked: list[int], gone: AbstractSet[int]) -> list[int]:
        """`picked` less the positions of the jobs whose ids are in `gone`."""
        if not gone:
            return picked
        ids = map(self.ids.__getitem__, map(self.order.__getitem__, picked))
        return list(compress(picked, map(not_, map(gone.__contains__, ids))))

    def within_room(self, picked: list[int], limit: Mapping[str, float]) -> list[int]:
        """`picked` less the jobs holding more GPUs of the model than `limit` gives their team
        (a team not in it: no limit)."""
        held = map(self.holds.__getitem__, picked)
        bound = map(limit.get, map(self.teams.__getitem__, picked), repeat(_INF))
        return list(compress(picked, map(le, held, bound)))


_Add = Callable[[_T], None]
Adders = tuple[_Add[RunningJob], _Add[int], _Add[str], _Add[float], _Add[float], _Add[int], _Add[bool], _Add[float]]


@dataclass
class Columns:
    """One model's pool as the scheduler's pass over the running jobs fills it, in the order
    they come: per job its cost key's parts (class, work lost, -start; the team's share is
    looked up per team in `rank_pool`, the id is the last key) and what an asker reads."""

    jobs: list[RunningJob] = field(default_factory=list)
    classes: list[int] = field(default_factory=list)  # `Priority`s, made plain ints for the sort
    teams: list[str] = field(default_factory=list)
    lost: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # -start
    ids: list[int] = field(default_factory=list)
    checkpointed: list[bool] = field(default_factory=list)
    holds: list[float] = field(default_factory=list)  # `gpus_held`

    def adders(self) -> Adders:
        """The columns' `append`s, in the order of the fields."""
        return (
            self.jobs.append,
            self.classes.append,
            self.teams.append,
            self.lost.append,
            self.starts.append,
            self.ids.append,
            self.checkpointed.append,
            self.holds.append,
        )


def rank_pool(c: Columns, over: Mapping[str, float], teams: frozenset[str]) -> ModelPool:
    """The pool of one model's jobs in cost order (`preempt.CostKey`: class, -over share with
    `over` per team, work lost, -start, id). One stable sort per part, least significant first,
    each on plain numbers: the order a sort by the cost tuples gives, at a third of the time
    (tuple comparisons were half of it). `teams`: at least those of the jobs."""
    classes = list(map(int, c.classes))
    shares = list(map(over.__getitem__, c.teams))
    order = list(range(len(c.jobs)))
    for key in (c.ids, c.starts, c.lost, shares, classes):
        order.sort(key=key.__getitem__)
    return ModelPool(
        list(map(c.jobs.__getitem__, order)),
        list(map(classes.__getitem__, order)),
        list(map(c.teams.__getitem__, order)),
        list(map(c.holds.__getitem__, order)) if c.holds else [],
        order,
        c.ids,
        c.checkpointed,
        teams,
    )
