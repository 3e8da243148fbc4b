"""`--sweep KEY=V1,V2,...` and `--seeds N`: many runs of one workload, one answer.

A planner's questions are rarely about one configuration: how often to checkpoint, how many
spares, how many nodes meet a wait target. Each point of the grid (the product of every swept
key's values) is run for each policy and each seed; the figures of a point are summarised over
its seeds (mean, min, max), so the spread a single seed hides is shown, and the optimum is marked
by a stated goal.

Keys are paths into the cluster spec (`checkpoints.interval`, `node_groups[0].count`,
`node_groups[0].spares.hot`, `failures.gpu_failures_per_day`): each value is laid over the file
and validated by the spec's own loader, so a bad value is refused with the spec's words. `policy`
sweeps the policy itself (`policy=fifo,default,mine.yaml`); `policy.KEY` a value inside every
policy file of the run (`policy.preemption.enabled=true,false`, `policy.ordering.mode=age,las`,
`policy.fair_share.half_life=1d,7d`), laid over the file's mapping the same way and validated by
the head's policy loader.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import yaml

from gpucluster.sim.errors import SimInputError
from gpucluster.sim.metrics import H, r
from gpucluster.sim.spec import ClusterSpec, load_cluster_spec
from gpucluster.sim.yamlspec import Path_

MAX_RUNS = 10_000
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\[\d+\]|\d+")


@dataclass(frozen=True)
class Axis:
    """One swept key and its values, as written (texts) and as YAML reads them (values)."""

    key: str
    path: Path_
    texts: tuple[str, ...]
    values: tuple[Any, ...]
    in_policy: bool = False  # `policy.KEY`: `path` is into the policy file, not the cluster spec


def parse_axis(arg: str) -> Axis:
    """`KEY=V1,V2,...` -> Axis; a clear error for a missing `=`, an empty value or a bad key."""
    key, eq, rest = arg.partition("=")
    key = key.strip()
    if not eq or not key:
        raise SimInputError(f"--sweep {arg!r}: write KEY=V1,V2,... e.g. checkpoints.interval=10m,30m,1h")
    texts = tuple(t.strip() for t in rest.split(","))
    if not texts or any(not t for t in texts):
        raise SimInputError(f"--sweep {arg!r}: every value must be non-empty (KEY=V1,V2,...)")
    if len(set(texts)) != len(texts):
        raise SimInputError(f"--sweep {arg!r}: a value is given twice")
    if key == "policy":
        return Axis(key, (), texts, texts)
    if key.startswith("policy."):
        path = _path(key.removeprefix("policy."), arg, "policy.preemption.enabled")
        return Axis(key, path, texts, tuple(_value(t) for t in texts), in_policy=True)
    path = _path(key, arg)
    return Axis(key, path, texts, tuple(_value(t) for t in texts))


def _path(key: str, arg: str, example: str = "node_groups[0].count") -> Path_:
    parts: list[str | int] = []
    for piece in key.split("."):
        if not piece:
            raise SimInputError(f"--sweep {arg!r}: {key!r} has an empty part; write e.g. {example}")
        tokens = _KEY.findall(piece)
        if "".join(tokens) != piece:
            raise SimInputError(f"--sweep {arg!r}: cannot read the key {key!r}; write e.g. {example}")
        for t in tokens:
            parts.append(int(t.strip("[]")) if t[0] == "[" or t.isdigit() else t)
    if isinstance(parts[0], int):
        raise SimInputError(f"--sweep {arg!r}: a key starts with a name, e.g. {example}")
    return tuple(parts)


def _value(text: str) -> Any:
    """A value as YAML reads it in the spec: `2048` a number, `30m` a duration, `none` a word."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


@dataclass(frozen=True)
class Point:
    """One grid point: each swept key's value (as written), the spec with them laid over, and
    the policy argument (the swept one, or None: every `--policy`)."""

    settings: tuple[tuple[str, str], ...]
    spec: ClusterSpec
    policy: str | None
    # `policy.KEY` values: (path into the policy file, value), laid over every policy file run here
    policy_overrides: tuple[tuple[Path_, Any], ...] = ()

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings) or "as specified"


def grid(cluster: Path, axes: list[Axis]) -> list[Point]:
    """Every combination of the axes' values, each spec loaded and validated up front (a bad
    value stops the command before any run, naming the key and the value)."""
    keys = [a.key for a in axes]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise SimInputError(f"--sweep {dupes[0]}: swept twice; give all its values in one --sweep")
    points: list[Point] = []
    for combo in product(*[range(len(a.texts)) for a in axes]):
        chosen = list(zip(axes, combo, strict=True))
        overrides = tuple((a.path, a.values[i]) for a, i in chosen if a.key != "policy" and not a.in_policy)
        in_policy = tuple((a.path, a.values[i]) for a, i in chosen if a.in_policy)
        settings = tuple((a.key, a.texts[i]) for a, i in chosen)
        policy = next((a.texts[i] for a, i in chosen if a.key == "policy"), None)
        try:
            spec = load_cluster_spec(cluster, overrides)
        except SimInputError as e:
            raise SimInputError(f"{e} (with --sweep {', '.join(f'{k}={v}' for k, v in settings)})") from None
        points.append(Point(settings, spec, policy, in_policy))
    return points


