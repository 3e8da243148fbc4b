"""Frozen value types shared by the core, the store, the head and the simulator.

They carry no behaviour that needs I/O; the wire format (pydantic) lives in `gpucluster.models`
so the core stays importable without FastAPI or pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING

from gpucluster.core.lazy import Lazies
from gpucluster.core.reasons import NO_FACTS, WaitFacts, WaitReason
from gpucluster.core.selection import Selection
from gpucluster.core.states import JobState


class Priority(IntEnum):
    """Priority classes; a larger value is scheduled first. CRITICAL is never preempted.

    SERVING is the class of service replicas (issue 23): above batch work, so a scale-up of a
    model service goes first in line and may preempt training, and below CRITICAL. Plain jobs
    may not ask for it (`auth/grants.refuse_serving`); what it may preempt is the policy's
    (`preemption.serving_victims`). Stored as these integers: 0014 moved critical from 3 to 4.
    """

    LOW = 0
    NORMAL = 1
    HIGH = 2
    SERVING = 3
    CRITICAL = 4

    @classmethod
    def parse(cls, name: str) -> Priority:
        try:
            return cls[name.upper()]
        except KeyError:
            allowed = ", ".join(p.name.lower() for p in cls)
            raise ValueError(f"unknown priority {name!r}; allowed: {allowed}") from None

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    model: str
    memory_mb: int
    uuid: str
    # GPUs sharing a domain talk fastest (an NVLink/NVSwitch island or a PCIe switch).
    domain: str | None = None


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]
    # What jobs may select it by (`--constraint`): flags (`ib`) and `key=value` pairs (`rack=r1`).
    labels: frozenset[str] = frozenset()
    # Host resources jobs may ask for beside GPUs (`--cpus`, `--mem`): CPU cores and host memory
    # in MiB. None: not accounted on this node (any request fits), so nodes recorded before
    # these were known, and trace nodes without them, place exactly as before.
    cpus: float | None = None
    memory_mb: int | None = None

    def gpu_models(self) -> frozenset[str]:
        return frozenset(g.model for g in self.gpus)


@dataclass(frozen=True, slots=True)
class Drain:
    """Why a node takes no new job, and until when: a user's drain may say when it ends
    (`drain --until`); a health drain, a down node or a drain without an end has `until` None."""

    reason: str
    until: float | None = None


@dataclass(frozen=True, slots=True)
class NodeSlice:
    """The GPUs one job holds on one node; `share` < 1 means a fraction of one GPU. A CPU-only
    job's slice has no GPU indices: only its CPUs and host memory."""

    node: str
    gpu_indices: tuple[int, ...]
    share: float = 1.0
    memory_mb: int | None = None  # GPU memory granted per GPU, for a fractional share
    # Host resources the job holds on this node (its request split over its nodes); 0: none.
    cpus: float = 0.0
    host_memory_mb: int = 0


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a job runs: one slice per node."""

    slices: tuple[NodeSlice, ...]

    @property
    def gpu_count(self) -> float:
        return sum(len(s.gpu_indices) * s.share for s in self.slices)

    def gpu_keys(self) -> frozenset[tuple[str, int]]:
        return frozenset((s.node, i) for s in self.slices for i in s.gpu_indices)


class DependencyKind(StrEnum):
    """Slurm's dependency kinds: start once the target has started (`after`), ended well
    (`afterok`), ended badly (`afternotok`) or ended at all (`afterany`)."""

    AFTER = "after"
    AFTEROK = "afterok"
    AFTERNOTOK = "afternotok"
    AFTERANY = "afterany"


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: DependencyKind
    job_id: int  # a job, or with `array` the id of an array (all its elements)
    array: bool = False


class _JobLazies(Lazies):
    """The slots of a `JobRequest`'s values worked out on first read (core/lazy.py)."""

    __slots__ = ("demand", "host", "need")

    if TYPE_CHECKING:
        host: bool
        demand: tuple[object, ...]
        need: tuple[object, ...]


