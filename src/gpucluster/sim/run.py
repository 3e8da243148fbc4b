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
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpucluster.sim.engine import Engine, ProgressFn, RunResult
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.estimate_error import add_estimate_metrics
from gpucluster.sim.metrics import comparison, inputs_metrics, run_metrics, winners
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
    sweeps: tuple[str, ...] = ()  # `KEY=V1,V2,...` each (sweep.py): a grid of runs
    seeds: int = 1  # runs per grid point and policy, seeds seed .. seed + seeds - 1
    wait_target_s: float | None = None  # the sweep's goal: fewest GPUs meeting it (else max goodput)
    goodput_target: float = 0.9  # one training job: what checkpoint/restart cost reaches this
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
    if opts.sweeps or opts.seeds > 1:
        return simulate_sweep(opts, on_phase=on_phase, on_progress=on_progress, write=write, workers=workers)
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
        "winners": winners(comparison(per_policy)),
        "policies": {m["policy"]: m for m in per_policy},
    }
    performance = performance_figures(results, read_s, time.perf_counter() - t0)
    outcome = Outcome(metrics=metrics, performance=performance, results=results)
    if write and opts.out is not None:
        from gpucluster.sim.report import write_report

        say("writing the report")
        outcome.files = write_report(opts.out, metrics, performance, results)
    return outcome


def simulate_sweep(
    opts: SimulateOptions,
    *,
    on_phase: PhaseFn | None = None,
    on_progress: PolicyProgressFn | None = None,
    write: bool = True,
    workers: int | None = None,
) -> Outcome:
    """Every grid point x policy x seed of `opts` (sweep.py), summarised into one answer."""
    from gpucluster.sim.sweep import MAX_RUNS, Goal, grid, parse_axis, reach_goodput, summarise

    t0 = time.perf_counter()
    say = on_phase or (lambda _text: None)
    say("reading inputs")
    if not 1 <= opts.seeds <= 1000:
        raise SimInputError(f"--seeds {opts.seeds}: give between 1 and 1000 runs per point")
    if not 0 < opts.goodput_target < 1:
        raise SimInputError(f"--goodput-target {opts.goodput_target}: give a fraction between 0 and 1, e.g. 0.9")
    axes = [parse_axis(a) for a in opts.sweeps]
    points = grid(opts.cluster, axes)
    base, trace, policies = load_inputs(opts)
    by_name = {p.name: p for p in policies}
    arg_of = {p.name: arg for p, arg in zip(policies, opts.policies, strict=True)}
    swept = next((a for a in axes if a.key == "policy"), None)
    if swept is not None:
        for arg in swept.texts:
            by_name[arg] = replace(load_policy(arg), name=arg)  # named as swept (a file's path, not its stem)
            arg_of[arg] = arg
    names = [p.name for p in policies]
    # `policy.KEY` values: each policy of a point read again with them laid over its file, all
    # before any run, so a bad key or value stops the command naming it
    laid: dict[tuple[str, tuple[object, ...]], SimPolicy] = {}
    policy_at: dict[tuple[int, str], SimPolicy] = {}
    for k, point in enumerate(points):
        if not point.policy_overrides:
            continue
        for name in [point.policy] if point.policy is not None else names:
            cache = (name, point.policy_overrides)
            if cache not in laid:
                try:
                    laid[cache] = replace(load_policy(arg_of[name], point.policy_overrides), name=name)
                except SimInputError as e:
                    raise SimInputError(f"{e} (with --sweep {point.label})") from None
            policy_at[(k, name)] = laid[cache]
    seeds = [opts.seed + k for k in range(opts.seeds)]
    cases: list[tuple[tuple[int, str, int], ClusterSpec, list[TraceJob], SimPolicy, int]] = []
    traces: dict[tuple[object, ...], Trace] = {}
    for k, point in enumerate(points):
        for name in [point.policy] if point.policy is not None else names:
            for seed in seeds:
                spec = point.spec
                key = (spec.fill, tuple((g.gpu_model, g.gpus) for g in spec.groups), seed)
                if key not in traces:
                    traces[key] = (
                        trace
                        if seed == opts.seed and spec.fill == base.fill and spec.groups == base.groups
                        else read_trace(opts.trace, spec, seed, opts.fmt, opts.strict)
                    )
                pol = policy_at.get((k, name), by_name[name])
                cases.append(((k, name, seed), spec, traces[key].jobs, pol, seed))
    if len(cases) > MAX_RUNS:
        raise SimInputError(f"--sweep/--seeds: {len(cases):,} runs; at most {MAX_RUNS:,} (fewer values or seeds)")
    read_s = time.perf_counter() - t0
    say(f"simulating {len(cases):,} runs ({len(points)} points x policies x {len(seeds)} seeds)")
    workers = workers if workers is not None else min(len(cases), os.cpu_count() or 1)
    results = run_cases([(spec, jobs, pol, seed) for _, spec, jobs, pol, seed in cases], workers, on_progress)
    say("computing metrics")
    runs = {c[0]: run_metrics(res, c[1]) for c, res in zip(cases, results, strict=True)}
    summary = summarise(points, names, seeds, runs, Goal(opts.wait_target_s))
    # the detail of the optimum (or the first point), first seed: one run per policy, as without a sweep
    best = summary["optimum"]["row"] if summary["optimum"] and summary["optimum"]["row"] is not None else 0
    row = summary["rows"][best]
    k = next(i for i, p in enumerate(points) if dict(p.settings) == row["point"])
    point_policy = points[k].policy
    shown = [runs[(k, name, seeds[0])] for name in ([point_policy] if point_policy is not None else names)]
    metrics: dict[str, Any] = {
        "inputs": inputs_metrics(base, trace, opts.seed),
        "sweep": summary,
        "comparison": comparison(shown),
        "policies": {m["policy"]: m for m in shown},
    }
    if len(trace.jobs) == 1:
        best_runs = [runs[(k, row["policy"], s)] for s in seeds]
        reach = reach_goodput(points[k].spec, trace.jobs[0].gpus, best_runs, opts.goodput_target)
        if reach is not None:
            metrics["reach_goodput"] = reach
    performance = performance_figures(results, read_s, time.perf_counter() - t0)
    performance["runs"] = len(results)
    performance["cpu_s_all_runs"] = round(sum(res.cpu_s for res in results), 3)
    outcome = Outcome(metrics=metrics, performance=performance, results=[])
    if write and opts.out is not None:
        from gpucluster.sim.report import write_report

        say("writing the report")
        outcome.files = write_report(opts.out, metrics, performance, [])
    return outcome