# ---- summarising the runs -------------------------------------------------------------------

# The figures each point reports over its seeds: (name, how to read it from run_metrics' dict).
FIGURES: tuple[tuple[str, str], ...] = (
    ("goodput", "goodput.of_reserved"),
    ("time_not_running_p99_s", "time_not_running_s.p99"),
    ("time_not_running_mean_s", "time_not_running_s.mean"),
    ("queueing_delay_p99_s", "queueing_delay_s.p99"),
    ("jct_mean_s", "jct_s.mean"),
    ("makespan_s", "makespan_s"),
    ("utilisation", "utilisation.mean"),
    ("restarts", "failures.restarts"),
    ("preemptions", "preemptions"),
    ("gpu_hours_lost", "gpu_hours_lost"),
    ("cost_total", "cost.total"),
    ("cost_per_useful_gpu_hour", "cost.per_useful_gpu_hour"),
    ("energy_kwh", "energy_kwh.total"),
)


def figure(m: dict[str, Any], dotted_key: str) -> float | None:
    if dotted_key == "gpu_hours_lost":
        g = m["gpu_hours"]
        return float(g["lost_to_failures"] + g["lost_to_preemption"])
    v: Any = m
    for part in dotted_key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) else None


def spread(values: list[float | None]) -> dict[str, float | None]:
    """mean, min, max over seeds (None where a seed had no value: e.g. no job finished)."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return {"mean": None, "min": None, "max": None}
    return {"mean": r(math.fsum(xs) / len(xs), 4), "min": r(min(xs), 4), "max": r(max(xs), 4)}


@dataclass(frozen=True)
class Goal:
    """What the optimum is: the highest mean goodput, or (with a wait target) the smallest
    cluster whose mean p99 time not running meets the target (ties: higher goodput)."""

    wait_target_s: float | None = None

    def describe(self) -> str:
        if self.wait_target_s is None:
            return "highest mean goodput (useful / reserved GPU-time) over the seeds"
        return (
            f"fewest GPUs whose p99 time not running (mean over the seeds) is at most "
            f"{self.wait_target_s / H:g} h; then the highest goodput"
        )


def summarise(
    points: list[Point],
    policies: list[str],
    seeds: list[int],
    runs: dict[tuple[int, str, int], dict[str, Any]],
    goal: Goal,
) -> dict[str, Any]:
    """The sweep as metrics.json holds it: one row per point and policy, each figure's spread
    over the seeds, the seeds' own values, and the optimum by `goal`."""
    rows: list[dict[str, Any]] = []
    for k, p in enumerate(points):
        for name in [p.policy] if p.policy is not None else policies:
            per_seed = [runs[(k, name, s)] for s in seeds]
            row: dict[str, Any] = {
                "point": dict(p.settings),
                "policy": name,
                "gpus": p.spec.total_gpus,
                "runs": len(per_seed),
            }
            for fig, key in FIGURES:
                row[fig] = spread([figure(m, key) for m in per_seed])
            row["per_seed"] = [
                {"seed": s, **{fig: _round(figure(m, key)) for fig, key in FIGURES[:3]}}
                for s, m in zip(seeds, per_seed, strict=True)
            ]
            rows.append(row)
    best = optimum(rows, goal)
    return {
        "axes": [
            {"key": key, "values": list(dict.fromkeys(pt.settings[i][1] for pt in points))}
            for i, (key, _) in enumerate(points[0].settings if points else ())
        ],
        "seeds": seeds,
        "runs": len(runs),
        "goal": goal.describe(),
        "rows": rows,
        "optimum": best,
    }


def _round(v: float | None) -> float | None:
    return None if v is None else r(v, 4)


def optimum(rows: list[dict[str, Any]], goal: Goal) -> dict[str, Any] | None:
    """The row the goal picks, with its index and why; None when no row qualifies (said so)."""
    if goal.wait_target_s is None:
        scored = [(row["goodput"]["mean"], -k, k) for k, row in enumerate(rows) if row["goodput"]["mean"] is not None]
        if not scored:
            return None
        _, _, k = max(scored)
        return {"row": k, "why": f"highest mean goodput: {rows[k]['goodput']['mean'] * 100:.1f}%"}
    target = goal.wait_target_s
    ok = [
        (row["gpus"], -(row["goodput"]["mean"] or 0.0), k)
        for k, row in enumerate(rows)
        if row["time_not_running_p99_s"]["mean"] is not None and row["time_not_running_p99_s"]["mean"] <= target
    ]
    if not ok:
        return {"row": None, "why": f"no point meets p99 time not running <= {target / H:g} h"}
    gpus, _, k = min(ok)
    p99 = rows[k]["time_not_running_p99_s"]["mean"] / H
    return {"row": k, "why": f"fewest GPUs ({gpus:,}) with p99 time not running {p99:.2f} h <= {target / H:g} h"}


