"""From a finished run to the numbers a planning team reads (all of metrics.json).

Definitions (also in README.md):
- JCT (job completion time) = end - submission, over jobs that ended; queueing delay = first
  start - submission, over jobs that started. Percentiles are nearest-rank on the sorted values.
- Utilisation = busy GPU-seconds / live GPU-seconds (nodes down for repair excluded) from the
  first submission to the last end; `of_installed` divides by every installed GPU instead.
- Fairness: at the end of every plot bin where demand exceeds the live GPUs, Jain's index of
  x_t = team t's GPUs / its weighted max-min fair share of the live GPUs (capped by its demand);
  reported as the mean over those contended samples (1 = perfectly fair; 1/n = one team has all).
- GPU-hours: allocated = held by jobs; lost to failures = work since the last checkpoint plus
  restart time after a failure; lost to preemption = the checkpoint written on preemption plus
  restart time after it; checkpoint = periodic checkpoint writes; useful = the rest.
- Cost: allocated GPU-hours x their group's price, per team; idle = the unallocated GPU-hours of
  the makespan at the same prices. Energy: busy power x allocated hours per team, idle power x
  idle hours for the rest.
Everything is rounded so the same seed gives byte-identical output.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from gpucluster.sim.engine import (
    CANCELLED_DEPENDENCY,
    CKPT,
    COST,
    ENERGY,
    FAILED_BUDGET,
    FAILED_RESTARTS,
    FAILED_TIME_LIMIT,
    LOST_FAIL,
    LOST_PREEMPT,
    NEVER_STARTED,
    SUCCEEDED,
    USED,
    RunResult,
)
from gpucluster.sim.spec import ClusterSpec
from gpucluster.sim.workload import Trace

H = 3600.0


def r(x: float, digits: int = 3) -> float:
    """Round for stable, readable JSON (and -0.0 -> 0.0)."""
    if math.isnan(x) or math.isinf(x):
        return x
    return round(x, digits) + 0.0


def stats(values: list[float]) -> dict[str, float | int]:
    """count, mean, median, p90, p99, max; nearest-rank percentiles."""
    if not values:
        return {"count": 0}
    v = sorted(values)
    n = len(v)

    def pct(p: float) -> float:
        return v[max(0, math.ceil(p / 100.0 * n) - 1)]

    return {
        "count": n,
        "mean": r(math.fsum(v) / n),
        "median": r(pct(50)),
        "p90": r(pct(90)),
        "p99": r(pct(99)),
        "max": r(v[-1]),
    }


def run_metrics(res: RunResult, spec: ClusterSpec) -> dict[str, Any]:
    """Every number of one policy's run."""
    # Jobs cancelled by a dependency never ran: no completion time.
    # CPU-only jobs (0 GPUs) are left out of the GPU jobs' times and counted in their own
    # bucket (`cpu_only`): their waits are for CPUs, and mixed in they would dilute the GPU figures.
    gpus = res.gpus
    ended = [i for i, e in enumerate(res.end) if e >= 0 and res.outcome[i] != CANCELLED_DEPENDENCY and gpus[i]]
    jct = [res.end[i] - res.submit[i] for i in ended]
    started = [i for i, s in enumerate(res.first_start) if s >= 0 and gpus[i]]
    delay = [res.first_start[i] - res.submit[i] for i in started]
    makespan = max(0.0, res.last_end - res.first_submit)
    totals = res.team_totals
    used = math.fsum(t[USED] for t in totals)
    ckpt = math.fsum(t[CKPT] for t in totals)
    lost_f = math.fsum(t[LOST_FAIL] for t in totals)
    lost_p = math.fsum(t[LOST_PREEMPT] for t in totals)
    installed = spec.total_gpus * makespan
    idle_cost = 0.0
    idle_kwh = 0.0
    for g in spec.groups:
        idle_s = max(0.0, g.gpus * makespan - res.group_busy_gpu_s.get(g.name, 0.0))
        idle_cost += idle_s * g.price_per_gpu_hour / H
        idle_kwh += idle_s * g.power_idle_w / 3.6e6
    attributed = math.fsum(t[COST] for t in totals)
    busy_kwh = math.fsum(t[ENERGY] for t in totals)
    contended = [j for j in res.series.jain if not math.isnan(j)]
    spares = spare_metrics(res, spec, makespan)
    outcomes = array("i", [0] * 6)
    for o in res.outcome:
        outcomes[o] += 1
    return {
        "policy": res.policy.name,
        "policy_source": res.policy.source,
        "jobs": {
            "simulated": len(res.outcome),
            "succeeded": outcomes[SUCCEEDED],
            "failed_time_limit": outcomes[FAILED_TIME_LIMIT],
            "failed_too_many_restarts": outcomes[FAILED_RESTARTS],
            "never_started": outcomes[NEVER_STARTED],
            "failed_budget_stop": outcomes[FAILED_BUDGET],
            "cancelled_by_dependency": outcomes[CANCELLED_DEPENDENCY],
            "skipped": sum(res.skipped.values()),
            "skipped_reasons": dict(sorted(res.skipped.items())),
            "skipped_gpu_hours": r(res.skipped_gpu_s / H),
        },
        "jct_s": stats(jct),
        "queueing_delay_s": stats(delay),
        "cpu_only": cpu_only_metrics(res),
        "makespan_s": r(makespan),
        "utilisation": {
            "mean": r(res.busy_gpu_s / res.up_gpu_s if res.up_gpu_s else 0.0, 4),
            "of_installed": r(res.busy_gpu_s / installed if installed else 0.0, 4),
        },
        "fairness": {
            "jain_mean_contended": r(math.fsum(contended) / len(contended), 4) if contended else None,
            "jain_min_contended": r(min(contended), 4) if contended else None,
            "contended_fraction": r(len(contended) / len(res.series.jain), 4) if res.series.jain else 0.0,
        },
        "gpu_hours": {
            "installed": r(installed / H),
            "allocated": r(used / H),
            "useful": r((used - ckpt - lost_f - lost_p) / H),
            "checkpoint_writes": r(ckpt / H),
            "lost_to_failures": r(lost_f / H),
            "lost_to_preemption": r(lost_p / H),
            "idle": r(max(0.0, installed - used) / H),
        },
        "failures": {
            "node_failures": res.node_failures,
            "jobs_interrupted": res.interruptions,
            "restarts": res.restarts,
        },
        "preemptions": res.preemptions,
        "spares": spares,
        "cost": {
            "attributed": r(attributed, 2),
            "idle": r(idle_cost, 2),
            "spares": spares["cost"],
            "total": r(attributed + idle_cost + spares["cost"], 2),
            **cost_per_useful(attributed + idle_cost + spares["cost"], used - ckpt - lost_f - lost_p, spec.currency),
        },
        "energy_kwh": {
            "busy": r(busy_kwh, 2),
            "idle": r(idle_kwh, 2),
            "spares": spares["energy_kwh"],
            "total": r(busy_kwh + idle_kwh + spares["energy_kwh"], 2),
        },
        "time_not_running_s": waiting_metrics(res)["all"],
        "started_within_1h": started_within(res, H),
        "waits_by_size": waits_by_size(res),
        "goodput": goodput_metrics(res, used),
        "per_team": _per_team(res, jct, delay, ended, started, used),
        # teams with a budget (the policy file's `budgets:`): spent over the run, time and times held
        "budgets": {
            team: {
                "spent_money": r(b["spent_money"], 2),
                "spent_gpu_hours": r(b["spent_gpu_hours"], 2),
                "held_hours": r(b["held_s"] / H, 2),
                "holds": int(b["holds"]),
                "stopped_jobs": int(b["stopped_jobs"]),
            }
            for team, b in sorted(res.budgets.items())
        },
        # the spec's drain windows: GPU-hours of drained (live) nodes, of those the ones no job
        # held (lost to the drains: running jobs finishing there still used the rest), and jobs
        # requeued by a `running: requeue` window
        "drains": {
            "windows": len(spec.drains),
            "drained_gpu_hours": r(res.drained_gpu_s / H, 2),
            "lost_gpu_hours": r(res.drain_idle_gpu_s / H, 2),
            "requeued_jobs": res.drain_requeues,
        }
        if spec.drains
        else {},
        "series": {
            "bin_s": res.series.bin_s,
            # busy / live GPU-seconds per bin; null while every node is down
            "utilisation": [
                r(b / u, 4) if u > 0 else None for b, u in zip(res.series.busy_gpu_s, res.series.up_gpu_s, strict=True)
            ],
            "live_fraction": [r(u / (spec.total_gpus * res.series.bin_s), 4) for u in res.series.up_gpu_s],
            "queued_jobs": list(res.series.queued_jobs),
            "running_jobs": list(res.series.running_jobs),
        },
    }


