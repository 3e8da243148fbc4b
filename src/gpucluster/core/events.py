"""What happens to the cluster, as events: the one vocabulary the head and the simulator tell
the cluster state with (core/cluster_state.py, issue 15).

Why events rather than a snapshot rebuilt or diffed each cycle: between two cycles only a few
jobs come, start or end, and whoever makes the change knows it (the simulator its clock, the head
its own starts and what it reads from the store). Telling the state what changed keeps every
index incremental; reading back the whole store or queue each cycle made the head's cycle cost
O(queued jobs) while the simulator's was O(changes). Frozen values: an event is a fact, applied
once, and can be logged or compared by a check (`ClusterState.check`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.core.lifecycle import StopReason
from gpucluster.core.policy import Policy
from gpucluster.core.reasons import WaitFacts
from gpucluster.core.types import Drain, JobRequest, Node, RunningJob


@dataclass(frozen=True, slots=True)
class Submitted:
    """A job entered the queue: a submit, a requeue, or its request changed (replaces the old)."""

    job: JobRequest


@dataclass(frozen=True, slots=True)
class Started:
    """A queued job started: it leaves the queue and holds `job.allocation`."""

    job: RunningJob


@dataclass(frozen=True, slots=True)
class Ended:
    """A job left the cluster's queue or GPUs other than by a start: its attempt ended (`reason`:
    the stop that ended it, None for an exit of its own) or, queued, it was cancelled or held."""

    job_id: int
    reason: StopReason | None = None


@dataclass(frozen=True, slots=True)
class StopRequested:
    """A stop of a running job is under way (`job.stopping` is set): its GPUs come back after
    the grace period, which reservations count with."""

    job: RunningJob
    reason: StopReason


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A running job saved a checkpoint at `at` (its own report): preemption weighs the work a
    victim would lose from it (`RunningJob.last_checkpoint_at`); its GPUs are unchanged."""

    job_id: int
    at: float


@dataclass(frozen=True, slots=True)
class NodeUp:
    """A node joined, or came back with these GPUs (a changed node is a NodeUp again)."""

    node: Node


@dataclass(frozen=True, slots=True)
class NodeDown:
    """A node left the cluster (failed, lost). A drain on it stays: a drain is said of the node's
    name (a user's `drain`, a maintenance window) and still holds when the node comes back."""

    name: str


@dataclass(frozen=True, slots=True)
class Drained:
    """A node takes no new job (its running jobs stay). `drain`: why and until when, as the
    snapshot shows it (`Snapshot.drains`; the DRAINED wait and the estimates read it); None: no
    reason given, no end. Told again, it replaces the node's drain (the latest one says)."""

    name: str
    drain: Drain | None = None


@dataclass(frozen=True, slots=True)
class Undrained:
    """A node takes jobs again: its drain is over."""

    name: str


@dataclass(frozen=True, slots=True)
class Held:
    """A team's queued jobs are held (a spent budget): `why` is the wait they show (its numbers)."""

    team: str
    why: WaitFacts


@dataclass(frozen=True, slots=True)
class Released:
    team: str


@dataclass(frozen=True, slots=True)
class PolicyChanged:
    policy: Policy


Event = (
    Submitted
    | Started
    | Ended
    | StopRequested
    | Checkpointed
    | NodeUp
    | NodeDown
    | Drained
    | Undrained
    | Held
    | Released
    | PolicyChanged
)
