"""Routes of accounting: usage in a window grouped by team, user, job or GPU model; budgets.

Their own module so the rest of the API stays as it was; `create_app` adds them with one call.
Any signed-in user may call them and gets only their teams' rows (a cluster admin: all).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, FastAPI, Query

from gpucluster.auth.rules import Caller, Rule, allow
from gpucluster.durations import parse_duration, parse_since
from gpucluster.head.service import ClusterService, Rejected
from gpucluster.head.usage import report, series
from gpucluster.models import BudgetList, BudgetOut, UsageOut, UsageSeries

Group = Literal["team", "user", "job", "gpu-model"]


def add_accounting_routes(app: FastAPI, service: ClusterService) -> None:
    router = APIRouter()

    @router.get("/v1/usage", openapi_extra=allow(Rule.SIGNED_IN))
    def usage(
        who: Caller,
        by: Annotated[Group, Query(description="group by team, user, job or gpu-model")] = "team",
        since: Annotated[
            str, Query(max_length=32, description="a duration ago (30d, 12h), a date (2025-01-31, UTC), or all")
        ] = "30d",
        until: Annotated[str | None, Query(max_length=32, description="as since [default: now]")] = None,
    ) -> UsageOut:
        """GPU-hours, cost, energy, utilisation (used vs allocated) and work lost to failures and
        preemption, of your teams' jobs (a cluster admin: all), accrued up to a few seconds ago."""
        now = service.head.clock()
        try:
            start = parse_since(since, now)
        except ValueError as e:
            raise Rejected("since", str(e)) from None
        try:
            end = parse_since(until, now) if until is not None else now
        except ValueError as e:
            raise Rejected("until", str(e)) from None
        end = now if end is None else end
        if start is not None and end < start:
            raise Rejected("until", "must not be before since")
        usage = service.head.accounting.usage
        rows = usage.window(start, end, teams=who.visible_teams())
        names = usage.job_names(r.job_id for r in rows) if by == "job" else None
        return report(rows, by, start, end, names)

    @router.get("/v1/usage/series", openapi_extra=allow(Rule.SIGNED_IN))
    def usage_series(
        who: Caller,
        by: Annotated[Group, Query(description="group by team, user, job or gpu-model")] = "team",
        since: Annotated[
            str, Query(max_length=32, description="a duration ago (30d, 12h) or a date (2025-01-31, UTC)")
        ] = "30d",
        until: Annotated[str | None, Query(max_length=32, description="as since [default: now]")] = None,
        step: Annotated[str, Query(max_length=32, description="bucket length (1d, 6h, 1h), aligned on UTC")] = "1d",
    ) -> UsageSeries:
        """GPU-hours, cost and energy per group and time bucket, of your teams' jobs (a cluster
        admin: all): the dashboard's usage-over-time charts."""
        now = service.head.clock()
        try:
            start = parse_since(since, now)
        except ValueError as e:
            raise Rejected("since", str(e)) from None
        if start is None:
            raise Rejected("since", "a series needs a start: give a duration (30d) or a date (2025-01-31)")
        try:
            end = parse_since(until, now) if until is not None else now
        except ValueError as e:
            raise Rejected("until", str(e)) from None
        try:
            length = parse_duration(step)
        except ValueError:
            raise Rejected("step", f"cannot read {step!r}; give a duration (1d, 6h, 1h)") from None
        end = now if end is None else end
        if end <= start:
            raise Rejected("until", "must be after since")
        if length < 60:
            raise Rejected("step", "must be at least 1m")
        rows = service.head.accounting.usage.window(start, end, teams=who.visible_teams())
        try:
            return series(rows, by, start, end, length)
        except ValueError as e:
            raise Rejected("step", str(e)) from None

    @router.get("/v1/budgets", openapi_extra=allow(Rule.SIGNED_IN))
    def budgets(who: Caller) -> BudgetList:
        """Each budget of your teams (a cluster admin: all) in its current period: limits, what was
        spent, and whether the team's new jobs are held."""
        rows = service.head.accounting.budget_report(service.head.clock(), teams=who.visible_teams())
        return BudgetList(budgets=[BudgetOut.model_validate(r) for r in rows])

    app.include_router(router)
