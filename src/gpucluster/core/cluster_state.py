"""The cluster as the scheduler sees it, kept from events (core/events.py) rather than rebuilt.

Why: the simulator always knew every arrival, start and end and kept its indexes incrementally
("told" capacity and queue indexes: core/capacity_index.py, core/queue_index.py), while the head
re-read and re-sorted its queue every cycle, so its cycle cost O(queued jobs) where the
simulator's cost O(changes). One object, applied the same events by either caller, keeps the
queue, the running jobs, the nodes, drains and holds, and tells the indexes what came and went.

Check mode (`check`): a fresh build from the source of truth (the head: the store) must equal the
state; a difference raises `StateMismatch` naming it, so a missed or wrong event is found where it
happens (tests and `gpucluster up --debug`), not as a wrong plan much later. The plan itself never
depends on the events being right: the indexes check what they are told against the queue and
running jobs handed to `decide` (by count) and fall back to a comparison.

Single-threaded: one caller applies events (the head's loop thread; others queue theirs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from operator import attrgetter
from typing import Any, cast

from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.events import (
    Checkpointed,
    Drained,
    Ended,
    Event,
    Held,
    NodeDown,
    NodeUp,
    PolicyChanged,
    Released,
    Started,
    StopRequested,
    Submitted,
    Undrained,
)
from gpucluster.core.policy import Policy
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.reasons import WaitFacts
from gpucluster.core.snapshot import RunningByClass
from gpucluster.core.types import Allocation, Drain, JobRequest, Node, RunningJob
from gpucluster.errors import GpuclusterError

_CHECKPOINT, _ID = attrgetter("last_checkpoint_at"), attrgetter("job_id")


def running_job(request: JobRequest, allocation: Allocation, started_at: float) -> RunningJob:
    """A running job as the core sees it, the one a `Started` carries; built once per start (the
    head's store reads the same back from the committed start)."""
    return RunningJob(
        job_id=request.job_id,
        allocation=allocation,
        team=request.team,
        priority=request.priority,
        started_at=started_at,
        time_limit_s=request.time_limit_s,
        max_gpus=int(request.gpus) if request.min_gpus is not None else None,  # elastic: may grow
        min_gpus=request.min_gpus,  # and shrink to this
        user=request.user,
        exclusive=request.selection is not None and request.selection.exclusive,
    )


def _by_checkpoint(group: dict[int, RunningJob], job: RunningJob, checkpoint: float) -> None:
    """`job` into a group of `RunningByClass.recent`, kept oldest checkpoint first. A job
    checkpointing now goes last, as it comes; one with an older checkpoint than the last (a
    stop re-sends a job with its checkpoint, and a head may apply events out of time order)
    sorts the group again: rare, and a few dozen jobs."""
    last = next(reversed(group.values()), None)
    group[job.job_id] = job
    if last is not None and checkpoint < cast(float, last.last_checkpoint_at):
        ordered = sorted(group.values(), key=_CHECKPOINT)
        group.clear()
        group.update(zip(map(_ID, ordered), ordered, strict=True))


class StateMismatch(AssertionError, GpuclusterError):
    """The event-fed state differs from a fresh build: an event was missed or wrong."""


class ClusterState:
    def __init__(self, keeps_running: bool = True) -> None:
        # False: the caller reads its running jobs elsewhere, so `Started` only takes the job out
        # of the queue and running jobs are not compared (a queue-only check, tools).
        self.keeps_running = keeps_running
        self.queued: dict[int, JobRequest] = {}  # in the order they entered
        # The queued jobs eligibility may keep back (core/eligibility.py: held by their user,
        # waiting on another job, an array element under its throttle): with none, a cycle
        # skips eligibility's pass over the whole queue (issue 18: 0.3 ms a cycle at 3,000 queued).
        self.gated: set[int] = set()
        self.running: dict[int, RunningJob] = {}
        self.nodes: dict[str, Node] = {}
        # Drained nodes, and the drains among them that say why and until when: the snapshot's
        # `drained` and `drains`. Kept by name, up or down (NodeDown leaves a drain alone).
        self.drained: set[str] = set()
        self.drains: dict[str, Drain] = {}
        self.holds: dict[str, WaitFacts] = {}  # team -> why its queued jobs are held
        self.policy: Policy | None = None
        self.queue_index = QueueIndex(told=True)
        self.capacity = CapacityIndex(told=True)
        self.applied = 0  # events applied: for tests and stats
        # `queued_jobs` and `running_jobs` as last made; None: changed since (see there).
        self._queued_jobs: tuple[JobRequest, ...] | None = None
        self._running_jobs: tuple[RunningJob, ...] | None = None
        # The running jobs by class, checkpointed or not (`running_by_class`), kept by `apply`.
        self._by_class: dict[int, tuple[dict[int, RunningJob], dict[int, RunningJob]]] = {}
        # ... and the checkpointed ones by class and GPUs, oldest checkpoint first (`RunningByClass.recent`).
        self._recent: dict[int, dict[float, dict[int, RunningJob]]] = {}
        # ... and the stopping ones (`RunningByClass.stopping`): by id, each running job's place
        # in `running` (its first start's turn), and the tuple as last made (None: changed since).
        self._stopping: dict[int, RunningJob] = {}
        self._place: dict[int, int] = {}
        self._turns = 0
        self._stopping_jobs: tuple[RunningJob, ...] | None = ()

    def queued_jobs(self) -> tuple[JobRequest, ...]:
        """The queued jobs, in the order they entered (a snapshot's `queued`): the same tuple
        until an event changes the queue. Why: each cycle handed `decide` new tuples of the
        whole queue and of every running job, though most events change one of the two (an
        arrival the queue, an end the running jobs): ~1% of whole Philly. Exact only while
        `queued` and `running` change by `apply` alone, as every caller's do."""
        jobs = self._queued_jobs
        if jobs is None:
            jobs = self._queued_jobs = tuple(self.queued.values())
        return jobs

    def running_jobs(self) -> tuple[RunningJob, ...]:
        """The running jobs (a snapshot's `running`), as `queued_jobs` is the queue."""
        jobs = self._running_jobs
        if jobs is None:
            jobs = self._running_jobs = tuple(self.running.values())
        return jobs

    def running_by_class(self, running: tuple[RunningJob, ...] | None = None) -> RunningByClass:
        """`running_jobs()` by class (a snapshot's `running_by_class`, core/snapshot.py says
        why), kept from the events rather than sorted out each cycle. `running`: the caller's
        tuple of the same jobs in another order (the head's, by id), to go with it instead."""
        if running is not None:
            return RunningByClass(running, self._by_class, self._recent)
        stopping = self._stopping_jobs
        if stopping is None:
            stopping = self._stopping_jobs = tuple(sorted(self._stopping.values(), key=self._by_place))
        return RunningByClass(self.running_jobs(), self._by_class, self._recent, stopping)

    def _by_place(self, job: RunningJob) -> int:
        """`job`'s place in `running` (a dict keeps a key where it first went in)."""
        return self._place[job.job_id]

    def _run(self, job: RunningJob) -> None:
        """`job` into `running`, replacing any object of its id."""
        old = self.running.get(job.job_id)
        if old is not None:
            self._off(old)
        else:
            self._place[job.job_id] = self._turns
            self._turns += 1
        self.running[job.job_id] = job
        if job.stopping:
            self._stopping[job.job_id] = job
            self._stopping_jobs = None
        parts = self._by_class.get(int(job.priority))
        if parts is None:
            parts = self._by_class[int(job.priority)] = ({}, {})
        checkpoint = job.last_checkpoint_at
        parts[checkpoint is None][job.job_id] = job
        if checkpoint is not None:
            groups = self._recent.get(int(job.priority))
            if groups is None:
                groups = self._recent[int(job.priority)] = {}
            group = groups.get(job.allocation.gpu_count)
            if group is None:
                group = groups[job.allocation.gpu_count] = {}
            _by_checkpoint(group, job, checkpoint)
        self._running_jobs = None

    def _off(self, job: RunningJob) -> None:
        """`job` (the object kept) out of `_by_class` and `_recent`."""
        del self._by_class[int(job.priority)][job.last_checkpoint_at is None][job.job_id]
        if job.last_checkpoint_at is not None:
            del self._recent[int(job.priority)][job.allocation.gpu_count][job.job_id]
        if job.stopping:
            del self._stopping[job.job_id]
            self._stopping_jobs = None
        self._running_jobs = None

    @classmethod
    def build(
        cls,
        queued: Iterable[JobRequest] = (),
        running: Iterable[RunningJob] = (),
        nodes: Iterable[Node] = (),
        drained: Iterable[str] = (),
        drains: Mapping[str, Drain] | None = None,
        holds: dict[str, WaitFacts] | None = None,
        keeps_running: bool = True,
    ) -> ClusterState:
        """A fresh state from a full read (crash recovery, and the check's reference).
        `drained`: drained nodes with no record; `drains`: drained nodes with theirs."""
        state = cls(keeps_running)
        for node in nodes:
            state.apply(NodeUp(node))
        for name in drained:
            state.apply(Drained(name))
        for name, drain in (drains or {}).items():
            state.apply(Drained(name, drain))
        for team, why in (holds or {}).items():
            state.apply(Held(team, why))
        for job in queued:
            state.apply(Submitted(job))
        for r in running if keeps_running else ():
            state._run(r)
            state.capacity.add(r)
        return state

    def apply(self, event: Event) -> None:
        self.applied += 1
        match event:
            case Submitted(job):
                self._unqueue(job.job_id)  # a changed request replaces the old
                self.queued[job.job_id] = job
                self._queued_jobs = None
                self.queue_index.add(job)
                if job.held or job.after or job.array_id is not None:
                    self.gated.add(job.job_id)
            case Started(job):
                self._unqueue(job.job_id)
                if self.keeps_running:
                    self._run(job)
                    self.capacity.add(job)
            case Ended(job_id):
                self._unqueue(job_id)
                ran = self.running.pop(job_id, None)
                if ran is not None:
                    self._off(ran)
                    del self._place[job_id]
                    self.capacity.remove(ran)
            case StopRequested(job):
                if job.job_id in self.running:
                    self._run(job)
                    self.capacity.stopping(job)
            case Checkpointed(job_id, at):
                ran = self.running.get(job_id)
                if ran is not None:  # only the object: capacity reads allocations, not checkpoints
                    self._run(replace(ran, last_checkpoint_at=at))
            case NodeUp(node):
                self.nodes[node.name] = node
            case NodeDown(name):
                self.nodes.pop(name, None)
            case Drained(name, drain):
                self.drained.add(name)
                if drain is None:
                    self.drains.pop(name, None)
                else:
                    self.drains[name] = drain
            case Undrained(name):
                self.drained.discard(name)
                self.drains.pop(name, None)
            case Held(team, why):
                self.holds[team] = why
            case Released(team):
                self.holds.pop(team, None)
            case PolicyChanged(policy):
                self.policy = policy  # the queue index re-sorts itself when the classes change

    def _unqueue(self, job_id: int) -> None:
        """The job out of the queue and its index, if it is queued."""
        left = self.queued.pop(job_id, None)
        if left is not None:
            self._queued_jobs = None
            self.queue_index.remove(left)
            self.gated.discard(job_id)

    def differences(self, fresh: ClusterState, limit: int = 5) -> list[str]:
        """What differs from `fresh`, in words (at most `limit` examples per kind)."""
        out: list[str] = []

        def compare(what: str, mine: Mapping[Any, object], theirs: Mapping[Any, object]) -> None:
            extra = [k for k in mine if k not in theirs]
            missing = [k for k in theirs if k not in mine]
            changed = [k for k in mine if k in theirs and mine[k] != theirs[k]]
            if extra:
                out.append(f"{what}: {len(extra)} kept but not in a fresh build, e.g. {extra[:limit]}")
            if missing:
                out.append(f"{what}: {len(missing)} in a fresh build but not kept, e.g. {missing[:limit]}")
            for k in changed[:limit]:
                out.append(f"{what} {k}: kept {mine[k]!r}, fresh {theirs[k]!r}")

        compare("queued job", self.queued, fresh.queued)
        compare("gated queued job", dict.fromkeys(self.gated), dict.fromkeys(fresh.gated))
        if self.keeps_running:
            compare("running job", self.running, fresh.running)
        compare("node", self.nodes, fresh.nodes)
        compare("drained node", dict.fromkeys(self.drained), dict.fromkeys(fresh.drained))
        compare("drain of node", self.drains, fresh.drains)
        compare("held team", dict(self.holds), dict(fresh.holds))
        return out

    def check(self, fresh: ClusterState, what: str = "cluster state") -> None:
        """Raise `StateMismatch` naming each difference from a fresh build."""
        diffs = self.differences(fresh)
        if diffs:
            raise StateMismatch(f"{what} fed by events differs from a fresh build: " + "; ".join(diffs))