def run_cases(
    cases: list[tuple[ClusterSpec, list[TraceJob], SimPolicy, int]],
    workers: int,
    on_progress: PolicyProgressFn | None,
) -> list[RunResult]:
    """One Engine per (spec, jobs, policy, seed); with workers > 1 in forked processes, as
    run_policies (the same reasons), without its progress array: a sweep's runs are short."""
    if workers <= 1 or len(cases) <= 1 or "fork" not in mp.get_all_start_methods() or _threaded():
        out = []
        for n, (spec, jobs, pol, seed) in enumerate(cases):
            out.append(Engine(spec, jobs, pol, seed).run())
            if on_progress is not None:
                on_progress("runs", n + 1, len(cases), 0.0)
        return out
    global _CASES
    ctx = mp.get_context("fork")
    _CASES = cases
    try:
        with ctx.Pool(processes=min(workers, len(cases))) as pool:
            pending = [pool.apply_async(_run_case, (k,)) for k in range(len(cases))]
            while not all(p.ready() for p in pending):
                time.sleep(0.2)
                if on_progress is not None:
                    on_progress("runs", sum(p.ready() for p in pending), len(cases), 0.0)
            return [p.get() for p in pending]
    finally:
        _CASES = None


_CASES: list[tuple[ClusterSpec, list[TraceJob], SimPolicy, int]] | None = None


def _run_case(k: int) -> RunResult:
    assert _CASES is not None
    spec, jobs, pol, seed = _CASES[k]
    res = Engine(spec, jobs, pol, seed).run()
    res.decide_times = array("d")  # not sent back: a sweep reports CPU seconds per run
    res.decide_queues = array("i")
    return res


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
        "peak_rss_mib": peak_rss_mib(),
        "policies": per,
    }


def peak_rss_mib() -> float:
    """Peak resident memory so far, this process or a finished worker, in MiB."""
    return round(_peak_rss_kib() / 1024, 1)


def _peak_rss_kib() -> int:
    """Peak resident memory of this process or, if larger, of any finished child (a worker)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children)
