"""`gpucluster update`: what a change to a job's spec becomes, checked by the submit's own rules.

Why apart from the service: the merge (a change laid over the stored spec, then validated as one
whole `JobSpec`), the sentence each change leaves in the job's events and the audit log, and the
begin/backoff arithmetic are pure and tested alone; `head/service.py` only applies them.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from gpucluster.core.types import JobRequest
from gpucluster.durations import format_duration
from gpucluster.errors import GpuclusterError
from gpucluster.models import JobSpec, JobUpdate

# The fields a running job may still change: its time limit (Slurm: scontrol update TimeLimit).
RUNNING_FIELDS = frozenset({"time_limit"})


class FieldError(ValueError, GpuclusterError):
    """A change that the submit's rules refuse: which field, and what is wrong with it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def changed_fields(change: JobUpdate) -> dict[str, Any]:
    """The fields a change names (null included: back to the submit default), in the model's
    order, so that the sentence it leaves does not depend on the order they were sent in."""
    return {k: getattr(change, k) for k in type(change).model_fields if k in change.model_fields_set}


def merged_spec(old: JobSpec, change: JobUpdate) -> JobSpec:
    """`old` with `change` laid over it, validated as a submit would be (FieldError if not).

    A new `gpus` replaces the old range too (`gpus: 4..8` sets both ends; a number, none)."""
    fields = changed_fields(change)
    if not fields:
        raise FieldError("body", "nothing to change; give e.g. priority, time_limit, gpus, gpu_type, name or begin")
    data = old.model_dump(exclude_unset=True)
    if "gpus" in fields:
        data.pop("min_gpus", None)
    for key, value in fields.items():
        if value is None:
            data.pop(key, None)  # back to the submit default
        else:
            data[key] = value
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if not isinstance(p, int)) or next(iter(fields))
        raise FieldError(field, str(first["msg"]).removeprefix("Value error, ")) from None


def _show(key: str, value: object) -> str:
    if value is None:
        return "none"
    if key == "time_limit" and isinstance(value, int | float):
        return format_duration(float(value))
    if key == "begin" and isinstance(value, int | float):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    if key == "gpus" and isinstance(value, float) and value == int(value):
        return str(int(value))
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def describe_changes(old: JobSpec, new: JobSpec, fields: dict[str, Any]) -> list[str]:
    """'priority normal -> high' for each named field whose value changed, in the order given."""
    out = []
    for key in fields:
        before, after = getattr(old, key), getattr(new, key)
        if key == "gpus":
            before, after = old.gpus_label, new.gpus_label
        if before != after:
            out.append(f"{key.replace('_', ' ')} {_show(key, before)} -> {_show(key, after)}")
    return out


def not_before_after(old: JobSpec, new: JobSpec, not_before: float | None, now: float) -> float | None:
    """A queued job's `not_before` once its begin time changed.

    `not_before` is either the begin time (up to it) or a restart's backoff (past the begin time):
    a backoff is kept, the begin time is replaced, whichever ends later wins."""
    backoff = not_before if not_before is not None and (old.begin is None or not_before > old.begin) else None
    begin = new.begin if new.begin is not None and new.begin > now else None
    candidates = [t for t in (backoff, begin) if t is not None and t > now]
    return max(candidates) if candidates else None


def may_set_running_limit(old: JobSpec, new: JobSpec, cluster_admin: bool) -> str | None:
    """Why a running job's new time limit is refused for this caller, or None if allowed.

    As Slurm: only a cluster admin may extend a running job's limit; its owner and team admins
    may shorten it (the queue and other teams' estimates were planned on the old one)."""
    if cluster_admin:
        return None
    old_limit = old.time_limit if isinstance(old.time_limit, float) else None
    new_limit = new.time_limit if isinstance(new.time_limit, float) else None
    if new_limit is not None and (old_limit is None or new_limit <= old_limit):
        return None
    was = format_duration(old_limit) if old_limit is not None else "none"
    return (
        f"time_limit: a running job's time limit may only be shortened (it is {was}); "
        "only a cluster admin may extend it"
    )


_PLANNED_FIELDS = (
    "gpus",
    "gpu_types",
    "priority",
    "gpu_memory_mb",
    "min_gpu_memory_mb",
    "time_limit_s",
    "nodes",
    "min_gpus",
    "not_before",
    "begin",
    "cpus",
    "mem_mb",
)


def same_request(planned: JobRequest, now: JobRequest) -> bool:
    """Whether a job's request is still the one a plan was made for, in all the scheduler reads
    (`Head._start` drops a start whose job was updated between the snapshot and the start)."""
    return all(getattr(planned, f) == getattr(now, f) for f in _PLANNED_FIELDS)
