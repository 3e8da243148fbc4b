"""`gpucluster usage` and `gpucluster budgets`: accounting from the head, as a table, JSON or CSV;
and the `--price MODEL=PRICE` reader of `gpucluster up`."""

from __future__ import annotations

import csv
import math
import sys
import time
from typing import Annotated

import typer

from gpucluster.cli.common import JsonOpt, UrlOpt, call, fail, out, print_json
from gpucluster.cli.common import head as _head
from gpucluster.cli.console import Table
from gpucluster.connection import View

GROUPS = ("team", "user", "job", "gpu-model")
CSV_COLUMNS = (
    "key",
    "team",
    "user",
    "job_id",
    "name",
    "gpu_model",
    "gpu_hours",
    "cpu_hours",
    "cost",
    "energy_kwh",
    "utilization",
    "lost_gpu_hours_failures",
    "lost_gpu_hours_preemption",
    "attempts",
    "jobs",
    "session_gpu_hours",
    "session_idle_gpu_hours",
)


def parse_prices(items: list[str]) -> dict[str, float]:
    """`H100-80GB=3.60` items -> {model: price per GPU-hour}; ValueError names the bad one."""
    prices: dict[str, float] = {}
    for item in items:
        model, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not sep or not model.strip() or not math.isfinite(price) or price < 0:
            raise ValueError(f"--price {item!r}: write it as MODEL=PRICE per GPU-hour, e.g. H100-80GB=3.60")
        prices[model.strip()] = price
    return prices


def _num(v: float | None, digits: int = 2) -> str:
    """Fixed decimals, or three significant digits below 1 (a short job's cost is not 0.00)."""
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if v == 0 or abs(v) >= 1 else f"{v:.3g}"


def usage(
    by: Annotated[str, typer.Option("--by", help="group by team, user, job or gpu-model")] = "team",
    since: Annotated[
        str, typer.Option("--since", help="a duration ago (30d, 12h), a date (2025-01-31) or all")
    ] = "30d",
    until: Annotated[str | None, typer.Option("--until", help="as --since [default: now]")] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="print CSV (one row per group, then the total)")] = False,
) -> None:
    """GPU-hours, cost, energy, utilisation (used vs allocated) and work lost to failures and
    preemption, of your teams' jobs (a cluster admin: all)."""
    if by not in GROUPS:
        fail(f"--by {by!r}: choose one of {', '.join(GROUPS)}")
    if as_json and as_csv:
        fail("--json and --csv: choose one")
    params = {"by": by, "since": since, **({"until": until} if until is not None else {})}
    with _head(url) as h:  # the head's JSON as plain dicts, without the SDK's models (issue 19)
        report = call(h.json, "GET", "/v1/usage", params)
    if as_json:
        print_json(report)
        return
    if as_csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for r in [*report.rows, report.total]:
            d = r
            w.writerow(["" if d.get(k) is None else d[k] for k in CSV_COLUMNS])
        return
    start = report.since
    window = "all time" if start is None else f"since {time.strftime('%Y-%m-%d %H:%M', time.localtime(start))}"
    out.print(f"usage by {by}, {window}", markup=False)
    head = {"team": "TEAM", "user": "USER", "job": "JOB", "gpu-model": "GPU MODEL"}[by]
    extra = ["NAME", "TEAM"] if by == "job" else []
    # Sessions' GPU-hours and how many of them idle, when there were sessions (heads from before
    # issue 21 send no such field).
    sessions = bool(report.total.get("session_gpu_hours"))
    table = Table(head, *extra, "GPU-HOURS", "CPU-HOURS", "COST", "ENERGY kWh", "UTIL", "LOST (FAIL)",
                  "LOST (PREEMPT)", "JOBS", *(["SESSIONS (IDLE)"] if sessions else []), box=None)  # fmt: skip
    for r in [*report.rows, report.total]:
        held = [f"{_num(r.session_gpu_hours)} ({_num(r.session_idle_gpu_hours)})"] if sessions else []
        table.add_row(r.key, *_extra(r, by), *_cells(r), *held)
    out.print(table)


def _extra(r: View, by: str) -> list[str]:
    return [r.name or "-", r.team or "-"] if by == "job" else []


def _cells(r: View) -> list[str]:
    return [
        _num(r.gpu_hours),
        _num(r.get("cpu_hours") or 0.0),  # a head from before CPU-hours sends none
        _num(r.cost),
        _num(r.energy_kwh, 3),
        "-" if r.utilization is None else f"{r.utilization:.0f}%",
        _num(r.lost_gpu_hours_failures),
        _num(r.lost_gpu_hours_preemption),
        str(r.jobs),
    ]


def budgets(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Your teams' budgets in their current period: limits, spent, and whether new jobs are held."""
    with _head(url) as h:
        listing = call(h.json, "GET", "/v1/budgets").budgets
    if as_json:
        print_json(listing)
        return
    if not listing:
        out.print("no budgets (set them under budgets: in the policy file)", markup=False)
        return
    table = Table("TEAM", "PERIOD", "ENDS", "MONEY", "GPU-HOURS", "ON EXCEED", "STATE", box=None)
    for b in listing:
        table.add_row(
            b.team,
            b.period,
            time.strftime("%Y-%m-%d %H:%M", time.localtime(b.period_end)),
            f"{b.money_spent:,.2f} of {b.money_limit:,.2f}" if b.money_limit is not None else "-",
            f"{b.gpu_hours_spent:,.2f} of {b.gpu_hours_limit:,.2f}" if b.gpu_hours_limit is not None else "-",
            b.on_exceed,
            f"over: {b.held_jobs} job(s) held" if b.over else "ok",
        )
    out.print(table)