@dataclass(frozen=True, slots=True)
class JobRequest(_JobLazies):
    """What the scheduler needs to know about a queued job: its demand and its place in line.

    Slotted, as every type here: see core/lazy.py for why, and for `host`, `demand` and `need`,
    each worked out by its `_make_` method on first read and kept."""

    job_id: int
    gpus: float  # whole GPUs (1 or more), a fraction of one GPU (below 1), or 0: CPU-only
    gpu_types: tuple[str, ...] = ()  # acceptable models, most preferred first; () = any
    priority: Priority = Priority.NORMAL
    submitted_at: float = 0.0
    team: str = "default"
    gpu_memory_mb: int | None = None  # a share of one GPU by memory
    min_gpu_memory_mb: int | None = None  # only GPUs with at least this much memory
    time_limit_s: float | None = None
    nodes: int | None = None  # exactly this many nodes, GPUs split evenly
    # When it last entered the queue (a preempted job re-enters): starvation is measured from
    # here, so a job that just ran cannot age past the job that preempted it.
    queued_at: float | None = None
    # Elastic: the job may start on as few as `min_gpus` whole GPUs when `gpus` are not free;
    # the scheduler starts it at the largest size that fits now.
    min_gpus: int | None = None
    # Not to be considered before this time (a restart waiting out its backoff, or `begin`).
    not_before: float | None = None
    # The submitter's begin time (sbatch --begin): a `not_before` up to it is that, not a backoff.
    begin: float | None = None
    # Eligibility (core/eligibility.py), applied before the scheduler sees the queue: a held job,
    # one whose dependencies are unmet, or an array element over its array's throttle waits.
    held: bool = False
    after: tuple[Dependency, ...] = ()
    array_id: int | None = None
    # Who submitted it ("" when unknown: a job from before identities, a trace without users);
    # per-user and per-class limits (core/limits.py) count it against this user.
    user: str = ""
    # Which nodes it may run on and whether it holds them alone (core/selection.py); None: any, shared.
    selection: Selection | None = None
    # Its container image: where it already is breaks ties between equally good nodes
    # (core/image_affinity.py). Not in `demand`: it changes which node, never whether it starts.
    image: str | None = None
    # CPU cores and host memory (MiB) in all, split over its nodes like its GPUs; 0: none
    # asked (the policy's per-GPU defaults are applied before the core sees the request).
    cpus: float = 0.0
    mem_mb: int = 0

    def _make_host(self) -> bool:
        """Whether it asks for CPUs or host memory: placement then checks them per node."""
        return self.cpus > 0 or self.mem_mb > 0

    @property
    def fractional(self) -> bool:
        return self.gpus < 1 or self.gpu_memory_mb is not None

    @property
    def cpu_only(self) -> bool:
        """Asks for no GPU, only CPUs and/or host memory: placed by those alone
        (`Capacity.place_host_only`), on any node, GPUs or not."""
        return self.gpus == 0

    def _make_demand(self) -> tuple[object, ...]:
        """Every field a scheduling cycle reads to decide what it can do with the job, but its
        id, age, queue entry and backoff (which decide *when* it is considered): two jobs with
        equal demands meet the same fate in the same cycle state (`scheduler._Cycle.run`).
        Cached on the object: a queued job is asked each cycle, and it never changes.

        The user is not part of it, though limits depend on the user: they are applied before
        the cycle (core/limits.py), which admits a user's jobs only while together they fit
        the user's room, so every job the cycle sees may start whoever its user is, and two
        users' equal jobs do meet the same fate there. A job at its user's limit never reaches
        the cycle, so no answer of the cycle is shared between users wrongly."""
        return (self.team, *self.need)

    def _make_need(self) -> tuple[object, ...]:
        """`demand` but the team: what the job asks of the cluster. Without quotas or borrowing
        limits the team takes no part in what a cycle can do with a job (only in its place in
        line), so `scheduler._Cycle.run` may answer jobs of every team by it."""
        return (
            self.gpus,
            self.gpu_types,
            self.priority,
            self.gpu_memory_mb,
            self.min_gpu_memory_mb,
            self.time_limit_s,
            self.nodes,
            self.min_gpus,
            self.selection,
            self.cpus,
            self.mem_mb,
        )


@dataclass(frozen=True, slots=True)
class RunningJob:
    job_id: int
    allocation: Allocation
    team: str = "default"
    priority: Priority = Priority.NORMAL
    started_at: float = 0.0
    time_limit_s: float | None = None
    last_checkpoint_at: float | None = None
    stopping: bool = False  # a stop (cancel, limit, preemption) is under way: its GPUs free soon
    # Elastic: the most GPUs it may grow to (core/elastic.py); None for a job of one size.
    max_gpus: int | None = None
    # Elastic: the fewest GPUs it may run on; above it, preemption shrinks it (core/shrink.py).
    min_gpus: int | None = None
    user: str = ""  # who submitted it: per-user limits (core/limits.py) count its GPUs against them
    # Started with --exclusive: no other job may use its nodes (their other GPUs count as taken).
    exclusive: bool = False


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: int
    for_job: int
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a job waits: its reason and the numbers behind it (never a sentence: see
    core/reasons.py), and when it is expected to start where known."""

    reason: WaitReason
    facts: WaitFacts = NO_FACTS
    estimated_start: float | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """The scheduler's answer for one cycle: jobs to start, jobs to preempt, why others wait."""

    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    waiting: dict[int, Wait] = field(default_factory=dict)


__all__ = [
    "Allocation",
    "Dependency",
    "DependencyKind",
    "Gpu",
    "JobRequest",
    "JobState",
    "Node",
    "NodeSlice",
    "Plan",
    "Preemption",
    "Priority",
    "RunningJob",
    "Selection",
    "Start",
    "Wait",
]
