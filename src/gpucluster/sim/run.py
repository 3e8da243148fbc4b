"""What `gpucluster simulate` does, without the terminal: load, run each policy, report.

Kept apart from the CLI so tests, the benchmark and notebooks drive the same path; progress is
reported through callbacks, so this module never draws anything.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucluster.sim.engine import Engine, RunResult
from gpucluster.sim.metrics import comparison, inputs_metrics, run_metrics
from gpucluster.sim.readers import read_trace
from gpucluster.sim.scheduling import SimPolicy, load_policy
from gpucluster.sim.spec import ClusterSpec, load_cluster_spec
from gpucluster.sim.workload import Trace


@dataclass(frozen=True)
class SimulateOptions:
    cluster: Path
    trace: Path
    out: Path | None
    policies: tuple[str, ...] = ("fifo", "priority")
    fmt: str | None = None
    seed: int = 0
    strict: bool = False


@dataclass
class Outcome:
    """Everything produced: the deterministic metrics, performance figures, files written."""

    metrics: dict[str, Any]
    performance: dict[str, Any]
    results: list[RunResult] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


PhaseFn = Callable[[str], None]
PolicyProgressFn = Callable[[str, int, int, float], None]


def load_inputs(opts: SimulateOptions) -> tuple[ClusterSpec, Trace, list[SimPolicy]]:
    """Everything a run needs, validated before any simulating starts."""
    spec = load_cluster_spec(opts.cluster)
    policies = [load_policy(p) for p in opts.policies]
    names = [p.name for p in policies]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        from gpucluster.sim.errors import SimInputError

        raise SimInputError(f"--policy: two policies are named {dupes[0]!r}; give each file its own name")
    trace = read_trace(opts.trace, spec, opts.seed, opts.fmt, opts.strict)
    return spec, trace, policies


def simulate(
    opts: SimulateOptions,
    *,
    on_phase: PhaseFn | None = None,
    on_progress: PolicyProgressFn | None = None,
    write: bool = True,
) -> Outcome:
    t0 = time.perf_counter()
    say = on_phase or (lambda _text: None)
    say("reading inputs")
    spec, trace, policies = load_inputs(opts)
    read_s = time.perf_counter() - t0
    results: list[RunResult] = []
    for policy in policies:
        say(f"simulating {policy.name}")
        cb = None
        if on_progress is not None:
            report = on_progress
            name = policy.name
            cb = lambda done, total, t, _n=name: report(_n, done, total, t)  # noqa: E731
        results.append(Engine(spec, trace.jobs, policy, opts.seed, on_progress=cb).run())
    per_policy = [run_metrics(res, spec) for res in results]
    metrics = {
        "inputs": inputs_metrics(spec, trace, opts.seed),
        "comparison": comparison(per_policy),
        "policies": {m["policy"]: m for m in per_policy},
    }
    performance = performance_figures(results, read_s, time.perf_counter() - t0)
    outcome = Outcome(metrics=metrics, performance=performance, results=results)
    if write and opts.out is not None:
        from gpucluster.sim.report import write_report

        say("writing the report")
        outcome.files = write_report(opts.out, metrics, performance)
    return outcome


def performance_figures(results: list[RunResult], read_s: float, total_s: float) -> dict[str, Any]:
    """How fast the run went (not deterministic, so kept out of metrics.json)."""
    per: dict[str, Any] = {}
    for res in results:
        times = sorted(res.decide_times)
        n = len(times)
        per[res.policy.name] = {
            "wall_s": round(res.wall_s, 3),
            "events": res.events,
            "events_per_s": round(res.events / res.wall_s) if res.wall_s else None,
            "decide_calls": res.decide_calls,
            "decide_s": round(res.decide_s, 3),
            "decide_share": round(res.decide_s / res.wall_s, 3) if res.wall_s else None,
            "decide_median_ms": round(times[n // 2] * 1e3, 4) if n else None,
            "decide_p99_ms": round(times[min(n - 1, int(0.99 * n))] * 1e3, 4) if n else None,
            "decide_max_ms": round(times[-1] * 1e3, 4) if n else None,
            "queue_at_decide_mean": round(res.decide_queue_sum / n, 1) if n else 0,
            "queue_at_decide_max": res.decide_queue_max,
            "running_at_decide_max": res.decide_running_max,
        }
    return {
        "read_s": round(read_s, 3),
        "total_s": round(total_s, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "policies": per,
    }
