"""How long a run takes, and what survives an interruption: pure functions of numbers.

A job's work is measured in seconds at relative speed 1.0 (the hardware the trace was recorded
on). One attempt on an allocation runs at `rate` = speed of its slowest GPU model / all-reduce
slowdown, and its wall time is laid out as

    [startup][T compute][C write][T compute][C write] ... [last compute]

where startup is the restart cost (0 for a first attempt), T the checkpoint interval and C the
checkpoint cost; no checkpoint is written at the very end. An interruption at elapsed time e keeps
the work up to the last completed checkpoint; a preemption writes one more checkpoint (costing C)
and keeps everything computed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from gpucluster.sim.spec import AllReduceModel, CheckpointRule

DAY_S = 86400.0


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): T = sqrt(2 C M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006), the higher-order optimum: sqrt(2CM)[1 + sqrt(C/2M)/3 + (C/2M)/9] - C, or M
    when C >= 2M (checkpointing then costs more than it saves)."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    r = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - cost_s


def checkpoint_interval(rule: CheckpointRule, gpus: float, gpu_failures_per_day: float, cost_s: float) -> float | None:
    """Seconds of compute between checkpoints for a job of `gpus` GPUs, or None for never.

    A job fails when any of its GPUs does, so its MTBF is 1 / (gpus x per-GPU rate)."""
    if rule is None or isinstance(rule, float | int):
        return None if rule is None else float(rule)
    if gpu_failures_per_day <= 0:
        return None  # nothing ever fails: an optimal job never checkpoints
    mtbf = DAY_S / (gpu_failures_per_day * gpus)
    if cost_s <= 0:
        return None
    return young_interval(cost_s, mtbf) if rule == "young" else daly_interval(cost_s, mtbf)


def allreduce_slowdown(model: AllReduceModel, gpus: int, nodes: int, nvlink_gbps: float, network_gbps: float) -> float:
    """Run-time factor (>= 1) for a job spread over `nodes` nodes.

    Each step all-reduces the gradients with a ring: 2(N-1)/N x size / bandwidth, bound by the
    slowest link. On one node that is NVLink; across nodes the network. The trace's run time is
    taken as the one-node run, so the factor is (step + ring over network) / (step + ring over NVLink).
    """
    if not model.enabled or nodes <= 1 or gpus <= 1:
        return 1.0
    bits = model.model_size_gb * 8.0
    ring = 2.0 * (gpus - 1) / gpus
    inter = ring * bits / network_gbps
    intra = ring * bits / nvlink_gbps
    return max(1.0, (model.step_time_s + inter) / (model.step_time_s + intra))


class Timeline(NamedTuple):
    total_s: float  # wall time of the attempt if nothing interrupts it
    checkpoints: int  # periodic checkpoints it writes


class Progress(NamedTuple):
    startup_s: float  # wall time spent restarting (loading the checkpoint)
    computed_s: float  # wall time of compute done
    saved_s: float  # of which protected by a completed checkpoint
    checkpoint_s: float  # wall time spent writing periodic checkpoints (completed ones)
    partial_write_s: float  # a checkpoint being written at the interruption (wasted)


def timeline(compute_s: float, interval_s: float | None, cost_s: float, startup_s: float) -> Timeline:
    if interval_s is None or compute_s <= interval_s:
        return Timeline(startup_s + compute_s, 0)
    n = max(0, math.ceil(compute_s / interval_s - 1e-9) - 1)
    return Timeline(startup_s + compute_s + n * cost_s, n)


def progress(elapsed_s: float, plan: Timeline, interval_s: float | None, cost_s: float, startup_s: float) -> Progress:
    """What an attempt laid out as `plan` has done after `elapsed_s` of wall time."""
    startup = min(elapsed_s, startup_s)
    run = elapsed_s - startup
    if run <= 0:
        return Progress(startup, 0.0, 0.0, 0.0, 0.0)
    if interval_s is None or plan.checkpoints == 0:
        return Progress(startup, run, 0.0, 0.0, 0.0)
    cycle = interval_s + cost_s
    k = min(plan.checkpoints, int(run // cycle))
    rest = run - k * cycle
    if k < plan.checkpoints and rest > interval_s:
        return Progress(startup, k * interval_s + interval_s, k * interval_s, k * cost_s, rest - interval_s)
    return Progress(startup, k * interval_s + rest, k * interval_s, k * cost_s, 0.0)