def reach_goodput(
    spec: ClusterSpec, gpus: float, runs: list[dict[str, Any]], target: float = 0.9
) -> dict[str, Any] | None:
    """What checkpoint and restart cost one training job would need to reach `target` goodput,
    by the first-order model of checkpointing (Young/Daly) calibrated on the run.

    Loss at interval T: C/T (writing) + (T/2 + R + D)/M per failure, M the job's MTBF, C the
    checkpoint cost, R the restart cost and D the time the job holds nothing per failure
    (backoff, waiting for a node), measured in the run. At the best T = sqrt(2CM) it is
    sqrt(2C/M) + (R + D)/M. Scaling C and R by s and solving for the target gives the answer;
    when D alone loses more than the target allows, no checkpoint speed reaches it (spares or
    faster repairs must). Why a model and not more runs: it answers in no time and names the
    lever; the sweep's runs show how far the model is from the simulated figure."""
    rate = spec.failures.gpu_failures_per_day
    restarts = sum(run["failures"]["restarts"] for run in runs)
    if rate <= 0 or gpus <= 0 or not restarts:
        return None
    mtbf = 86400.0 / (rate * gpus)
    c, rr = spec.checkpoints.cost_s, spec.checkpoints.restart_s
    idle_s = math.fsum(
        max(0.0, (run["goodput"]["reserved_gpu_hours"] - run["gpu_hours"]["allocated"]) * H / gpus) for run in runs
    )
    d = idle_s / restarts  # over every seed's failures
    simulated = spread([run["goodput"]["of_reserved"] for run in runs])["mean"] or 0.0

    def loss(s: float) -> float:
        return float(math.sqrt(2.0 * s * c / mtbf) + (s * rr + d) / mtbf)

    # Calibrate: what the model misses (checkpoints cut short by the job's end, restarts'
    # backoffs beyond D, a failure during a restart) is kept as a fixed loss, so at today's
    # costs the model gives exactly the simulated goodput.
    bias = (1.0 - simulated) - loss(1.0)
    allowed = 1.0 - target - bias
    out: dict[str, Any] = {
        "target": target,
        "job_mtbf_s": r(mtbf, 1),
        "checkpoint_cost_s": r(c, 2),
        "restart_s": r(rr, 2),
        "holding_nothing_per_failure_s": r(d, 1),
        "model_goodput_now": r(1.0 - loss(1.0), 4),
        "model_bias": r(bias, 4),
        "simulated_goodput": simulated,
        "runs": len(runs),
    }
    if d / mtbf >= allowed or allowed <= 0:
        out["scale"] = None
        out["answer"] = (
            f"no checkpoint or restart speed reaches {target:.0%}: the {d / 60:.1f} min the job holds nothing "
            f"per failure (backoff, waiting for a node) and what the model does not cover lose "
            f"{d / mtbf + bias:.1%} however fast it checkpoints; add spares or shorten repairs "
            f"(simulated {simulated * 100:.1f}%, mean of {len(runs)} run{'s' if len(runs) > 1 else ''})"
        )
        return out
    # sqrt(2C/M) x + (R/M) x^2 + D/M - allowed = 0, x = sqrt(s)
    a, b, cc = rr / mtbf, math.sqrt(2.0 * c / mtbf), d / mtbf - allowed
    x = (-cc / b) if a == 0 else (-b + math.sqrt(b * b - 4 * a * cc)) / (2 * a)
    s = x * x
    out["scale"] = r(s, 4)
    out["checkpoint_cost_needed_s"] = r(s * c, 2)
    out["restart_needed_s"] = r(s * rr, 2)
    out["best_interval_then_s"] = r(math.sqrt(2.0 * s * c * mtbf), 1) if c > 0 else None
    out["answer"] = (
        f"to reach {target:.0%}: checkpoint and restart {1 / s:.3g}x as fast as now "
        f"(checkpoint {s * c:.3g} s instead of {c:.3g} s, restart {s * rr:.0f} s instead of {rr:.0f} s; "
        f"best interval then {math.sqrt(2.0 * s * c * mtbf) / 60:.1f} min), "
        f"by the Young/Daly model calibrated to the simulated {simulated * 100:.1f}% (mean of {len(runs)} "
        f"run{'s' if len(runs) > 1 else ''}; the model alone gives {1 - loss(1.0):.1%})"
        if s < 1
        else f"already at {target:.0%} or above (simulated {simulated * 100:.1f}%): checkpoint and restart "
        f"may be up to {s:.2g}x slower"
    )
    return out
