"""What `gpucluster simulate` does, without the terminal: load, run each policy, report.

Kept apart from the CLI so tests, the benchmark and notebooks drive the same path; progress is
reported through callbacks, so this module never draws anything.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucluster.sim.engine import Engine, ProgressFn, RunResult
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.estimate_error import add_estimate_metrics
from gpucluster.sim.metrics import comparison, inputs_metrics, run_metrics
from gpucluster.sim.readers import read_trace
from gpucluster.sim.scheduling import SimPolicy, load_policy
from gpucluster.sim.spec import ClusterSpec, load_cluster_spec
from gpucluster.sim.workload import Trace, TraceJob


@dataclass(frozen=True)
class SimulateOptions:
    cluster: Path
    trace: Path
    out: Path | None
    policies: tuple[str, ...] = ("fifo", "priority")
    fmt: str | None = None
    seed: int = 0
    strict: bool = False
    estimates: bool = False  # measure the start estimates a live head would show (issue 24)
    estimate_every: int = 1  # ... at every Nth submit


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
        raise SimInputError(f"--policy: two policies are named {dupes[0]!r}; give each file its own name")
    trace = read_trace(opts.trace, spec, opts.seed, opts.fmt, opts.strict)
    if not trace.jobs:
        first = f"; line {trace.errors[0].line}: {trace.errors[0].message}" if trace.errors else ""
        raise SimInputError(f"{opts.trace}: no usable job in {trace.rows} row(s){first}")
    return spec, trace, policies


def simulate(
    opts: SimulateOptions,
    *,
    on_phase: PhaseFn | None = None,
    on_progress: PolicyProgressFn | None = None,
    write: bool = True,
    workers: int | None = None,
) -> Outcome:
    """Run every policy of `opts` and (with `write`) write the report to `opts.out`."""
    t0 = time.perf_counter()
    say = on_phase or (lambda _text: None)
    say("reading inputs")
    spec, trace, policies = load_inputs(opts)
    read_s = time.perf_counter() - t0
    say(f"simulating {', '.join(p.name for p in policies)}")
    workers = workers if workers is not None else min(len(policies), os.cpu_count() or 1)
    results = run_policies(
        spec,
        trace.jobs,
        policies,
        opts.seed,
        workers,
        on_progress,
        estimates=opts.estimates,
        estimate_every=opts.estimate_every,
    )
    say("computing metrics")
    per_policy = [run_metrics(res, spec) for res in results]
    add_estimate_metrics(per_policy, results)
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
        outcome.files = write_report(opts.out, metrics, performance, results)
    return outcome


def run_policies(
    spec: ClusterSpec,
    jobs: list[TraceJob],
    policies: list[SimPolicy],
    seed: int,
    workers: int,
    on_progress: PolicyProgressFn | None,
    wall_budget_s: float | None = None,
    cpu_budget_s: float | None = None,
    estimates: bool = False,
    estimate_every: int = 1,
) -> list[RunResult]:
    """One Engine per policy; with workers > 1, policies run in parallel forked processes.

    Why fork: the workload (a million jobs) is inherited, not pickled; each child only sends
    its RunResult back. Progress crosses over through a shared array the parent polls."""
    if workers <= 1 or len(policies) <= 1 or "fork" not in mp.get_all_start_methods() or _threaded():
        return [
            Engine(
                spec,
                jobs,
                p,
                seed,
                on_progress=_named(on_progress, p.name),
                wall_budget_s=wall_budget_s,
                cpu_budget_s=cpu_budget_s,
                estimates=estimates,
                estimate_every=estimate_every,
            ).run()
            for p in policies
        ]
    global _SHARED
    ctx = mp.get_context("fork")
    progress = ctx.Array("d", 2 * len(policies), lock=False)
    _SHARED = (spec, jobs, policies, seed, progress, wall_budget_s, cpu_budget_s, (estimates, estimate_every))
    try:
        with ctx.Pool(processes=min(workers, len(policies))) as pool:
            pending = [pool.apply_async(_run_forked, (k,)) for k in range(len(policies))]
            while not all(p.ready() for p in pending):
                time.sleep(0.2)
                if on_progress is not None:
                    for k, pol in enumerate(policies):
                        on_progress(pol.name, int(progress[2 * k]), len(jobs), progress[2 * k + 1])
            return [p.get() for p in pending]
    finally:
        _SHARED = None


def _threaded() -> bool:
    """Whether this process runs other threads, native ones included (/proc/self/task).

    Why it matters: a forked child gets a copy of every lock as it was, held or not, but only the
    forking thread; a lock another thread held (an allocator's, a logging handler's, Ray's core
    worker's) is never released in the child, which then hangs. Seen: `simulate` called in a test
    process that had started Ray hung forever in its first forked worker. The command line's
    own process is single-threaded, so it still forks; anything else runs the policies in turn."""
    try:
        return len(os.listdir("/proc/self/task")) > 1
    except OSError:
        return threading.active_count() > 1


def _named(on_progress: PolicyProgressFn | None, name: str) -> ProgressFn | None:
    if on_progress is None:
        return None
    report = on_progress
    return lambda done, total, t: report(name, done, total, t)


_SHARED: (
    tuple[ClusterSpec, list[TraceJob], list[SimPolicy], int, Any, float | None, float | None, tuple[bool, int]] | None
) = None


def _run_forked(k: int) -> RunResult:
    assert _SHARED is not None
    spec, jobs, policies, seed, progress, budget, cpu_budget, (estimates, every) = _SHARED
    parent = os.getppid()

    def cb(done: int, total: int, t: float) -> None:
        progress[2 * k] = done
        progress[2 * k + 1] = t
        if os.getppid() != parent:  # the parent was killed (SIGTERM/SIGKILL): do not run on alone
            os._exit(1)

    return Engine(
        spec,
        jobs,
        policies[k],
        seed,
        on_progress=cb,
        wall_budget_s=budget,
        cpu_budget_s=cpu_budget,
        estimates=estimates,
        estimate_every=every,
    ).run()


def performance_figures(results: list[RunResult], read_s: float, total_s: float) -> dict[str, Any]:
    """How fast the run went (not deterministic, so kept out of metrics.json)."""
    per: dict[str, Any] = {}
    for res in results:
        times = sorted(res.decide_times)
        n = len(times)
        per[res.policy.name] = {
            "wall_s": round(res.wall_s, 3),
            "cpu_s": round(res.cpu_s, 3),
            "events": res.events,
            "events_per_s": round(res.events / res.wall_s) if res.wall_s else None,
            "decide_calls": res.decide_calls,
            "decide_skipped_cluster_full": res.decide_skipped,
            "decide_s": round(res.decide_s, 3),  # CPU seconds, as the per-call times
            "decide_share": round(res.decide_s / res.cpu_s, 3) if res.cpu_s else None,
            "decide_median_ms": round(times[n // 2] * 1e3, 4) if n else None,
            "decide_p99_ms": round(times[min(n - 1, int(0.99 * n))] * 1e3, 4) if n else None,
            "decide_max_ms": round(times[-1] * 1e3, 4) if n else None,
            "queue_at_decide_mean": round(res.decide_queue_sum / n, 1) if n else 0,
            "queue_at_decide_max": res.decide_queue_max,
            "running_at_decide_max": res.decide_running_max,
            "truncated_at_s": round(res.truncated_at, 1) if res.truncated else None,
        }
    return {
        "read_s": round(read_s, 3),
        "total_s": round(total_s, 3),
        "peak_rss_mib": round(_peak_rss_kib() / 1024, 1),
        "policies": per,
    }


def _peak_rss_kib() -> int:
    """Peak resident memory of this process or, if larger, of any finished child (a worker)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children)