def _per_team(
    res: RunResult, jct: list[float], delay: list[float], ended: list[int], started: list[int], used: float
) -> dict[str, Any]:
    teams = res.teams
    jct_by: list[list[float]] = [[] for _ in teams]
    delay_by: list[list[float]] = [[] for _ in teams]
    count = [0] * len(teams)
    for t in res.team:
        count[t] += 1
    for i, v in zip(ended, jct, strict=True):
        jct_by[res.team[i]].append(v)
    for i, v in zip(started, delay, strict=True):
        delay_by[res.team[i]].append(v)
    # the policy's shares, normalised over the teams that submit work
    total_share = math.fsum(res.policy.entitlement(t) for t in teams) or 1.0
    waiting = waiting_metrics(res)
    out: dict[str, Any] = {}
    for k, team in enumerate(teams):
        tot = res.team_totals[k]
        out[team] = {
            "jobs": count[k],
            "jct_s": stats(jct_by[k]),
            "queueing_delay_s": stats(delay_by[k]),
            "gpu_hours": r(tot[USED] / H),
            "share_of_gpu_hours": r(tot[USED] / used if used else 0.0, 4),
            "entitlement": r(res.policy.entitlement(team) / total_share, 4),
            "time_not_running_s": waiting["teams"].get(k, {"count": 0}),
            "lost_gpu_hours": r((tot[LOST_FAIL] + tot[LOST_PREEMPT]) / H),
            "cost": r(tot[COST], 2),
            "energy_kwh": r(tot[ENERGY], 2),
        }
    return out


