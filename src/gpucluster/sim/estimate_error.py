"""How good the start estimates a live head shows are, measured on a replayed trace (issue 24).

At each job's submit the simulator plans as the head does; this probe then asks the head's own
estimate replay (core/estimate.py) for the new job's start twice: as the head did before issue
24 (every job runs to its time limit: the baseline) and with run times predicted from the jobs
finished so far in the replay (core/runtime_predict.py, fed as the head's store would feed it).
When the job really starts, both errors (estimate - real start) are kept, and whether the start
fell inside the 80% interval the head would have shown (core/start_interval.py, calibrated on the
estimates of jobs that started before). metrics.json and the report give the median absolute
error of each, side by side, and the interval's coverage.

Why only jobs that wait: a job started by the very plan that saw it arrive is never shown an
estimate (the head says "running"); counting those as zero errors would flatter both. They are
counted apart (`started_at_once`).

Cost: opt-in (`gpucluster simulate --estimates`), nothing when off. Per measured submit it
replays the queue up to the new job only (the part of the line behind it cannot change its
estimate) twice, and predicts run times only for the jobs that replay touches; on a
long trace with a long queue that is far more than the run itself, so `--estimate-every N`
measures every Nth submit only (by job id: the same jobs for every policy and seed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpucluster.core.estimate import estimate_starts
from gpucluster.core.policy import Policy
from gpucluster.core.runtime_predict import FinishedRun, JobShape, RuntimePredictor
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.start_interval import Interval, WaitCalibration
from gpucluster.core.types import Plan
from gpucluster.sim.learned import trace_shape
from gpucluster.sim.workload import TraceJob

H = 3600.0


@dataclass
class EstimateErrors:
    """What a run carries back (small and picklable: forked runs send it to the parent)."""

    baseline: list[float] = field(default_factory=list)  # estimate - real start, time limits only
    predicted: list[float] = field(default_factory=list)  # the same, with predicted run times
    learned: int = 0  # estimates whose own job had a learned (not time-limit) prediction
    started_at_once: int = 0  # started by the plan that saw them arrive: never shown an estimate
    not_estimated: int = 0  # waited, but no estimate (no node set fits, or never started)
    covered: int = 0  # real starts inside the 80% interval (core/start_interval.py)
    widths: list[float] = field(default_factory=list)  # each interval's high - low


class StartEstimateProbe:
    """Fed by the engine: arrivals, each plan, first starts and finished runs."""

    def __init__(self, models: set[str], every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"estimate every must be at least 1 (every submit), got {every}")
        self.every = every  # measure every Nth submit (by job id): bounds the cost on long traces
        self.predictor = RuntimePredictor()
        self.calibration = WaitCalibration()
        self._intervals: dict[int, Interval] = {}
        self._only_model = next(iter(models)) if len(models) == 1 else ""
        self._pending: dict[int, TraceJob] = {}  # arrived, not yet seen by a plan
        self._estimates: dict[int, tuple[float, float, float]] = {}  # job -> (baseline, predicted, when)
        self.errors = EstimateErrors()

    def shape(self, trace: TraceJob, model: str = "") -> JobShape:
        return trace_shape(trace, model, self._only_model)

    @property
    def waiting_for_plan(self) -> bool:
        """Jobs arrived that no plan has seen yet."""
        return bool(self._pending)

    def arrived(self, trace: TraceJob) -> None:
        if trace.job_id % self.every == 0:
            self._pending[trace.job_id] = trace

    def planned(
        self,
        snap: Snapshot,
        policy: Policy,
        now: float,
        plan: Plan,
        trace_of: Callable[[int], TraceJob | None],
        model_of: Callable[[int], str],
    ) -> None:
        """After a plan: estimate the jobs that arrived since the last one and wait."""
        if not self._pending:
            return
        for s in plan.starts:
            if self._pending.pop(s.job_id, None) is not None:
                self.errors.started_at_once += 1
        if not self._pending:
            return
        last = -1
        new: list[int] = []
        for i, job_id in enumerate(plan.waiting):
            if job_id in self._pending:
                new.append(job_id)
                last = i
        if not new:
            return  # gated (dependencies): estimated when they reach the queue
        ahead = list(plan.waiting)[: last + 1]
        default = policy.default_time_limit_s
        shapes = self._shapes(snap, now, ahead, plan, trace_of, model_of)
        runs = {
            j: self.predictor.expected_total(shape, elapsed, default) if elapsed > 0 else self._predict(shape, default)
            for j, (shape, elapsed) in shapes.items()
        }
        base = estimate_starts(snap, policy, now, plan, limit=last + 1)
        pred = estimate_starts(snap, policy, now, plan, limit=last + 1, runs=runs)
        for job_id in new:
            trace = self._pending.pop(job_id)
            b, p = base.get(job_id), pred.get(job_id)
            if b is None or p is None or b.start is None or p.start is None:
                self.errors.not_estimated += 1
                continue
            self._estimates[job_id] = (b.start, p.start, now)
            interval = self.calibration.interval(now, p.start)
            if interval is not None:
                self._intervals[job_id] = interval
            if self.predictor.predict(self.shape(trace), default).learned:
                self.errors.learned += 1

    def _predict(self, shape: JobShape, default: float) -> float:
        return self.predictor.predict(shape, default).run_s

    def _shapes(
        self,
        snap: Snapshot,
        now: float,
        ahead: list[int],
        plan: Plan,
        trace_of: Callable[[int], TraceJob | None],
        model_of: Callable[[int], str],
    ) -> dict[int, tuple[JobShape, float]]:
        """The jobs the replay up to the new ones touches, each with how long it has run."""
        out: dict[int, tuple[JobShape, float]] = {}
        for job_id in (*ahead, *(s.job_id for s in plan.starts)):
            trace = trace_of(job_id)
            if trace is not None:
                out[job_id] = (self.shape(trace), 0.0)
        for r in snap.running:
            trace = trace_of(r.job_id)
            if trace is not None:
                out[r.job_id] = (self.shape(trace, model_of(r.job_id)), max(0.0, now - r.started_at))
        return out

    def started(self, job_id: int, now: float) -> None:
        """A job's first start: the errors of its estimates, if it had some."""
        est = self._estimates.pop(job_id, None)
        if est is not None:
            self.errors.baseline.append(est[0] - now)
            self.errors.predicted.append(est[1] - now)
            self.calibration.observe(est[2], est[1], now)
        interval = self._intervals.pop(job_id, None)
        if interval is not None:
            self.errors.widths.append(interval.high - interval.low)
            if interval.low - 1e-6 <= now <= interval.high + 1e-6:
                self.errors.covered += 1

    def finished(self, trace: TraceJob, run_s: float, model: str) -> None:
        """A run that tells how long the work takes (success, or stopped at its limit)."""
        self.predictor.add(FinishedRun(self.shape(trace, model), run_s))

    def close(self) -> EstimateErrors:
        self.errors.not_estimated += len(self._estimates) + len(self._pending)  # never started
        self._estimates.clear()
        self._intervals.clear()
        self._pending.clear()
        return self.errors


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    if n == 0:
        return float("nan")
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(p / 100 * len(v)) - 1))] if v else float("nan")  # nearest rank


