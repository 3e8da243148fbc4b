"""Small builders for the core's value types, so tests state only what matters to them.

job(1).gpus(8).gpu_types("H100", "A100").priority("high").team("vision").limit(3600).build() -> JobRequest
job(2).gpus(0.25).build(); job(3).memory(10240).build()                    -> fractional JobRequests
node("n1").gpus(8, "H100").build()                                         -> Node
node("mixed").gpus(4, "H100", domain="nvl0").gpus(4, "A100").build()       -> Node, indices 0..7
node("n2").gpus(8).labels("ib", "rack=r1").build()                          -> Node with labels
job(4).select(constraint="ib", exclude=["n3"]).exclusive().build()         -> JobRequest with a selection
running(7, "n1", 0, 1, team="nlp", priority="low", started_at=5.0)         -> RunningJob
shared(8, "n1", 0, share=0.5, memory_mb=40960)                             -> RunningJob on half a GPU
policy(team("a", quota={"H100": 4}), team("b"), preemption=preemption(min_runtime_s=60)) -> Policy
snapshot(nodes=[...], running=[...], queued=[...], usage={"a": 3600.0})    -> Snapshot
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.core import policy as core_policy
from gpucluster.core.selection import Selection, parse_constraint
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, Gpu, JobRequest, Node, NodeSlice, Priority, RunningJob
from gpucluster.models import JobSpec

H100_MB = 81920


def _priority(p: str | Priority) -> Priority:
    return Priority.parse(p) if isinstance(p, str) else p


class JobBuilder:
    def __init__(self, job_id: int) -> None:
        self._job_id = job_id
        self._gpus: float = 1
        self._gpu_types: tuple[str, ...] = ()
        self._priority = Priority.NORMAL
        self._submitted_at = float(job_id)
        self._team = "default"
        self._gpu_memory_mb: int | None = None
        self._min_gpu_memory_mb: int | None = None
        self._time_limit_s: float | None = None
        self._nodes: int | None = None
        self._selection = Selection()
        self._cpus = 0.0
        self._mem_mb = 0

    def host(self, cpus: float = 0.0, mem_mb: int = 0) -> JobBuilder:
        """CPU cores and host memory (MiB) in all, beside its GPUs."""
        self._cpus, self._mem_mb = cpus, mem_mb
        return self

    def gpus(self, n: float) -> JobBuilder:
        self._gpus = n
        return self

    def gpu_type(self, model: str | None) -> JobBuilder:
        """One required model (None: any)."""
        self._gpu_types = () if model is None else (model,)
        return self

    def gpu_types(self, *models: str) -> JobBuilder:
        """Acceptable models, most preferred first."""
        self._gpu_types = tuple(models)
        return self

    def priority(self, p: str | Priority) -> JobBuilder:
        self._priority = _priority(p)
        return self

    def at(self, submitted_at: float) -> JobBuilder:
        self._submitted_at = submitted_at
        return self

    def team(self, team: str) -> JobBuilder:
        self._team = team
        return self

    def limit(self, seconds: float | None) -> JobBuilder:
        self._time_limit_s = seconds
        return self

    def memory(self, mb: int | None) -> JobBuilder:
        """A share of one GPU by memory (MiB)."""
        self._gpu_memory_mb = mb
        return self

    def min_memory(self, mb: int | None) -> JobBuilder:
        """Only GPUs with at least this much memory (MiB)."""
        self._min_gpu_memory_mb = mb
        return self

    def nodes(self, n: int | None) -> JobBuilder:
        self._nodes = n
        return self

    def select(
        self, nodelist: Iterable[str] | None = None, exclude: Iterable[str] = (), constraint: str | None = None
    ) -> JobBuilder:
        """Only the nodes of `nodelist` (None: any), never those of `exclude`, matching `constraint`."""
        self._selection = Selection(
            frozenset(nodelist) if nodelist is not None else None,
            frozenset(exclude),
            parse_constraint(constraint) if constraint else (),
            self._selection.exclusive,
        )
        return self

    def exclusive(self) -> JobBuilder:
        self._selection = Selection(
            self._selection.nodelist, self._selection.exclude, self._selection.constraint, exclusive=True
        )
        return self

    def build(self) -> JobRequest:
        return JobRequest(
            job_id=self._job_id,
            gpus=self._gpus,
            gpu_types=self._gpu_types,
            priority=self._priority,
            submitted_at=self._submitted_at,
            team=self._team,
            gpu_memory_mb=self._gpu_memory_mb,
            min_gpu_memory_mb=self._min_gpu_memory_mb,
            time_limit_s=self._time_limit_s,
            nodes=self._nodes,
            selection=self._selection if self._selection != Selection() else None,
            cpus=self._cpus,
            mem_mb=self._mem_mb,
        )


def job(job_id: int) -> JobBuilder:
    """A queued job; by default 1 GPU of any model, normal priority, team default, submitted at t=job_id."""
    return JobBuilder(job_id)


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._gpus: list[Gpu] = []
        self._labels: frozenset[str] = frozenset()
        self._cpus: float | None = None
        self._memory_mb: int | None = None

    def host(self, cpus: float | None = None, memory_mb: int | None = None) -> NodeBuilder:
        """Its CPU cores and host memory (MiB); None: not accounted."""
        self._cpus, self._memory_mb = cpus, memory_mb
        return self

    def labels(self, *labels: str) -> NodeBuilder:
        self._labels = frozenset(labels)
        return self

    def gpus(self, count: int, model: str = "H100", memory_mb: int = H100_MB, domain: str | None = None) -> NodeBuilder:
        """Add `count` GPUs of `model` (in topology `domain`); indices continue after those already added."""
        start = len(self._gpus)
        for i in range(start, start + count):
            self._gpus.append(
                Gpu(index=i, model=model, memory_mb=memory_mb, uuid=f"GPU-{self._name}-{i}", domain=domain)
            )
        return self

    def build(self) -> Node:
        return Node(self._name, tuple(self._gpus), self._labels, self._cpus, self._memory_mb)


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def running(
    job_id: int,
    node_name: str,
    *indices: int,
    team: str = "default",
    priority: str | Priority = Priority.NORMAL,
    started_at: float = 0.0,
    limit: float | None = None,
    checkpoint: float | None = None,
    stopping: bool = False,
    exclusive: bool = False,
) -> RunningJob:
    """A running job holding whole GPUs `indices` on `node_name` (`exclusive`: the whole node)."""
    return RunningJob(
        job_id,
        allocation(node_name, *indices),
        team=team,
        priority=_priority(priority),
        started_at=started_at,
        time_limit_s=limit,
        last_checkpoint_at=checkpoint,
        stopping=stopping,
        exclusive=exclusive,
    )


def spread(job_id: int, slices: Mapping[str, Iterable[int]], **kw: Any) -> RunningJob:
    """A running job over several nodes: {"n1": [0, 1], "n2": [0, 1]}."""
    base = running(job_id, "unused", **kw)
    alloc = Allocation(tuple(NodeSlice(n, tuple(idx)) for n, idx in slices.items()))
    return RunningJob(
        job_id,
        alloc,
        team=base.team,
        priority=base.priority,
        started_at=base.started_at,
        time_limit_s=base.time_limit_s,
        last_checkpoint_at=base.last_checkpoint_at,
        stopping=base.stopping,
    )


def shared(
    job_id: int, node_name: str, index: int, share: float, memory_mb: int | None = None, **kw: Any
) -> RunningJob:
    """A running job on a fraction of one GPU (memory defaults to the same fraction of an H100)."""
    base = running(job_id, node_name, index, **kw)
    mem = memory_mb if memory_mb is not None else int(share * H100_MB)
    return RunningJob(
        job_id,
        Allocation((NodeSlice(node_name, (index,), share, mem),)),
        team=base.team,
        priority=base.priority,
        started_at=base.started_at,
        time_limit_s=base.time_limit_s,
        last_checkpoint_at=base.last_checkpoint_at,
        stopping=base.stopping,
    )


def allocation(node_name: str, *indices: int) -> Allocation:
    return Allocation((NodeSlice(node_name, tuple(indices)),))


def snapshot(
    nodes: Iterable[Node | NodeBuilder] = (),
    running: Iterable[RunningJob] = (),
    queued: Iterable[JobRequest | JobBuilder] = (),
    usage: Mapping[str, float] | None = None,
) -> Snapshot:
    """A Snapshot; builders are built for you."""
    return Snapshot(
        nodes=tuple(n.build() if isinstance(n, NodeBuilder) else n for n in nodes),
        running=tuple(running),
        queued=tuple(q.build() if isinstance(q, JobBuilder) else q for q in queued),
        usage=dict(usage or {}),
    )


# ---- policies ----------------------------------------------------------------------------------


def team(
    name: str,
    weight: float = 1.0,
    org: str | None = None,
    quota: Mapping[str, float] | None = None,
    max_borrow: float | None = None,
    max_lend: float | None = None,
) -> core_policy.Team:
    return core_policy.Team(name, weight, org, dict(quota or {}), max_borrow, max_lend)


def org(name: str, weight: float = 1.0) -> core_policy.Org:
    return core_policy.Org(name, weight)


def preemption(**fields: Any) -> core_policy.Preemption:
    """core.policy.Preemption; `protected_classes` may be given as names."""
    if "protected_classes" in fields:
        fields["protected_classes"] = frozenset(_priority(p) for p in fields["protected_classes"])
    return core_policy.Preemption(**fields)


def no_preemption() -> core_policy.Preemption:
    return core_policy.Preemption(enabled=False)


def policy(*teams: core_policy.Team, orgs: Iterable[core_policy.Org] = (), **fields: Any) -> core_policy.Policy:
    """A Policy with these teams (none: the default team) and orgs; other fields as keywords."""
    if teams:
        fields["teams"] = {t.name: t for t in teams}
    fields["orgs"] = {o.name: o for o in orgs}
    return core_policy.Policy(**fields)


def spec(**fields: Any) -> JobSpec:
    """A valid JobSpec (command ["true"] unless given), validated like a user's submission."""
    fields.setdefault("command", ["true"])
    return JobSpec.model_validate(fields)