def cpu_only_metrics(res: RunResult) -> dict[str, Any]:
    """The CPU-only bucket: how many jobs asked for no GPU, how many started and finished, and
    their queueing delay, completion time and time not running (none of it in the GPU figures)."""
    mine = [i for i, g in enumerate(res.gpus) if not g]
    finished = [i for i in mine if res.end[i] >= 0 and res.outcome[i] != CANCELLED_DEPENDENCY]
    started = [i for i in mine if res.first_start[i] >= 0]
    return {
        "jobs": len(mine),
        "started": len(started),
        "succeeded": sum(1 for i in mine if res.outcome[i] == SUCCEEDED),
        "never_started": sum(1 for i in mine if res.outcome[i] == NEVER_STARTED),
        "queueing_delay_s": stats([res.first_start[i] - res.submit[i] for i in started]),
        "jct_s": stats([res.end[i] - res.submit[i] for i in finished]),
        "time_not_running_s": stats([max(0.0, res.end[i] - res.submit[i] - res.ran[i]) for i in finished]),
    }


def _finished(res: RunResult) -> list[int]:
    """Jobs that ran to an end (not cancelled by a dependency, not left unfinished)."""
    return [i for i, e in enumerate(res.end) if e >= 0 and res.outcome[i] != CANCELLED_DEPENDENCY]


def waiting_metrics(res: RunResult) -> dict[str, Any]:
    """Time each finished job spent not running: queued before its first start, and queued again
    (or waiting out a backoff) after every preemption and failure, until it ended.

    Why beside the queueing delay: the delay counts only the wait before the first start, so a
    policy that starts low-priority jobs early and preempts them often looks good by it; this
    figure (end - submission - wall time holding GPUs) cannot hide the waits after a preemption."""
    by_team: dict[int, list[float]] = {}
    values: list[float] = []
    for i in _finished(res):
        if not res.gpus[i]:
            continue  # CPU-only: in `cpu_only_metrics`
        v = max(0.0, res.end[i] - res.submit[i] - res.ran[i])
        values.append(v)
        by_team.setdefault(res.team[i], []).append(v)
    return {"all": stats(values), "teams": {k: stats(v) for k, v in by_team.items()}}


def started_within(res: RunResult, limit_s: float) -> float | None:
    """Fraction of the jobs simulated whose first start came within `limit_s` of their
    submission (a job that never started counts as not within)."""
    n = len(res.first_start)
    if not n:
        return None
    ok = sum(1 for f, s in zip(res.first_start, res.submit, strict=True) if f >= 0 and f - s <= limit_s)
    return r(ok / n, 4)


SIZE_BUCKETS = (
    (-math.inf, 0.0, "cpu-only"),  # 0 GPUs: a bucket of its own, so "<=1" holds GPU jobs only
    (0.0, 1.0, "<=1"),
    (1.0, 8.0, "2-8"),
    (8.0, 64.0, "9-64"),
    (64.0, 512.0, "65-512"),
    (512.0, math.inf, ">512"),
)


