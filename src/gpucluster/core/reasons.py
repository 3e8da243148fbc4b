"""Why a job waits: a named reason (for programs) beside a sentence (for people)."""

from __future__ import annotations

from enum import StrEnum


class WaitReason(StrEnum):
    RESOURCES = "resources"  # not enough free GPUs of an acceptable kind
    RESERVED = "reserved"  # first in line: GPUs are being held for it
    BEHIND_RESERVATION = "behind_reservation"  # would delay the job first in line
    PREEMPTING = "preempting"  # lower-priority or borrowing jobs are being stopped for it
    QUOTA = "quota"  # its team is at its borrowing limit, or others' guaranteed GPUs are idle but protected
    NO_FIT = "no_fit"  # no node could ever host it as asked
    DRAINED = "drained"  # only drained (or unhealthy, or down) nodes could host it
    BACKOFF = "backoff"  # a restart after a failure, held back until its backoff has passed
    BEGIN = "begin"  # its submitter asked for it not to start before a time (--begin)
    BUDGET = "budget"  # its team has spent its budget for the period (held by the head's accountant)
    HELD = "held"  # held by its user (submit --hold, gpucluster hold) until released
    DEPENDENCY = "dependency"  # waits for other jobs to start or end (--after, --afterok, ...)
    THROTTLE = "throttle"  # its array already runs as many elements as its throttle allows
    # Limits (core/limits.py, `limits:` in the policy file): the job's user is at a limit.
    USER_GPUS = "user_gpus"  # its user runs as many GPUs as limits.per_user (or users.NAME) allows
    USER_GPU_HOURS = "user_gpu_hours"  # its user's running jobs hold the GPU-hours in flight allowed
    CLASS_GPUS = "class_gpus"  # its user's jobs of its class run as many GPUs as limits.per_class allows
    CLASS_GPU_HOURS = "class_gpu_hours"  # likewise for GPU-hours in flight of its class
    # Host resources (`--cpus`, `--mem`): enough GPUs are free on some node, but no such node has
    # the CPU cores (or the host memory) the job asks for left.
    CPUS = "cpus"
    MEMORY = "memory"
