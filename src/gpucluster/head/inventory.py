"""Nodes that join and leave while the head runs (Ray), and what the head does when one is lost.

A lost node's jobs are stopped everywhere at once (SIGKILL: their peers there are gone, so
waiting out a grace period only delays the restart) and requeued as a preemption, "node X is
down": a node failure is not the job's fault, so it costs no restart of `--max-restarts`, and
the next attempt resumes from the job's checkpoint on the remaining nodes. The stop is made
durable before the kill, so a head that dies meanwhile finishes the requeue when it comes back.
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Protocol

from gpucluster.executors.base import as_handle
from gpucluster.models import NodeOut
from gpucluster.store import JobRecord
from gpucluster.store.presence import Presence

if TYPE_CHECKING:
    from gpucluster.head.loop import Head

log = logging.getLogger("gpucluster.head")


class NodeInventory(Protocol):
    def refresh(self, now: float) -> bool:
        """Bring the store's nodes up to date (joined, left, rejoined); True if any changed."""

    def down(self) -> frozenset[str]:
        """Nodes known to the store that are down now: nothing may be placed there."""

    def lost_nodes(self, job: JobRecord) -> list[str]:
        """The nodes of the job's running attempt that are gone (down, or restarted since)."""

    def address(self, node: str) -> str | None:
        """Where the node's processes listen (MASTER_ADDR when it holds rank 0)."""

    def free_port(self, node: str) -> int:
        """A TCP port free on the node now (MASTER_PORT when it holds rank 0)."""

    def presence(self) -> dict[str, Presence]:
        """What the store says of each node it learnt of: address, up or down since when and why."""


def stop_jobs_on_lost_nodes(
    head: Head, inventory: NodeInventory, running: list[JobRecord], now: float
) -> list[JobRecord]:
    """Stop every running job that lost a node; returns `running` with those jobs reloaded."""
    out = []
    for job in running:
        lost = [] if job.kill_sent else inventory.lost_nodes(job)
        if lost:
            what = f"node {lost[0]} is down" if len(lost) == 1 else f"nodes {', '.join(lost)} are down"
            # A stop already under way (a cancel, a time limit) keeps its own outcome.
            if head.store.request_stop(job.id, "preempt", now, message=what):
                log.warning("job %s: %s; stopping its processes and requeueing it", job.id, what)
            if job.launch is not None:
                head.executor.signal(as_handle(job.launch), signal.SIGKILL)
            head.store.update_job(job.id, job.state, term_sent=True, kill_sent=True)
            job = head.store.get_job(job.id) or job
        out.append(job)
    return out


def with_presence(nodes: list[NodeOut], inventory: NodeInventory | None) -> list[NodeOut]:
    """The API's node listing with each node's presence: up, or down since when and why."""
    if inventory is None:
        return nodes
    down = inventory.down()
    known = inventory.presence()
    out = []
    for n in nodes:
        p = known.get(n.name)
        update: dict[str, object] = {"address": p.address if p is not None and p.address else None}
        if n.name in down:
            up_in_store = p is not None and p.up
            reason = "its Ray node is up; its gpucluster agent is starting" if up_in_store else None
            update.update(
                up=False,
                down_reason=reason or (p.reason if p is not None else "not in the cluster"),
                down_since=p.since if p is not None else None,
            )
        out.append(n.model_copy(update=update))
    return out
