"""Accounting series of `/metrics`: GPU-hours, cost and energy per team since the data dir began.

Read from the accountant's running totals (kept in memory as it accrues, loaded from the store
when the head starts), so a scrape costs nothing; they lag the truth by at most one accrual step
(5 s). Counters, not decayed: the fair share's decayed usage is a separate series.

  gpucluster_team_gpu_hours_total{team,model}   GPU-hours held, fractions by their share
  gpucluster_team_cost_total{team}              money, at the prices per GPU-hour in force
  gpucluster_team_energy_joules_total{team}     integrated power of the GPUs held, by share
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gpucluster.head.accounting import Accountant


class AccountingCollector(Collector):
    def __init__(self, accountant: Accountant) -> None:
        self.accountant = accountant

    def collect(self) -> Iterable[Metric]:
        hours = CounterMetricFamily(
            "gpucluster_team_gpu_hours", "GPU-hours held by the team's jobs (not decayed)", labels=["team", "model"]
        )
        cost = CounterMetricFamily("gpucluster_team_cost", "Money the team's jobs cost", labels=["team"])
        energy = CounterMetricFamily(
            "gpucluster_team_energy_joules", "Energy of the GPUs the team's jobs held", labels=["team"]
        )
        per_team: dict[str, list[float]] = {}
        for (team, model), (gpu_s, money, joules) in sorted(dict(self.accountant.totals).items()):
            hours.add_metric([team, model], gpu_s / 3600.0)
            t = per_team.setdefault(team, [0.0, 0.0])
            t[0] += money
            t[1] += joules
        for team, (money, joules) in per_team.items():
            cost.add_metric([team], money)
            energy.add_metric([team], joules)
        yield from (hours, cost, energy)
