"""The documented, seeded rules that fill what a trace does not record.

Each rule draws from its own random stream, seeded from the run's seed and the rule's name, so
the same seed gives the same workload and one rule's draws never shift another's:

- team: the trace's (Philly's `cluster` column; native `team`), else `trace_fill.team`.
- user: the trace's (Philly's optional `user` column; native `user`), else none: per-user and
  per-class limits (the policy's `limits:`) then do not apply to the job, as no user is known.
- priority: the trace's (native), else drawn per job from `trace_fill.priority` (default: all
  normal).
- GPU type: the trace's (native), else `trace_fill.gpu_type`: `any` (the job takes any model;
  default), a model name, or `proportional` (drawn per job in proportion to each model's GPUs).
- time limit: the trace's (native), else `trace_fill.time_limit`: none (default), a factor
  such as `2x` = twice the recorded run time, or a range such as `2x..8x`: per job a factor
  drawn log-uniformly between the two, the limit (run time x factor) then rounded up to the
  next value people write (LIMIT_STEPS: 15m, 30m, 1h, 2h, 4h, 8h, 12h, 1d, 2d, 3d, 7d, 14d,
  then whole weeks), as users pad and round their limits. Why a range: with one factor every
  limit is exactly proportional to its run time, which no real limit is, and a run-time
  predictor would learn the factor and nothing else (issue 24's measurement uses the range).
  Backfill plans with limits; like on the live head, an attempt that outlives its limit is
  stopped and the job fails.
- run time (pollux, which records none): Pollux's own workload generator picked each
  application from the GPU-time of a Philly job: cifar10 and ncf < 1 GPU-hour, deepspeech2 and
  bert 1-10, yolov3 10-100, imagenet 100-1000. The rule draws a GPU-time log-uniformly from the
  application's range (from 60 GPU-seconds) and divides it by the job's GPUs.
- checkpoint interval: the trace's (native `checkpoint_interval`), else the spec's `checkpoints`.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right
from itertools import accumulate

from gpucluster.core.types import Priority
from gpucluster.errors import GpuclusterError
from gpucluster.sim.spec import ClusterSpec
from gpucluster.sim.workload import RawJob, TraceJob

HOUR = 3600.0
DAY = 24 * HOUR
# Time limits people write (`2x..8x` rounds up to the next), then whole weeks.
LIMIT_STEPS = (
    15 * 60.0,
    30 * 60.0,
    HOUR,
    2 * HOUR,
    4 * HOUR,
    8 * HOUR,
    12 * HOUR,
    DAY,
    2 * DAY,
    3 * DAY,
    7 * DAY,
    14 * DAY,
)
# application -> (low, high) GPU-seconds, from petuum/adaptdl simulator/workload.py.
POLLUX_GPU_TIME = {
    "cifar10": (60.0, 1 * HOUR),
    "ncf": (60.0, 1 * HOUR),
    "deepspeech2": (1 * HOUR, 10 * HOUR),
    "bert": (1 * HOUR, 10 * HOUR),
    "yolov3": (10 * HOUR, 100 * HOUR),
    "imagenet": (100 * HOUR, 1000 * HOUR),
}


class FillError(ValueError, GpuclusterError):
    """A row that no rule can complete (e.g. an unknown pollux application)."""


class Filler:
    def __init__(self, spec: ClusterSpec, seed: int) -> None:
        rules = spec.fill
        self._team = rules.team
        self._priorities = [p for p, _ in rules.priority_mix]
        self._priority_cum = list(accumulate(w for _, w in rules.priority_mix))
        self._priority_rng = random.Random(f"{seed}/fill/priority")
        self._gpu_type = rules.gpu_type
        self._limit_factor = rules.time_limit_factor
        self._limit_range = rules.time_limit_range
        self._limit_rng = random.Random(f"{seed}/fill/time_limit")
        by_model: dict[str, int] = {}
        for g in spec.groups:
            by_model[g.gpu_model] = by_model.get(g.gpu_model, 0) + g.gpus
        self._models = sorted(by_model)
        self._model_cum = list(accumulate(by_model[m] for m in self._models))
        self._type_rng = random.Random(f"{seed}/fill/gpu_type")
        self._duration_rng = random.Random(f"{seed}/fill/duration")

    def fill(self, raw: RawJob) -> TraceJob:
        duration = raw.duration if raw.duration is not None else self._pollux_duration(raw)
        limit = raw.time_limit
        if limit is None and self._limit_factor is not None:
            limit = max(1.0, round(duration * self._limit_factor, 3))
        elif limit is None and self._limit_range is not None:
            limit = self._rounded_limit(duration, *self._limit_range)
        return TraceJob(
            job_id=0,
            submit=raw.submit,
            duration=duration,
            gpus=raw.gpus,
            team=raw.team or self._team,
            priority=raw.priority if raw.priority is not None else self._priority(),
            gpu_types=raw.gpu_types if raw.gpu_types is not None else self._types(),
            name=raw.name or f"line{raw.line}",
            line=raw.line,
            time_limit=limit,
            checkpoint=raw.checkpoint,
            gpu_memory_mb=raw.gpu_memory_mb,
            min_gpu_memory_mb=raw.min_gpu_memory_mb,
            nodes=raw.nodes,
            min_gpus=raw.min_gpus,
            max_restarts=raw.max_restarts,
            user=raw.user or "",
            selection=raw.selection,
            gates=raw.gates,
            cpus=raw.cpus,
            mem_mb=raw.mem_mb,
        )

    def _rounded_limit(self, duration: float, lo: float, hi: float) -> float:
        factor = math.exp(self._limit_rng.uniform(math.log(lo), math.log(hi)))
        want = max(1.0, duration * factor)
        i = bisect_left(LIMIT_STEPS, want)
        if i < len(LIMIT_STEPS):
            return LIMIT_STEPS[i]
        return math.ceil(want / (7 * DAY)) * 7 * DAY

    def _priority(self) -> Priority:
        if len(self._priorities) == 1:
            return self._priorities[0]
        x = self._priority_rng.random() * self._priority_cum[-1]
        return self._priorities[min(bisect_right(self._priority_cum, x), len(self._priorities) - 1)]

    def _types(self) -> tuple[str, ...]:
        if self._gpu_type is None:
            return ()
        if self._gpu_type != "proportional":
            return (self._gpu_type,)
        x = self._type_rng.random() * self._model_cum[-1]
        return (self._models[min(bisect_right(self._model_cum, x), len(self._models) - 1)],)

    def _pollux_duration(self, raw: RawJob) -> float:
        bounds = POLLUX_GPU_TIME.get(raw.application or "")
        if bounds is None:
            known = ", ".join(sorted(POLLUX_GPU_TIME))
            raise FillError(f"no run time and unknown application {raw.application!r}; known: {known}")
        lo, hi = bounds
        gpu_seconds = math.exp(self._duration_rng.uniform(math.log(lo), math.log(hi)))
        return round(gpu_seconds / max(raw.gpus, 1.0), 3)
