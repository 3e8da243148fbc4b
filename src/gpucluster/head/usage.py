"""Usage reports: accounting rows of a window grouped by team, user, job or GPU model.

Why apart from the accountant: a report only reads (any thread, any window) and its arithmetic is
the same for the API, the dashboard and the CLI. A row that straddles the window counts for the
part of its accrued interval inside it (GPU-seconds and cost accrue linearly, so this is exact;
energy and utilisation are spread evenly over the interval). Work lost counts in the window
where its attempt ended.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpucluster.core.accounting import overlap
from gpucluster.models import UsageOut, UsageRowOut, UsageSeries, UsageSeriesOut
from gpucluster.store.accounting import UsageRow

GROUPS = ("team", "user", "job", "gpu-model")
MAX_BUCKETS = 1000  # a chart's worth; more is asked by mistake (step 1m over 30 days)


@dataclass
class _Sum:
    gpu_s: float = 0.0
    cpu_s: float = 0.0
    cost: float = 0.0
    energy_j: float = 0.0
    used_s: float = 0.0
    sampled_s: float = 0.0
    lost_fail_s: float = 0.0
    lost_preempt_s: float = 0.0
    attempts: int = 0
    jobs: set[int] = field(default_factory=set)
    session_s: float = 0.0
    session_idle_s: float = 0.0

    def add(self, row: UsageRow, since: float | None, until: float) -> None:
        f = overlap(row.started_at, row.accrued_until, since, until)
        ended_inside = row.final and (since is None or row.accrued_until >= since) and row.accrued_until <= until
        if f <= 0 and not ended_inside:
            return
        self.gpu_s += row.gpu_seconds * f
        self.cpu_s += row.cpu_seconds * f
        self.cost += row.cost * f
        self.energy_j += row.energy_j * f
        self.used_s += row.used_gpu_seconds * f
        self.sampled_s += row.sampled_gpu_seconds * f
        if row.kind == "session":
            self.session_s += row.gpu_seconds * f
            self.session_idle_s += row.idle_gpu_seconds * f
        if ended_inside and row.work_lost_s:
            lost = row.work_lost_s * row.gpus
            if row.outcome == "failed":
                self.lost_fail_s += lost
            elif row.outcome == "preempted":
                self.lost_preempt_s += lost
        self.attempts += 1
        self.jobs.add(row.job_id)

    def out(self, key: str, **labels: object) -> UsageRowOut:
        return UsageRowOut(
            key=key,
            gpu_hours=self.gpu_s / 3600.0,
            cpu_hours=self.cpu_s / 3600.0,
            cost=self.cost,
            energy_kwh=self.energy_j / 3.6e6,
            utilization=100.0 * self.used_s / self.sampled_s if self.sampled_s > 0 else None,
            lost_gpu_hours_failures=self.lost_fail_s / 3600.0,
            lost_gpu_hours_preemption=self.lost_preempt_s / 3600.0,
            attempts=self.attempts,
            jobs=len(self.jobs),
            session_gpu_hours=self.session_s / 3600.0,
            session_idle_gpu_hours=self.session_idle_s / 3600.0,
            **labels,  # type: ignore[arg-type]
        )


def _key(row: UsageRow, by: str) -> str:
    if by == "team":
        return row.team
    if by == "user":
        return row.owner or "-"
    if by == "job":
        return str(row.job_id)
    return row.gpu_model


def report(
    rows: Iterable[UsageRow], by: str, since: float | None, until: float, names: dict[int, str] | None = None
) -> UsageOut:
    """Rows grouped by `by` (one of GROUPS), largest cost first (then GPU-hours, then key)."""
    if by not in GROUPS:
        raise ValueError(f"by must be one of {', '.join(GROUPS)}")
    groups: dict[str, _Sum] = {}
    first: dict[str, UsageRow] = {}
    total = _Sum()
    for row in rows:
        k = _key(row, by)
        groups.setdefault(k, _Sum()).add(row, since, until)
        first.setdefault(k, row)
        total.add(row, since, until)
    out = []
    for k, g in groups.items():
        if not g.attempts:
            continue
        r = first[k]
        labels: dict[str, object] = {}
        if by == "team":
            labels = {"team": k}
        elif by == "user":
            labels = {"user": r.owner}
        elif by == "job":
            labels = {"job_id": r.job_id, "team": r.team, "user": r.owner, "name": (names or {}).get(r.job_id)}
            labels["gpu_model"] = r.gpu_model
        else:
            labels = {"gpu_model": k}
        out.append(g.out(k, **labels))
    out.sort(key=lambda x: (-x.cost, -x.gpu_hours, x.key))
    return UsageOut(by=by, since=since, until=until, rows=out, total=total.out("total"))


def series(rows: Iterable[UsageRow], by: str, since: float, until: float, step: float) -> UsageSeries:
    """GPU-hours, cost and energy per group (one of GROUPS) and time bucket: for the dashboard's
    charts of usage over time. Buckets are `step` long and aligned on the Unix epoch, so days are
    UTC days whatever `since` is; the first starts at `since` and the last ends at `until`. Each
    attempt counts in a bucket for the part of its accrued interval inside it, as in `report`, so
    a group's buckets add up to its row of `report` over the same window. ValueError says why a
    request cannot be answered."""
    if by not in GROUPS:
        raise ValueError(f"by must be one of {', '.join(GROUPS)}")
    if step <= 0:
        raise ValueError("step must be positive")
    first = math.floor(since / step)
    n = max(1, math.ceil(until / step) - first)
    if n > MAX_BUCKETS:
        raise ValueError(
            f"{n} buckets of {step:g} s between since and until; at most {MAX_BUCKETS}: take a longer step"
        )
    edges = [max(since, (first + i) * step) for i in range(n)] + [until]
    sums: dict[str, list[list[float]]] = {}  # key -> [gpu_s, cost, energy_j] per bucket
    for row in rows:
        lo = max(0, math.floor(row.started_at / step) - first)
        hi = min(n - 1, math.floor(row.accrued_until / step) - first)
        for i in range(lo, hi + 1):
            f = overlap(row.started_at, row.accrued_until, edges[i], edges[i + 1])
            if f <= 0:
                continue
            acc = sums.setdefault(_key(row, by), [[0.0] * n, [0.0] * n, [0.0] * n])
            acc[0][i] += row.gpu_seconds * f
            acc[1][i] += row.cost * f
            acc[2][i] += row.energy_j * f
    out = [
        UsageSeriesOut(
            key=k,
            gpu_hours=[v / 3600.0 for v in gpu_s],
            cost=cost,
            energy_kwh=[v / 3.6e6 for v in energy],
        )
        for k, (gpu_s, cost, energy) in sums.items()
    ]
    out.sort(key=lambda x: (-sum(x.cost), -sum(x.gpu_hours), x.key))
    return UsageSeries(by=by, since=since, until=until, step=step, buckets=edges[:-1], series=out)
