"""Write a run's report: metrics.json, performance.json, PNG plots and report.html.

metrics.json holds only what the seed determines (byte-identical across runs of the same
inputs); wall times and memory go to performance.json, which report.html also shows.
"""

from __future__ import annotations

import csv
import html
import json
import math
from pathlib import Path
from typing import Any

from gpucluster.sim.engine import RunResult
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.estimate_error import estimate_section

DAY = 86400.0
# by RunResult.outcome (engine.py's SUCCEEDED ... CANCELLED_DEPENDENCY)
OUTCOME = (
    "succeeded",
    "failed_time_limit",
    "failed_too_many_restarts",
    "never_started",
    "failed_budget_stop",
    "cancelled_dependency",
)


def write_report(
    out: Path, metrics: dict[str, Any], performance: dict[str, Any], results: list[RunResult]
) -> list[Path]:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SimInputError(f"--out {out}: cannot create the output directory: {e.strerror or e}") from None
    if not out.is_dir():
        raise SimInputError(f"--out {out}: not a directory")
    files = [
        _write(out / "metrics.json", json.dumps(metrics, indent=1, sort_keys=False, allow_nan=False) + "\n"),
        write_jobs(out / "jobs.csv", results),
    ]
    plots = write_plots(out, metrics, results)
    files += plots
    # Peak memory measured after plotting (matplotlib roughly doubles it on a big run): the
    # figure a planner sizes the machine by must include the report it asked for.
    from gpucluster.sim.run import peak_rss_mib

    performance["peak_rss_mib"] = max(performance.get("peak_rss_mib", 0.0), peak_rss_mib())
    files.insert(1, _write(out / "performance.json", json.dumps(performance, indent=1) + "\n"))
    files.append(
        _write(out / "report.html", render_html(metrics, performance, [p.name for p in plots if p.name != "sweep.png"]))
    )
    return files


def _write(path: Path, text: str) -> Path:
    try:
        path.write_text(text)
    except OSError as e:
        raise SimInputError(f"{path}: cannot write: {e.strerror or e}") from None
    return path


def write_jobs(path: Path, results: list[RunResult]) -> Path:
    """One row per job and policy: when it was submitted, first started and ended, and how; the
    time it spent not running (end - submission - the wall time it held GPUs: queued before its
    first start and again after every preemption and failure), times preempted and times
    restarted after a failure. Times in seconds from the first submission; -1 = never (a job that
    never ended has no time not running: -1)."""
    try:
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "policy",
                    "job_id",
                    "team",
                    "gpus",
                    "submit_s",
                    "first_start_s",
                    "end_s",
                    "time_not_running_s",
                    "preemptions",
                    "restarts",
                    "outcome",
                ]
            )
            for res in results:
                name = res.policy.name
                for jid, team, gpus, sub, start, end, ran, pre, rst, outcome in zip(
                    res.job_id,
                    res.team,
                    res.gpus,
                    res.submit,
                    res.first_start,
                    res.end,
                    res.ran,
                    res.preempted,
                    res.restarted,
                    res.outcome,
                    strict=True,
                ):
                    waited = max(0.0, end - sub - ran) if end >= 0 else -1.0
                    times = (f"{sub:.3f}", f"{start:.3f}", f"{end:.3f}", f"{waited:.3f}")
                    w.writerow([name, jid, res.teams[team], f"{gpus:g}", *times, pre, rst, OUTCOME[outcome]])
    except OSError as e:
        raise SimInputError(f"{path}: cannot write: {e.strerror or e}") from None
    return path


# ---- plots --------------------------------------------------------------------------------