def estimate_metrics(errors: EstimateErrors) -> dict[str, Any]:
    """metrics.json's `start_estimates`: each estimate's absolute error in hours (median, mean,
    p90) and its signed median (positive: the estimate was late, the job started earlier), for
    the time-limit-only baseline and the prediction, and the ratio of the medians."""

    def side(errs: list[float]) -> dict[str, float]:
        absolute = [abs(e) for e in errs]
        return {
            "median_abs_error_h": round(_median(absolute) / H, 4) + 0.0,
            "mean_abs_error_h": round(sum(absolute) / len(absolute) / H, 4) + 0.0 if absolute else float("nan"),
            "p90_abs_error_h": round(_pct(absolute, 90) / H, 4) + 0.0,
            "median_error_h": round(_median(errs) / H, 4) + 0.0,
        }

    base, pred = side(errors.baseline), side(errors.predicted)
    ratio = (
        round(pred["median_abs_error_h"] / base["median_abs_error_h"], 4)
        if errors.baseline and base["median_abs_error_h"] > 0
        else None
    )
    return {
        "jobs_estimated": len(errors.baseline),
        "with_learned_run_time": errors.learned,
        "started_at_once": errors.started_at_once,
        "not_estimated": errors.not_estimated,
        "time_limit_only": base,
        "predicted": pred,
        "median_abs_error_ratio": ratio,  # predicted / time-limit-only; the goal is <= 0.5
        # the 80% interval (core/start_interval.py): the share of real starts inside it (the
        # goal: 0.75-0.85) and its median width; jobs estimated before the calibration had
        # enough history get none
        "interval_coverage": round(errors.covered / len(errors.widths), 4) if errors.widths else None,
        "interval_median_width_h": round(_median(errors.widths) / H, 4) + 0.0 if errors.widths else None,
    }


def add_estimate_metrics(per_policy: list[dict[str, Any]], results: list[Any]) -> None:
    """Each policy's metrics get `start_estimates` when its run measured them."""
    for m, res in zip(per_policy, results, strict=True):
        if res.start_estimates is not None:
            m["start_estimates"] = estimate_metrics(res.start_estimates)


def estimate_section(metrics: dict[str, Any]) -> str:
    """The report's table for one policy (empty when the run did not measure estimates)."""
    m = metrics.get("start_estimates")
    if not m:
        return ""
    rows = []
    for label, key in (("time limits only (before)", "time_limit_only"), ("predicted run times", "predicted")):
        s = m[key]
        rows.append(
            f"<tr><td>{label}</td><td>{s['median_abs_error_h']:.2f}</td><td>{s['mean_abs_error_h']:.2f}</td>"
            f"<td>{s['p90_abs_error_h']:.2f}</td><td>{s['median_error_h']:+.2f}</td></tr>"
        )
    ratio, coverage = m["median_abs_error_ratio"], m["interval_coverage"]
    return (
        "<h3>Start estimates (what a live head would have shown at each submit)</h3>"
        f"<p class=note>{m['jobs_estimated']:,} jobs waited and got an estimate "
        f"({m['with_learned_run_time']:,} of them with a learned run time); {m['started_at_once']:,} started at once; "
        f"median absolute error ratio, predicted / time limits only: "
        f"{'-' if ratio is None else f'{ratio:.2f}'}; real starts inside the 80% interval: "
        f"{'-' if coverage is None else f'{coverage:.0%}'}</p>"
        "<table><tr><th>estimate</th><th>median |error| h</th><th>mean |error| h</th><th>p90 |error| h</th>"
        "<th>median error h (+: late)</th></tr>" + "".join(rows) + "</table>"
    )
