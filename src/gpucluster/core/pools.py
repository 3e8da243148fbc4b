"""Node pools: nodes only some teams or priority classes may use (Kueue's flavors, Slurm's
partitions), from the policy file's `pools:`.

A pool names its nodes (by name, or by labels they all have) and who may use them (teams,
classes; either left out: all). A node in no pool is open to every job; a node in pools may be
used by a job only if one of its pools admits the job's team and class. `decide` applies pools
before it plans (`with_pools`): each queued job's node selection (core/selection.py) gains the
nodes closed to it, so placement, reservations and preemption honour pools exactly as they
honour `--exclude`, and the cycle's cached answers, keyed by the selection, are never shared
between jobs that pools treat differently. A policy without pools leaves the snapshot as it is.

A pool may carry quotas per team (`quotas`: team -> GPUs): the most GPUs a team's running jobs
may hold on the pool's nodes, enforced by the scheduler like a team's quota (a job that would
take its team past one waits with a QUOTA wait naming the pool, and preempts nothing for it).
Why per pool and not per model: a pool is usually the scarce part of a model (the nodes with
InfiniBand, the new racks), and sharing it is what teams argue about. A team the pool's quotas
leave out is limited only by who the pool admits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpucluster.core.selection import Selection
from gpucluster.core.types import JobRequest, Node, Priority

if TYPE_CHECKING:  # the snapshot imports the policy, which holds pools
    from gpucluster.core.snapshot import Snapshot


@dataclass(frozen=True)
class Pool:
    name: str
    nodes: frozenset[str] = frozenset()  # these nodes by name
    labels: frozenset[str] = frozenset()  # and every node with all these labels (empty: none by label)
    teams: frozenset[str] | None = None  # who may use it; None: every team
    classes: frozenset[Priority] | None = None  # which classes may; None: every class
    quotas: tuple[tuple[str, float], ...] = ()  # (team, GPUs it may hold on the pool's nodes), by team

    def quota(self, team: str) -> float | None:
        """The GPUs `team` may hold on the pool's nodes; None: no quota of its own here."""
        for name, gpus in self.quotas:
            if name == team:
                return gpus
        return None

    def holds(self, node: Node) -> bool:
        return node.name in self.nodes or (bool(self.labels) and self.labels <= node.labels)

    def admits(self, team: str, priority: Priority) -> bool:
        return (self.teams is None or team in self.teams) and (self.classes is None or priority in self.classes)


def closed_nodes(pools: Iterable[Pool], nodes: Iterable[Node], team: str, priority: Priority) -> Selection:
    """The nodes pools close to a job of `team` and `priority` (in pools, none admitting it),
    as a selection's `denied` and `closed_pools`."""
    pools = tuple(pools)
    denied: set[str] = set()
    closed: set[str] = set()
    for node in nodes:
        mine = [p for p in pools if p.holds(node)]
        if mine and not any(p.admits(team, priority) for p in mine):
            denied.add(node.name)
            closed.update(p.name for p in mine)
    return Selection(denied=frozenset(denied), closed_pools=tuple(sorted(closed)))


def restrict(job: JobRequest, closed: Selection) -> JobRequest:
    """`job` with the nodes `closed` denies added to its own selection."""
    if not closed.denied:
        return job
    sel = job.selection or Selection()
    return replace(job, selection=replace(sel, denied=closed.denied, closed_pools=closed.closed_pools))


def with_pools(snapshot: Snapshot, pools: tuple[Pool, ...]) -> Snapshot:
    """The snapshot with every queued job restricted to the nodes its pools leave it; the kept
    queue index is dropped then (its requests are the unrestricted ones), so the cycle sorts the
    queue itself. O(queued) a cycle, only with pools."""
    if not pools:
        return snapshot
    by_key: dict[tuple[str, Priority], Selection] = {}
    queued = []
    for job in snapshot.queued:
        key = (job.team, job.priority)
        closed = by_key.get(key)
        if closed is None:
            closed = by_key[key] = closed_nodes(pools, snapshot.nodes, job.team, job.priority)
        queued.append(restrict(job, closed))
    return replace(snapshot, queued=tuple(queued), queue_index=None)
