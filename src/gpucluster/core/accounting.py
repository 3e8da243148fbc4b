"""Accounting rules: what a job's GPUs cost per second, budget periods, and when to hold or stop.

Pure (no I/O, no clock: `now` is a parameter), so the rules are tested on hand-computed cases
and could run in the simulator. The head (head/accounting.py) applies them: it accrues every
running attempt's GPU-seconds and cost every few seconds, holds the jobs of teams over budget
and stops jobs that would exceed their `max_cost`.

Money is `price per GPU-hour` of the GPU model x GPUs held x hours; a fraction of a GPU
(`--gpus 0.25`) pays its share. A model without a price costs nothing (the GPU-hours are still
counted), so a cluster that sets no prices accounts time and energy only.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpucluster.core.reasons import WaitFacts
from gpucluster.core.types import Allocation

MONTH = "month"  # a budget period that is a calendar month (UTC)


@dataclass(frozen=True)
class Budget:
    """A team's allowance per period: money, GPU-hours, or both (the first reached counts).

    `period_s` is a length in seconds (periods counted from the Unix epoch, UTC, so a 1d period
    starts at midnight UTC and a 7d one on a Thursday), or None with `period` "month": calendar
    months, UTC. `on_exceed` says what happens to the team's running jobs once it is over:
    `finish` lets them run to their end, `stop` stops them. New jobs are held either way.
    """

    team: str
    period: str = "30d"  # as written, for people
    period_s: float | None = 30 * 86400.0  # None: calendar months
    money: float | None = None
    gpu_hours: float | None = None
    on_exceed: str = "finish"  # finish | stop


@dataclass(frozen=True)
class Accounting:
    """Prices per GPU model and per-team budgets: the head's accounting configuration."""

    prices: Mapping[str, float] = field(default_factory=dict)  # GPU model -> money per GPU-hour
    budgets: Mapping[str, Budget] = field(default_factory=dict)  # team -> budget

    def with_prices(self, defaults: Mapping[str, float]) -> Accounting:
        """These prices over `defaults` (`gpucluster up --price`): the policy file names the live
        prices, since it is reloaded while the head runs."""
        return Accounting({**defaults, **self.prices}, self.budgets)


@dataclass(frozen=True)
class Rate:
    """What an allocation consumes per second of holding it."""

    gpus: float  # GPUs held (a fraction for a share of one)
    cost_per_s: float
    model: str  # the GPU model ("A+B" if the allocation spans models)


def rate(allocation: Allocation, models: Mapping[tuple[str, int], str], prices: Mapping[str, float]) -> Rate:
    """GPUs and money per second of an allocation; `models` maps (node, GPU index) to its model."""
    gpus = 0.0
    cost = 0.0
    seen: list[str] = []
    for s in allocation.slices:
        for i in s.gpu_indices:
            model = models.get((s.node, i), "unknown")
            if model not in seen:
                seen.append(model)
            gpus += s.share
            cost += s.share * prices.get(model, 0.0) / 3600.0
    if not seen and allocation.slices:
        return Rate(0.0, 0.0, "cpu-only")  # no GPU held: no GPU-hours, no GPU price
    return Rate(gpus, cost, "+".join(sorted(seen)) or "unknown")


def share_on(allocation: Allocation, node: str, gpu: int) -> float:
    """The share of GPU `gpu` on `node` the allocation holds (0 if none): what a fractional job
    pays of that GPU's energy."""
    return sum(s.share for s in allocation.slices if s.node == node and gpu in s.gpu_indices)


def period_start(budget: Budget, now: float) -> float:
    """The start of the budget period `now` falls in."""
    if budget.period_s is None:
        t = time.gmtime(now)
        return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)))
    return (now // budget.period_s) * budget.period_s


def period_end(budget: Budget, now: float) -> float:
    """When the period `now` falls in rolls over (and a team held for its budget is released)."""
    if budget.period_s is None:
        t = time.gmtime(now)
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        return float(calendar.timegm((year, month, 1, 0, 0, 0, 0, 0, 0)))
    return period_start(budget, now) + budget.period_s


def overlap(start: float, end: float, since: float | None, until: float | None) -> float:
    """The fraction of [start, end] inside [since, until]: how much of an attempt's accrued
    amounts a window gets (accrual is linear in time, so this is exact for GPU-seconds and cost)."""
    if end <= start:
        inside = (since is None or start >= since) and (until is None or start < until)
        return 1.0 if inside else 0.0
    lo = start if since is None else max(start, since)
    hi = end if until is None else min(end, until)
    return max(0.0, hi - lo) / (end - start)


@dataclass(frozen=True)
class Spend:
    money: float = 0.0
    gpu_hours: float = 0.0


def _over(budget: Budget, spent: Spend) -> tuple[bool, bool]:
    """(over its money budget, over its GPU-hour budget): the one test of `over_budget` (the
    stop's sentence) and `budget_hold` (the held jobs' numbers)."""
    eps = 1e-9  # sums of per-second accruals are not exact in binary: 0.1 may add up to 0.09999999
    over_money = budget.money is not None and spent.money >= budget.money - eps
    over_hours = budget.gpu_hours is not None and spent.gpu_hours >= budget.gpu_hours - eps
    return over_money, over_hours


def over_budget(budget: Budget, spent: Spend) -> str | None:
    """Why the team is over its budget, or None if it is not."""
    over_money, over_hours = _over(budget, spent)
    parts = []
    if over_money:
        parts.append(f"spent {spent.money:.2f} of its {budget.money:g} money budget")
    if over_hours:
        parts.append(f"used {spent.gpu_hours:.2f} of its {budget.gpu_hours:g} GPU-hour budget")
    if not parts:
        return None
    return f"team {budget.team} {' and '.join(parts)} for this {budget.period} period"


def budget_hold(budget: Budget, spent: Spend, now: float) -> WaitFacts | None:
    """A held job's wait as numbers: what its team spent of the budget it is over, and when the
    period rolls over (when it can start at the latest without a bigger budget); None within it."""
    over_money, over_hours = _over(budget, spent)
    if not over_money and not over_hours:
        return None
    return WaitFacts(
        team=budget.team,
        money=spent.money if over_money else None,
        money_limit=budget.money if over_money else None,
        gpu_hours=spent.gpu_hours if over_hours else None,
        gpu_hours_limit=budget.gpu_hours if over_hours else None,
        period=budget.period,
        until=period_end(budget, now),
    )


def would_exceed(max_cost: float | None, cost_so_far: float, cost_per_s: float, grace_s: float) -> bool:
    """Whether a job must be stopped now to stay within `max_cost`: what it has cost plus what
    the stop itself may take (SIGTERM, then up to the grace period before SIGKILL)."""
    if max_cost is None or cost_per_s <= 0:
        return False
    return cost_so_far + cost_per_s * grace_s >= max_cost - 1e-12
