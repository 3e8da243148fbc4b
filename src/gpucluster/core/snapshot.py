"""An immutable view of the cluster for one scheduling cycle.

Built once per cycle from the store (live) or from simulator state; the scheduler reads only this.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.rank_book import RankBook
from gpucluster.core.reasons import WaitFacts
from gpucluster.core.runtime_predict import RunDistribution
from gpucluster.core.types import Drain, JobRequest, Node, Plan, RunningJob


@dataclass(frozen=True)
class RunningByClass:
    """The running jobs of `running` by priority class, each class's split into those that
    have checkpointed and those that have not: {class: ({job id: job}, {job id: job})}. Kept
    by a caller across cycles from the events it applies (core/cluster_state.py), and true of
    `running`, the very tuple it goes with: `decide` reads it only for a snapshot whose
    `running` is that object (admission, which leaves out the jobs of drained nodes, makes
    another).

    Why: under attained-service preemption each cycle's victim pool (`scheduler._Cycle.
    _victim_pool`) looked at every running job to keep those of classes below the asker's,
    and of its own class those that checkpointed: on whole Philly ~60 of ~220, once a cycle.

    `recent`: the same checkpointed jobs by class and GPUs held (`Allocation.gpu_count`), each
    group oldest checkpoint first: {class: {GPUs: {job id: job}}} (None: not kept). Why: of the
    asker's own class a LAS victim must lose no more than the asker's allowance, GPUs x (now -
    checkpoint + restart cost), and on Philly ~33 of a class's checkpointed jobs were looked at
    per pool to keep ~0.4. Within a group that loss only grows as the checkpoint gets older, so
    the pool reads each group newest first and stops at the first job over the allowance."""

    running: tuple[RunningJob, ...]
    classes: Mapping[int, tuple[Mapping[int, RunningJob], Mapping[int, RunningJob]]]
    recent: Mapping[int, Mapping[float, dict[int, RunningJob]]] | None = None
    # The jobs of `running` that are stopping, in `running`'s order (None: not kept). Why: a
    # cycle that preempts looked for them with a pass over every running job (~1% of Philly).
    stopping: tuple[RunningJob, ...] | None = None


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...]
    queued: tuple[JobRequest, ...]
    usage: Mapping[str, float] = field(default_factory=dict)  # team -> decayed GPU-seconds
    # Optional: an index the caller keeps across cycles so free capacity is updated, not
    # rebuilt (see capacity_index.py); the plan is the same with or without it.
    capacity: CapacityIndex | None = field(default=None, compare=False, repr=False)
    # Optional, likewise: the queue sorted into lines across cycles (see queue_index.py).
    queue_index: QueueIndex | None = field(default=None, compare=False, repr=False)
    # Queued job -> the queued job it was preempted for (the head and the simulator keep this
    # from the plans they carry out). Such a job is considered only after that job, so it cannot
    # take back the GPUs it was stopped to free (a livelock: it did, round after round). Entries
    # whose preemptor is no longer queued (it started, or left) are ignored.
    preempted_for: Mapping[int, int] = field(default_factory=dict)
    # Admission (core/admission.py, applied by `decide`): nodes that take no new job (drained,
    # unhealthy, down), and teams whose queued jobs are held (a spent budget) -> why.
    drained: frozenset[str] = frozenset()
    holds: Mapping[str, WaitFacts] = field(default_factory=dict)
    # Per-user and per-class limits (core/limits.py, applied by `decide`) were applied already:
    # the queue holds no job beyond its user's limits (the head applies them where it builds
    # its snapshot, to record their waits; `decide` then does not apply them twice).
    limited: bool = False
    # Why each drained node is out and until when (a node in `drained` without an entry: no
    # reason given, no end). Admission keeps it, and moves the drained nodes to `unavailable`:
    # the plan never uses them, but a wait can name them and an estimate count from their end.
    drains: Mapping[str, Drain] = field(default_factory=dict)
    unavailable: tuple[Node, ...] = ()
    # Container image -> the nodes known to have it: a tie-breaker of placement only
    # (core/image_affinity.py); empty: no preference (the simulator, a cluster without images).
    images: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Job id -> GPU-seconds over its previous attempts (the current one is worked out from a
    # running job's start): read only when the policy orders by attained service (core/attained.py).
    attained: Mapping[int, float] = field(default_factory=dict)
    # Job id -> expected run seconds, read only by `ordering.mode: sjf` (core/attained.py): the
    # simulator's reference oracle fills it with true run times.
    expected_runtime: Mapping[int, float] = field(default_factory=dict)
    # Queued job id -> the run times of finished jobs like it (core/runtime_predict.py), read
    # only by `ordering.runtime_model: gittins` (core/gittins.py); a job not named has no history.
    runtime_dist: Mapping[int, RunDistribution] = field(default_factory=dict)
    # Optional: the Gittins ranks, and the team lines sorted by any ranks, kept across cycles
    # (see rank_book.py, queueing.RankedLines); the plan is the same with or without it.
    rank_book: RankBook | None = field(default=None, compare=False, repr=False)
    # Optional, likewise: the running jobs by class (`RunningByClass`); the plan is the same
    # with or without it.
    running_by_class: RunningByClass | None = field(default=None, compare=False, repr=False)

    def used_gpus(self) -> frozenset[tuple[str, int]]:
        used: set[tuple[str, int]] = set()
        for job in self.running:
            used |= job.allocation.gpu_keys()
        return frozenset(used)

    def free_gpus_by_node(self) -> dict[str, list[int]]:
        """Wholly free GPU indices per node, in index order."""
        used = self.used_gpus()
        return {node.name: [g.index for g in node.gpus if (node.name, g.index) not in used] for node in self.nodes}


def held_back_after(
    preempted_for: Mapping[int, int], plan: Plan, stopped: Iterable[int] | None = None
) -> dict[int, int]:
    """`Snapshot.preempted_for` once `plan` is carried out: its preemptions added (victim ->
    the job it was stopped for; `stopped`: only these victims, those whose stop was taken), and
    every entry whose preemptor the plan starts dropped (it holds nothing back any more).

    One rule for the head and the simulator: the simulator used to drop an entry only when its
    preemptor was not queued at the next plan, so a preemptor that started and came straight
    back (a failure) kept its victims behind it there, and not on the head."""
    taken = None if stopped is None else set(stopped)
    out = dict(preempted_for)
    out.update({p.job_id: p.for_job for p in plan.preemptions if taken is None or p.job_id in taken})
    if plan.starts and out:
        begun = {s.job_id for s in plan.starts}
        out = {v: p for v, p in out.items() if p not in begun}
    return out
