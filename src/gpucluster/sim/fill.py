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
- time limit: the trace's (native), else `trace_fill.time_limit`: none (default), or a factor
  such as `2x` = twice the recorded run time. Backfill plans with limits; like on the live head,
  an attempt that outlives its limit is stopped and the job fails.
- run time (pollux, which records none): Pollux's own workload generator picked each
  application from the GPU-time of a Philly job: cifar10 and ncf < 1 GPU-hour, deepspeech2 and
  bert 1-10, yolov3 10-100, imagenet 100-1000. The rule draws a GPU-time log-uniformly from the
  application's range (from 60 GPU-seconds) and divides it by the job's GPUs.
- checkpoint interval: the trace's (native `checkpoint_interval`), else the spec's `checkpoints`.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from itertools import accumulate

from gpucluster.core.types import Priority
from gpucluster.sim.spec import ClusterSpec
from gpucluster.sim.workload import RawJob, TraceJob

HOUR = 3600.0
# application -> (low, high) GPU-seconds, from petuum/adaptdl simulator/workload.py.
POLLUX_GPU_TIME = {
    "cifar10": (60.0, 1 * HOUR),
    "ncf": (60.0, 1 * HOUR),
    "deepspeech2": (1 * HOUR, 10 * HOUR),
    "bert": (1 * HOUR, 10 * HOUR),
    "yolov3": (10 * HOUR, 100 * HOUR),
    "imagenet": (100 * HOUR, 1000 * HOUR),
}


class FillError(ValueError):
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
