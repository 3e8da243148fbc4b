"""Why a job waits: a named reason and its numbers (`WaitFacts`), never a sentence; the
sentence is made where a person reads it (gpucluster/waits_text.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any


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


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitFacts:
    """The numbers of a wait, beside its `WaitReason`: what the core knows, never a sentence.

    Why no sentence here: the core cannot know its reader's time zone or language, and a program
    (the dashboard, a script, a test) wants the numbers, not prose to parse. The sentence is made
    where a person reads it (gpucluster/waits_text.py: the API, the CLI). One flat record rather
    than one class per reason: every field is optional, a wait fills those its reason speaks of,
    and its JSON form (`to_json`) is the fields that are set.

    `variant` tells the forms of one reason apart where they differ in what they say (a NO_FIT
    of a selection that no node matches, of a shape no set of nodes has, ...). Times are epoch
    seconds (UTC), memory MiB.
    """

    variant: str | None = None
    # GPUs
    model: str | None = None
    gpus: float | None = None  # GPUs the job asks for
    free: int | None = None  # free GPUs of `model` now
    most_on_node: int | None = None  # most free GPUs of `model` on one node
    spread: bool | None = None  # its GPUs may be spread over nodes (fractional or larger than a node)
    per_node: float | None = None  # its GPUs on one node (beside which CPUs or memory are needed)
    gpu_types: tuple[str, ...] | None = None  # the models it accepts (None: any)
    sizes: tuple[tuple[str, int, int], ...] | None = None  # (model, GPUs per node, GPUs in all)
    # host resources: the job's request, the part needed on one node, the most left on one
    cpus: float | None = None
    mem_mb: int | None = None
    node_cpus: float | None = None
    node_mem_mb: int | None = None
    most_cpus: float | None = None
    most_mem_mb: int | None = None
    # nodes: a reservation's or a selection's (the first few, `nodes_count` in all)
    nodes: tuple[str, ...] | None = None
    nodes_count: int | None = None
    busy: int | None = None  # of those, nodes without room now
    selection: str | None = None  # the node selection, as the user wrote it (--constraint ib)
    exclusive: bool | None = None
    reserved: bool | None = None  # some of the room it needs is held for a job first in line
    labels: tuple[tuple[str, str], ...] | None = None  # (node, its labels): what nodes offer
    reserved_at: float | None = None  # when GPUs are held for the first in line from
    blocked_by: int | None = None  # the first in line that starting it would delay
    victims: tuple[int, ...] | None = None  # jobs being stopped (or shrunk) for it
    # quotas and limits
    team: str | None = None
    pool: str | None = None
    used: float | None = None  # GPUs (or GPU-hours) held now
    ahead: float | None = None  # more admitted ahead in line this cycle
    asks: float | None = None  # what this job adds
    limit: float | None = None  # the quota, borrowing limit or limit
    protected: float | None = None  # idle GPUs guaranteed to other teams
    user: str | None = None
    priority_class: str | None = None  # a per-class limit's class
    path: str | None = None  # where the policy file sets the limit
    # dependencies, arrays, drains, times
    job: int | None = None  # the (first unmet) job or array it waits for
    array: bool | None = None  # `job` names an array
    kind: str | None = None  # the dependency's kind (after, afterok, ...)
    state: str | None = None  # that job's state
    at: float | None = None  # when that job is expected to start or end
    more: int | None = None  # more unmet dependencies, or more drained nodes, not named
    array_id: int | None = None
    running: int | None = None
    drains: tuple[tuple[str, str, float | None], ...] | None = None  # (node, why, until)
    until: float | None = None  # a begin time or the end of a restart's backoff
    no_earlier_than: float | None = None  # an estimate's floor when it is not exact
    estimated_first: int | None = None  # how many in line are estimated exactly
    # a budget hold: what the team spent of the budget it is over (only the parts it is over)
    money: float | None = None
    money_limit: float | None = None
    gpu_hours: float | None = None
    gpu_hours_limit: float | None = None
    period: str | None = None  # the budget's period as written (1d, month); `until` its end

    def to_json(self) -> dict[str, Any]:
        """The fields that are set, tuples as lists: JSON for the store and the API."""
        return {f: _plain(v) for f in _NAMES if (v := getattr(self, f)) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WaitFacts:
        """Back from `to_json` (unknown keys, from a newer head, are ignored)."""
        return cls(**{k: _tupled(v) for k, v in data.items() if k in _NAMES})


NO_FACTS = WaitFacts()
_NAMES = tuple(f.name for f in fields(WaitFacts))


def _plain(v: object) -> object:
    return [_plain(x) for x in v] if isinstance(v, tuple) else v


def _tupled(v: object) -> Any:
    return tuple(_tupled(x) for x in v) if isinstance(v, list) else v