def write_plots(out: Path, metrics: dict[str, Any], results: list[RunResult]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[Path] = []
    policies = metrics["policies"]

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        files.append(path)

    fig, ax = plt.subplots(figsize=(9, 3.6))
    for name, m in policies.items():
        s = m["series"]
        xs = [(i + 0.5) * s["bin_s"] / DAY for i in range(len(s["utilisation"]))]
        ax.plot(xs, [100 * u if u is not None else math.nan for u in s["utilisation"]], label=name, linewidth=1)
    ax.set(xlabel="days since the first submission", ylabel="GPUs busy (% of live)", title="GPU utilisation")
    ax.set_ylim(0, 105)
    ax.legend(loc="lower right")
    save(fig, "utilisation.png")

    fig, ax = plt.subplots(figsize=(9, 3.6))
    for name, m in policies.items():
        s = m["series"]
        xs = [(i + 1) * s["bin_s"] / DAY for i in range(len(s["queued_jobs"]))]
        ax.plot(xs, s["queued_jobs"], label=name, linewidth=1)
    ax.set(xlabel="days since the first submission", ylabel="jobs waiting", title="Queue length")
    ax.legend(loc="upper right")
    save(fig, "queue.png")

    if "sweep" in metrics:
        save(sweep_figure(plt, metrics["sweep"]), "sweep.png")
    for key, title, fname in (
        ("jct", "Job completion time", "jct_cdf.png"),
        ("delay", "Queueing delay", "queueing_delay_cdf.png"),
    ):
        if not results:
            break  # a sweep keeps no per-job arrays; its figures are in sweep.png
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for res in results:
            if key == "jct":
                vals = sorted(e - s for e, s in zip(res.end, res.submit, strict=True) if e >= 0)
            else:
                vals = sorted(f - s for f, s in zip(res.first_start, res.submit, strict=True) if f >= 0)
            if not vals:
                continue
            step = max(1, len(vals) // 2000)
            xs = [max(v, 1.0) / 3600 for v in vals[::step]]
            ys = [(i * step + 1) / len(vals) for i in range(len(xs))]
            ax.plot(xs, ys, label=res.policy.name, linewidth=1.2)
        ax.set_xscale("log")
        ax.set(xlabel="hours (log; below 1 s drawn at 1 s)", ylabel="fraction of jobs", title=f"{title} (CDF)")
        ax.legend(loc="lower right")
        save(fig, fname)

    teams = _top_teams(metrics, 12)
    if teams and len(metrics["policies"]) and len(teams) > 1:
        save(share_figure(plt, metrics, teams), "shares.png")
    if teams:
        fig, ax = plt.subplots(figsize=(9, 3.8))
        width = 0.8 / max(1, len(policies))
        for k, (name, m) in enumerate(policies.items()):
            vals = [m["per_team"].get(t, {}).get("queueing_delay_s", {}).get("mean", 0.0) / 3600 for t in teams]
            ax.bar([i + k * width for i in range(len(teams))], vals, width=width, label=name)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(teams))], teams, rotation=30, ha="right")
        ax.set(ylabel="mean queueing delay (h)", title="Queueing delay per team (largest teams)")
        ax.legend()
        save(fig, "teams.png")
    return files


def share_figure(plt: Any, metrics: dict[str, Any], teams: list[str]) -> Any:
    """Each team's share of the allocated GPU-hours per policy, against its entitlement (the
    policy's weight over the teams that submit work): where a policy is unfair, and to whom."""
    policies = metrics["policies"]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / (len(policies) + 1)
    first = next(iter(policies.values()))
    ent = [100 * first["per_team"].get(t, {}).get("entitlement", 0.0) for t in teams]
    ax.bar(range(len(teams)), ent, width=width, label="entitlement", color="lightgray", edgecolor="gray")
    for k, (name, m) in enumerate(policies.items(), start=1):
        vals = [100 * m["per_team"].get(t, {}).get("share_of_gpu_hours", 0.0) for t in teams]
        ax.bar([i + k * width for i in range(len(teams))], vals, width=width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(teams))], teams, rotation=30, ha="right")
    ax.set(ylabel="% of GPU-hours", title="Share of GPU-hours against entitlement (largest teams)")
    ax.legend(fontsize=8)
    return fig