def waits_by_size(res: RunResult) -> dict[str, Any]:
    """Queueing delay (to first start) and time not running, by GPUs asked: large jobs wait
    differently from small ones, and a mean over all jobs hides it."""
    delay: dict[str, list[float]] = {b[2]: [] for b in SIZE_BUCKETS}
    waiting: dict[str, list[float]] = {b[2]: [] for b in SIZE_BUCKETS}
    finished = set(_finished(res))
    for i, g in enumerate(res.gpus):
        label = next(b[2] for b in SIZE_BUCKETS if b[0] < g <= b[1])
        if res.first_start[i] >= 0:
            delay[label].append(res.first_start[i] - res.submit[i])
        if i in finished:
            waiting[label].append(max(0.0, res.end[i] - res.submit[i] - res.ran[i]))
    return {
        label: {"queueing_delay_s": stats(delay[label]), "time_not_running_s": stats(waiting[label])}
        for label in delay
        if delay[label] or waiting[label]
    }


def goodput_metrics(res: RunResult, allocated_gpu_s: float) -> dict[str, Any]:
    """Useful GPU-time over the GPU-time reserved for the jobs, and over the GPU-time allocated.

    Reserved = the GPUs a job asked for x the wall time from its first start to its end: time
    it spends holding nothing (queued again after a failure, waiting for a repaired node or a
    backoff) counts as lost. Allocated counts only the time it held GPUs, so a job idled for
    days by a failure looks healthy by it: that flattering figure is kept only beside the honest
    one. For a single training job, `of_reserved` is what Llama 3's report calls effective
    training time."""
    useful = math.fsum(res.useful)
    reserved = 0.0
    for i, f in enumerate(res.first_start):
        if f >= 0:
            end = res.end[i] if res.end[i] >= 0 else res.last_end
            reserved += res.gpus[i] * max(0.0, end - f)
    return {
        "useful_gpu_hours": r(useful / H),
        "reserved_gpu_hours": r(reserved / H),
        "of_reserved": r(useful / reserved, 4) if reserved > 0 else None,
        "of_allocated": r(useful / allocated_gpu_s, 4) if allocated_gpu_s > 0 else None,
    }


def spare_metrics(res: RunResult, spec: ClusterSpec, makespan: float) -> dict[str, Any]:
    """The spare pools: how often a spare took a failed node's place, how often none was left,
    and what the spares cost over the makespan (bought: their price per GPU-hour; hot ones
    also draw idle power, cold ones none)."""
    gpus = sum((g.spares.hot + g.spares.cold) * g.gpus_per_node for g in spec.groups)
    cost = math.fsum((g.spares.hot + g.spares.cold) * g.gpus_per_node * g.price_per_gpu_hour for g in spec.groups)
    watts = math.fsum(g.spares.hot * g.gpus_per_node * g.power_idle_w for g in spec.groups)
    return {
        "hot_nodes": sum(g.spares.hot for g in spec.groups),
        "cold_nodes": sum(g.spares.cold for g in spec.groups),
        "gpus": gpus,
        "replaced_by_hot": res.spare_swaps[0],
        "replaced_by_cold": res.spare_swaps[1],
        "failures_without_spare": res.no_spare,
        "node_hours_missing": r(res.node_down_s / H),
        "cost": r(cost * makespan / H, 2),
        "energy_kwh": r(watts * makespan / 3.6e6, 2),
    }


def cost_per_useful(total: float, useful_gpu_s: float, currency: str) -> dict[str, Any]:
    """What one useful GPU-hour cost: everything paid (jobs, idle GPUs, spares) over the useful
    GPU-hours. Why: the total is the same for every policy on one cluster and trace (the
    hardware is paid for either way); what a policy changes is how much useful work it buys."""
    return {
        "currency": currency,
        "per_useful_gpu_hour": r(total / (useful_gpu_s / H), 4) if useful_gpu_s > 0 else None,
    }


def honest_columns(m: dict[str, Any]) -> dict[str, Any]:
    """The comparison table's columns that cannot flatter a policy: waits after preemptions,
    preemptions, restarts, GPU-hours lost, goodput of reserved time."""
    nr = m["time_not_running_s"]
    return {
        "time_not_running_mean_s": nr.get("mean"),
        "time_not_running_p99_s": nr.get("p99"),
        "started_within_1h": m["started_within_1h"],
        "preemptions": m["preemptions"],
        "restarts": m["failures"]["restarts"],
        "goodput": m["goodput"]["of_reserved"],
        "cost_per_useful_gpu_hour": m["cost"]["per_useful_gpu_hour"],
        "currency": m["cost"]["currency"],
        "energy_kwh": m["energy_kwh"]["total"],
    }


