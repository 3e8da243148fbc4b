"""The in-memory form of a workload: every trace format is read into these.

Why NamedTuples: a 1,000,000-job trace is held in memory while each policy replays it; a
NamedTuple is immutable, costs ~120 bytes a job and is built ~5x faster than a frozen
dataclass, which matters when reading a million rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from gpucluster.core.selection import Selection
from gpucluster.core.types import Dependency, Priority
from gpucluster.sim.spec import CheckpointRule

MAX_ROW_ERRORS_KEPT = 1000


class RowGates(NamedTuple):
    """A native row's array and dependencies as written, in the trace's own ids (`id`); read_trace
    expands the array into elements and turns the ids into job ids (`TraceJob.after`)."""

    trace_id: int | None  # the row's `id`, what other rows' dependencies name
    indices: tuple[int, ...] | None  # an array's indices; None: one job
    throttle: int | None  # an array's most elements at once
    after: tuple[tuple[str, int], ...]  # (kind, trace id): after, afterok, afternotok, afterany
    corr: int | None  # aftercorr: element i waits for element i of this array (afterok)
    hold_until: float | None = None  # hold: true: released at this time (trace time base); inf: never


class RawJob(NamedTuple):
    """One trace row as read: fields the format lacks are None until fill.py fills them."""

    line: int
    submit: float  # seconds, in the trace's own time base
    gpus: float
    duration: float | None = None  # seconds on the trace's hardware (relative speed 1.0)
    team: str | None = None
    priority: Priority | None = None
    gpu_types: tuple[str, ...] | None = None  # None: not recorded; (): any model
    name: str | None = None
    time_limit: float | None = None
    checkpoint: CheckpointRule | str = "spec"  # "spec": the cluster spec's rule
    application: str | None = None  # pollux: decides the run time (fill.py)
    gpu_memory_mb: int | None = None
    min_gpu_memory_mb: int | None = None
    nodes: int | None = None
    min_gpus: int | None = None  # elastic: may start on as few whole GPUs
    max_restarts: int | None = None  # None: the cluster spec's failures.max_restarts
    user: str | None = None  # who submitted it (Philly's optional `user` column; native `user`)
    selection: Selection | None = None  # nodelist, exclude, constraint, exclusive (native rows)
    gates: RowGates | None = None  # native rows: an array, dependencies
    cpus: float | None = None  # CPU cores in all (native `cpus`); None: the policy's per-GPU default
    mem_mb: int | None = None  # host memory in all, MiB (native `mem`); None: likewise


class TraceJob(NamedTuple):
    """A job ready to simulate. `job_id` is 1..N in submission order, as the live head numbers them."""

    job_id: int
    submit: float  # seconds from the first submission
    duration: float  # seconds of work at relative speed 1.0
    gpus: float  # whole GPUs, or a share of one GPU (below 1)
    team: str
    priority: Priority
    gpu_types: tuple[str, ...]  # acceptable models, most preferred first; () = any
    name: str
    line: int
    time_limit: float | None
    checkpoint: CheckpointRule | str  # "spec" or an explicit rule
    gpu_memory_mb: int | None = None
    min_gpu_memory_mb: int | None = None
    nodes: int | None = None
    min_gpus: int | None = None  # elastic: may start on as few whole GPUs
    max_restarts: int | None = None  # None: the cluster spec's failures.max_restarts
    user: str = ""  # "" when the trace names none: per-user limits (core/limits.py) do not apply
    selection: Selection | None = None  # which nodes it may use, whether alone (core/selection.py)
    gates: RowGates | None = None  # as read; None once read_trace has resolved it into the fields below
    # An array's element: its array's id (the first element's job id) and index, the array's
    # throttle; dependencies on earlier jobs (core/eligibility.py applies them, as on the head).
    array_id: int | None = None
    array_index: int | None = None
    throttle: int | None = None
    after: tuple[Dependency, ...] = ()
    # Held by its user (submit --hold) until this time, seconds from the first submission, when
    # the trace says it was released (`release_time`); inf: never released. None: not held.
    hold_until: float | None = None
    cpus: float | None = None  # CPU cores in all; None: the policy's per-GPU default (resources:)
    mem_mb: int | None = None  # host memory in all, MiB; None: likewise


@dataclass(frozen=True)
class RowError:
    line: int
    message: str


@dataclass
class Trace:
    """A parsed trace: the jobs, and every row that could not be used, with why."""

    path: str
    format: str
    rows: int = 0
    jobs: list[TraceJob] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)  # the first MAX_ROW_ERRORS_KEPT
    error_count: int = 0

    def add_error(self, line: int, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ROW_ERRORS_KEPT:
            self.errors.append(RowError(line, message))