def sweep_figure(plt: Any, sw: dict[str, Any]) -> Any:
    """Goodput against the first swept key, one line per value of the other keys and policy,
    the bars spanning the seeds' min to max, the optimum circled."""
    rows = sw["rows"]
    first = sw["axes"][0]["key"] if sw["axes"] else None
    xs_all: list[str] = []
    for row in rows:
        x = row["point"].get(first, "") if first else row["policy"]
        if x not in xs_all:
            xs_all.append(x)
    lines: dict[str, list[tuple[int, dict[str, Any], int]]] = {}
    for k, row in enumerate(rows):
        rest = [f"{key}={v}" for key, v in row["point"].items() if key != first]
        label = ", ".join([*rest, row["policy"]] if first else rest) or "runs"
        x = row["point"].get(first, "") if first else row["policy"]
        lines.setdefault(label, []).append((xs_all.index(x), row, k))
    fig, ax = plt.subplots(figsize=(9, 4))
    best = sw["optimum"]["row"] if sw["optimum"] else None
    for label, pts in lines.items():
        pts = [p for p in pts if p[1]["goodput"]["mean"] is not None]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        mean = [100 * p[1]["goodput"]["mean"] for p in pts]
        low = [m - 100 * p[1]["goodput"]["min"] for m, p in zip(mean, pts, strict=True)]
        high = [100 * p[1]["goodput"]["max"] - m for m, p in zip(mean, pts, strict=True)]
        ax.errorbar(xs, mean, yerr=[low, high], marker="o", capsize=3, linewidth=1.2, label=label)
        for x, m, p in zip(xs, mean, pts, strict=True):
            if p[2] == best:
                ax.plot([x], [m], marker="o", markersize=16, markerfacecolor="none", color="red")
                ax.annotate("optimum", (x, m), textcoords="offset points", xytext=(8, 10), color="red")
    ax.set_xticks(range(len(xs_all)), xs_all)
    seeds = len(sw["seeds"])
    ax.set(
        xlabel=first or "policy",
        ylabel="goodput (% of reserved GPU-time)",
        title=f"Sweep: goodput, mean and min-max over {seeds} seed{'s' if seeds > 1 else ''}",
    )
    if len(lines) > 1:
        ax.legend(fontsize=8)
    return fig


def _top_teams(metrics: dict[str, Any], n: int) -> list[str]:
    first = next(iter(metrics["policies"].values()), None)
    if first is None:
        return []
    per = first["per_team"]
    return sorted(per, key=lambda t: (-per[t]["jobs"], t))[:n]