def winners(rows: list[dict[str, Any]]) -> dict[str, str | None]:
    """The answer before the table: which policy is best by each figure that cannot flatter
    (highest goodput, least mean time not running, cheapest useful GPU-hour). Ties go to the
    first policy given; None when no policy has the figure."""

    def best(key: str, high: bool) -> str | None:
        have = [
            (row[key] if high else -row[key], -k, row["policy"])
            for k, row in enumerate(rows)
            if row.get(key) is not None
        ]
        return max(have)[2] if have else None

    return {
        "goodput": best("goodput", True),
        "time_not_running_mean": best("time_not_running_mean_s", False),
        "cost_per_useful_gpu_hour": best("cost_per_useful_gpu_hour", False),
    }


def comparison(per_policy: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy; `vs_fifo` = FIFO's mean / this policy's mean (> 1: better than FIFO)."""
    base = next((m for m in per_policy if m["policy"] == "fifo"), per_policy[0] if per_policy else None)
    rows = []
    for m in per_policy:
        jct, qd = m["jct_s"], m["queueing_delay_s"]
        row = {
            "policy": m["policy"],
            "jct_mean_s": jct.get("mean"),
            "jct_median_s": jct.get("median"),
            "jct_p99_s": jct.get("p99"),
            "queueing_delay_mean_s": qd.get("mean"),
            "queueing_delay_p99_s": qd.get("p99"),
            "makespan_s": m["makespan_s"],
            "utilisation": m["utilisation"]["mean"],
            "jain_mean_contended": m["fairness"]["jain_mean_contended"],
            "gpu_hours_lost": r(m["gpu_hours"]["lost_to_failures"] + m["gpu_hours"]["lost_to_preemption"]),
            "cost_total": m["cost"]["total"],
            "baseline": base["policy"] if base else None,
            **honest_columns(m),
        }
        if base is not None:
            bj, bq = base["jct_s"].get("mean"), base["queueing_delay_s"].get("mean")
            row["jct_mean_vs_baseline"] = r(bj / jct["mean"], 3) if bj and jct.get("mean") else None
            row["queueing_delay_mean_vs_baseline"] = r(bq / qd["mean"], 3) if bq and qd.get("mean") else None
        rows.append(row)
    return rows


def inputs_metrics(spec: ClusterSpec, trace: Trace, seed: int) -> dict[str, Any]:
    by_model: dict[str, int] = {}
    for g in spec.groups:
        by_model[g.gpu_model] = by_model.get(g.gpu_model, 0) + g.gpus
    return {
        "seed": seed,
        "cluster": {
            "name": spec.name,
            "spec": spec.source,
            "nodes": sum(g.count for g in spec.groups),
            "gpus": spec.total_gpus,
            "gpus_by_model": dict(sorted(by_model.items())),
            "currency": spec.currency,
            "speeds": dict(sorted(spec.speeds.items())),
            "gpu_failures_per_day": spec.failures.gpu_failures_per_day,
            "node_repair_s": spec.failures.node_repair_s,
            "node_repair": {
                "distribution": spec.failures.repair.distribution,
                "mean_s": r(spec.failures.repair.mean_s),
            },
            "max_restarts": spec.failures.max_restarts,
            "restart_backoff_s": {"first": spec.failures.backoff_first_s, "max": spec.failures.backoff_max_s},
            "spares": {
                g.name: {"hot": g.spares.hot, "cold": g.spares.cold, "cold_delay_s": g.spares.cold_delay_s}
                for g in spec.groups
                if g.spares.hot or g.spares.cold
            },
            "checkpoint_interval": spec.checkpoints.interval,
            "checkpoint_cost_s": r(spec.checkpoints.cost_s),
            "restart_s": r(spec.checkpoints.restart_s),
            "checkpoint_state_size_gb": spec.checkpoints.state_size_gb,
        },
        "trace": {
            "path": trace.path,
            "format": trace.format,
            "rows": trace.rows,
            "jobs_read": len(trace.jobs),
            "malformed_rows": trace.error_count,
            "malformed_examples": [{"line": e.line, "error": e.message} for e in trace.errors[:50]],
            "span_s": r(trace.jobs[-1].submit if trace.jobs else 0.0),
            "gpu_hours_demanded": r(math.fsum(j.duration * j.gpus for j in trace.jobs) / H),
        },
    }