# ---- html ---------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0 1.4em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}h2{margin-top:1.8em;border-bottom:1px solid #ddd}
.note{color:#555;font-size:90%}img{max-width:100%;border:1px solid #eee;margin:.4em 0}
"""


def _e(x: object) -> str:
    return html.escape(str(x))


def hours(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    return f"{s / 3600:,.2f} h"


def _num(x: object, fmt: str = ",.2f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float | int):
        return format(x, fmt)
    return _e(x)


def _pct(x: object) -> str:
    return f"{x * 100:.1f}%" if isinstance(x, float | int) else "-"


def _table(head: list[str], rows: list[list[str]]) -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def render_html(metrics: dict[str, Any], performance: dict[str, Any], plots: list[str]) -> str:
    inp = metrics["inputs"]
    cl, tr = inp["cluster"], inp["trace"]
    by_model = ", ".join(f"{m}: {n:,}" for m, n in cl["gpus_by_model"].items())
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>gpucluster simulation: {_e(cl['name'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Simulation of {_e(cl['name'])}</h1>",
        f"<p>{cl['gpus']:,} GPUs on {cl['nodes']:,} nodes ({_e(by_model)}); "
        f"trace <code>{_e(tr['path'])}</code> ({_e(tr['format'])}); seed {inp['seed']}.</p>",
        *(_sweep_section(metrics) if "sweep" in metrics else []),
        "<h2>Workload</h2>",
        _table(
            ["rows read", "jobs read", "malformed rows", "span", "GPU-hours asked"],
            [
                [
                    f"{tr['rows']:,}",
                    f"{tr['jobs_read']:,}",
                    f"{tr['malformed_rows']:,}",
                    hours(tr["span_s"]),
                    _num(tr["gpu_hours_demanded"]),
                ]
            ],
        ),
    ]
    if tr["malformed_examples"]:
        rows = [[str(e["line"]), _e(e["error"])] for e in tr["malformed_examples"][:20]]
        parts.append("<p class=note>First malformed rows (skipped):</p>" + _table(["line", "problem"], rows))
    parts.append("<h2>Policies side by side</h2>")
    won = metrics.get("winners")
    if won and "sweep" not in metrics:
        said = {
            "goodput": "highest goodput",
            "time_not_running_mean": "least time not running (mean)",
            "cost_per_useful_gpu_hour": "cheapest useful GPU-hour",
        }
        parts.append(
            "<p><b>Answer: " + "; ".join(f"{_e(v)}: {said[k]}" for k, v in won.items() if v is not None) + ".</b></p>"
        )
    rows = []
    for c in metrics["comparison"]:
        rows.append(
            [
                _e(c["policy"]),
                hours(c["jct_mean_s"]),
                hours(c["jct_median_s"]),
                hours(c["jct_p99_s"]),
                hours(c["queueing_delay_mean_s"]),
                hours(c["queueing_delay_p99_s"]),
                hours(c["time_not_running_mean_s"]),
                hours(c["time_not_running_p99_s"]),
                _pct(c["started_within_1h"]),
                f"{c['preemptions']:,}",
                f"{c['restarts']:,}",
                _pct(c["goodput"]),
                f"{c['utilisation'] * 100:.1f}%",
                _num(c["jain_mean_contended"], ".3f"),
                _num(c["gpu_hours_lost"]),
                _num(c["cost_total"]) + " " + _e(c["currency"]),
                _num(c["cost_per_useful_gpu_hour"], ",.3f") + " " + _e(c["currency"]),
                _num(c["energy_kwh"], ",.0f"),
                _num(c.get("jct_mean_vs_baseline"), ".2f") + "x",
            ]
        )
    base = metrics["comparison"][0]["baseline"] if metrics["comparison"] else "-"
    parts.append(
        _table(
            [
                "policy",
                "JCT mean",
                "JCT median",
                "JCT p99",
                "wait mean",
                "wait p99",
                "not running mean",
                "not running p99",
                "started within 1 h",
                "preemptions",
                "restarts",
                "goodput",
                "utilisation",
                "Jain",
                "GPU-h lost",
                "cost",
                "cost per useful GPU-h",
                "energy kWh",
                f"mean JCT vs {base}",
            ],
            rows,
        )
    )
    parts.append(
        f"<p class=note>'vs {_e(base)}' = its mean JCT / this policy's mean JCT (above 1: better). "
        "Jain = mean fairness index over contended times. Wait = submission to first start; not running = "
        "submission to end minus the time the job held GPUs (queued again after preemptions and failures "
        "included). Goodput = useful GPU-time / GPU-time reserved for the jobs (GPUs asked x first start "
        "to end: time holding nothing counts as lost).</p>"
    )
    parts += [f"<img src='{_e(p)}' alt='{_e(p)}'>" for p in plots]
    for name, m in metrics["policies"].items():
        parts.append(_policy_section(name, m))
    parts.append(_performance_section(performance))
    parts.append(
        "<p class=note>Definitions of every figure: src/gpucluster/sim/README.md. metrics.json holds them all, "
        "byte-identical for the same inputs and seed.</p></body></html>\n"
    )
    return "\n".join(parts)


def _sweep_section(metrics: dict[str, Any]) -> list[str]:
    """The answer first: the optimum, what reaches the goodput target, then the whole grid with
    the spread over the seeds (the figures' definitions are under the table)."""
    sw = metrics["sweep"]
    best = sw["optimum"]["row"] if sw["optimum"] else None
    out = ["<h2>Answer</h2>"]
    if sw["optimum"] is not None:
        if best is not None:
            row = sw["rows"][best]
            point = ", ".join(f"{k}={v}" for k, v in row["point"].items()) or "as specified"
            out.append(
                f"<p><b>Optimum: {_e(point)}, policy {_e(row['policy'])}</b>: {_e(sw['optimum']['why'])} "
                f"(goal: {_e(sw['goal'])}).</p>"
            )
        else:
            out.append(f"<p><b>{_e(sw['optimum']['why'])}</b> (goal: {_e(sw['goal'])}).</p>")
    reach = metrics.get("reach_goodput")
    if reach is not None:
        out.append(f"<p><b>{_e(reach['answer'])}.</b></p>")
    rows = []
    for k, row in enumerate(sw["rows"]):
        g, w = row["goodput"], row["time_not_running_p99_s"]
        cpu = row["cost_per_useful_gpu_hour"]
        rows.append(
            [
                "&#9733;" if k == best else "",
                _e(", ".join(f"{key}={v}" for key, v in row["point"].items()) or "as specified"),
                _e(row["policy"]),
                f"{row['gpus']:,}",
                _pct(g["mean"]) + (f" [{_pct(g['min'])} - {_pct(g['max'])}]" if g["mean"] is not None else ""),
                hours(w["mean"]) + (f" [{hours(w['min'])} - {hours(w['max'])}]" if w["mean"] is not None else ""),
                hours(row["jct_mean_s"]["mean"]),
                _num(row["restarts"]["mean"], ",.1f"),
                _num(row["gpu_hours_lost"]["mean"], ",.1f"),
                _num(cpu["mean"], ",.3f") + (f" {_e(metrics['inputs']['cluster'].get('currency', ''))}"),
            ]
        )
    out.append(
        f"<p>{sw['runs']:,} runs: every point x policy x seed ({', '.join(str(s) for s in sw['seeds'])}).</p>"
        + _table(
            [
                "",
                "point",
                "policy",
                "GPUs",
                "goodput mean [min - max]",
                "p99 not running mean [min - max]",
                "JCT mean",
                "restarts",
                "GPU-h lost",
                "cost per useful GPU-h",
            ],
            rows,
        )
        + "<img src='sweep.png' alt='sweep'>"
        + "<p class=note>The runs below are the optimum's (or the first point's) with the first seed.</p>"
    )
    return out


def _stats_row(label: str, s: dict[str, Any]) -> list[str]:
    return [
        label,
        f"{s.get('count', 0):,}",
        hours(s.get("mean")),
        hours(s.get("median")),
        hours(s.get("p90")),
        hours(s.get("p99")),
        hours(s.get("max")),
    ]


def _policy_section(name: str, m: dict[str, Any]) -> str:
    j, g = m["jobs"], m["gpu_hours"]
    out = [f"<h2>Policy {_e(name)}</h2><p class=note>from {_e(m['policy_source'])}</p>"]
    out.append(
        _table(
            [
                "jobs simulated",
                "succeeded",
                "failed: time limit",
                "failed: restarts",
                "never started",
                "cancelled: dependency",
                "skipped",
            ],
            [
                [
                    f"{j['simulated']:,}",
                    f"{j['succeeded']:,}",
                    f"{j['failed_time_limit']:,}",
                    f"{j['failed_too_many_restarts']:,}",
                    f"{j['never_started']:,}",
                    f"{j['cancelled_by_dependency']:,}",
                    f"{j['skipped']:,}",
                ]
            ],
        )
    )
    if j["skipped_reasons"]:
        rows = [[_e(k), f"{v:,}"] for k, v in j["skipped_reasons"].items()]
        out.append(
            f"<p class=note>Skipped jobs ({_num(j['skipped_gpu_hours'])} GPU-hours of work), by reason:</p>"
            + _table(["reason", "jobs"], rows)
        )
    out.append(
        _table(
            ["", "jobs", "mean", "median", "p90", "p99", "max"],
            [_stats_row("JCT", m["jct_s"]), _stats_row("queueing delay", m["queueing_delay_s"])],
        )
    )
    out.append(_waits_by_size_table(m))
    f = m["fairness"]
    out.append(
        _table(
            [
                "makespan",
                "utilisation (live)",
                "utilisation (installed)",
                "Jain (contended)",
                "Jain min",
                "time contended",
            ],
            [
                [
                    hours(m["makespan_s"]),
                    f"{m['utilisation']['mean'] * 100:.1f}%",
                    f"{m['utilisation']['of_installed'] * 100:.1f}%",
                    _num(f["jain_mean_contended"], ".3f"),
                    _num(f["jain_min_contended"], ".3f"),
                    f"{f['contended_fraction'] * 100:.1f}%",
                ]
            ],
        )
    )
    out.append(
        _table(
            [
                "GPU-hours",
                "installed",
                "allocated",
                "useful",
                "checkpoint writes",
                "lost: failures",
                "lost: preemption",
                "idle",
            ],
            [
                [
                    "",
                    _num(g["installed"]),
                    _num(g["allocated"]),
                    _num(g["useful"]),
                    _num(g["checkpoint_writes"]),
                    _num(g["lost_to_failures"]),
                    _num(g["lost_to_preemption"]),
                    _num(g["idle"]),
                ]
            ],
        )
    )
    fl, c, e = m["failures"], m["cost"], m["energy_kwh"]
    out.append(
        _table(
            [
                "node failures",
                "jobs interrupted",
                "restarts",
                "preemptions",
                "cost (jobs)",
                "cost (idle)",
                "kWh (jobs)",
                "kWh (idle)",
            ],
            [
                [
                    f"{fl['node_failures']:,}",
                    f"{fl['jobs_interrupted']:,}",
                    f"{fl['restarts']:,}",
                    f"{m['preemptions']:,}",
                    _num(c["attributed"]),
                    _num(c["idle"]),
                    _num(e["busy"]),
                    _num(e["idle"]),
                ]
            ],
        )
    )
    rows = []
    for team, t in m["per_team"].items():
        rows.append(
            [
                _e(team),
                f"{t['jobs']:,}",
                hours(t["jct_s"].get("mean")),
                hours(t["jct_s"].get("p99")),
                hours(t["queueing_delay_s"].get("mean")),
                hours(t["queueing_delay_s"].get("p99")),
                _num(t["gpu_hours"]),
                f"{t['share_of_gpu_hours'] * 100:.1f}%",
                f"{t['entitlement'] * 100:.1f}%",
                _num(t["lost_gpu_hours"]),
                _num(t["cost"]),
                _num(t["energy_kwh"]),
            ]
        )
    out.append(
        "<details><summary>Per team</summary>"
        + _table(
            [
                "team",
                "jobs",
                "JCT mean",
                "JCT p99",
                "wait mean",
                "wait p99",
                "GPU-h",
                "share",
                "entitled",
                "GPU-h lost",
                "cost",
                "kWh",
            ],
            rows,
        )
        + "</details>"
    )
    out.append(estimate_section(m))
    return "\n".join(out)


def _waits_by_size_table(m: dict[str, Any]) -> str:
    """metrics.json's `waits_by_size`: the wait to first start and the time not running by the
    GPUs a job asked for, since a mean over every job hides how long the large ones wait."""
    sizes = m.get("waits_by_size") or {}
    if not sizes:
        return ""
    rows = []
    for label, w in sizes.items():
        d, nr = w["queueing_delay_s"], w["time_not_running_s"]
        rows.append(
            [
                _e(label),
                f"{d.get('count', 0):,}",
                hours(d.get("mean")),
                hours(d.get("median")),
                hours(d.get("p99")),
                f"{nr.get('count', 0):,}",
                hours(nr.get("mean")),
                hours(nr.get("median")),
                hours(nr.get("p99")),
            ]
        )
    return (
        "<p class=note>Waits by job size (GPUs asked): wait = submission to first start, over the jobs "
        "that started; not running = submission to end minus the time holding GPUs, over the jobs that "
        "ended.</p>"
        + _table(
            [
                "GPUs",
                "jobs started",
                "wait mean",
                "wait p50",
                "wait p99",
                "jobs ended",
                "not running mean",
                "not running p50",
                "not running p99",
            ],
            rows,
        )
    )


def _performance_section(perf: dict[str, Any]) -> str:
    rows = []
    for name, p in perf["policies"].items():
        rows.append(
            [
                _e(name),
                f"{p['wall_s']:,.1f} s",
                f"{p['events']:,}",
                _num(p["events_per_s"], ",.0f"),
                f"{p['decide_calls']:,}",
                f"{(p['decide_share'] or 0) * 100:.0f}%",
                _num(p["decide_median_ms"], ".2f"),
                _num(p["decide_p99_ms"], ".2f"),
                _num(p["queue_at_decide_mean"], ",.0f"),
                f"{p['queue_at_decide_max']:,}",
            ]
        )
    return (
        "<h2>How the simulation ran</h2>"
        + _table(
            [
                "policy",
                "wall",
                "events",
                "events/s",
                "scheduler calls",
                "time in scheduler",
                "call median ms",
                "call p99 ms",
                "queue at call (mean)",
                "max",
            ],
            rows,
        )
        + f"<p class=note>Reading the inputs took {perf['read_s']:.1f} s; everything {perf['total_s']:.1f} s; "
        f"peak memory {perf['peak_rss_mib']:,.0f} MiB.</p>"
    )
