"""The sentence of a wait: made from its reason and numbers (core/reasons.py `WaitFacts`) where a
person reads it, never in the core.

Why here, outside core/: a sentence depends on its reader (the time zone above all), the core's
plan does not. The API renders with UTC (its callers are anywhere; the zone is said: "14:20
UTC"); the CLI renders the API's structured `wait` again in the viewer's local zone, naming it;
the dashboard shows the API's sentence. One function per reason, so each sentence is written
once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

from gpucluster.core.reasons import WaitFacts, WaitReason
from gpucluster.core.types import Wait

HELD_BY_USER = "held by user"


def at(t: float, tz: tzinfo | None = UTC, *, seconds: bool = False) -> str:
    """'2026-11-28 14:20 UTC': a time with its zone named; `tz` None is the viewer's local zone.
    `seconds` for times seconds apart (a restart's backoff, a begin time)."""
    when = datetime.fromtimestamp(t, tz) if tz is not None else datetime.fromtimestamp(t).astimezone()
    return when.strftime("%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z")


def sentence(wait: Wait, tz: tzinfo | None = UTC) -> str:
    """The wait as one sentence for a person, times in `tz` (named)."""
    return text(wait.reason, wait.facts, tz)


def text(reason: WaitReason, facts: WaitFacts, tz: tzinfo | None = UTC) -> str:
    """`sentence` from a reason and its numbers (as the API's `wait` field carries them)."""
    said = _SAY[reason](facts, tz)
    if facts.no_earlier_than is not None:
        first = facts.estimated_first or 0
        said += (
            f"; starts no earlier than {at(facts.no_earlier_than, tz)} "
            f"(only the first {first:,} in line are estimated exactly)"
        )
    return said


def to_json(wait: Wait) -> dict[str, Any]:
    """The structured wait: {"code": reason, ...its numbers}: the API's `wait` and the store's form."""
    return {"code": wait.reason.value, **wait.facts.to_json()}


def from_json(data: Mapping[str, Any]) -> tuple[WaitReason, WaitFacts] | None:
    """Back from `to_json`; None for an unknown code (written by a newer head)."""
    try:
        reason = WaitReason(str(data.get("code")))
    except ValueError:
        return None
    return reason, WaitFacts.from_json(data)


def stored(text_column: str | None) -> dict[str, Any] | None:
    """The structured wait in a job row's reason column, or None where the row holds a sentence
    (rows written before waits were stored structured, and every transition's reason)."""
    if not text_column or not text_column.startswith("{"):
        return None
    try:
        data = json.loads(text_column)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "code" in data else None


def reason_text(text_column: str | None, tz: tzinfo | None = UTC) -> str:
    """What a job row's reason column says: its stored wait made a sentence, or the sentence it
    holds (a transition's reason, or a wait written before waits were kept structured)."""
    data = stored(text_column)
    return render_stored(data, tz) if data is not None else text_column or ""


def render_stored(data: Mapping[str, Any], tz: tzinfo | None = UTC) -> str:
    """The sentence of a structured wait from the store or the API; its code alone if unknown."""
    parsed = from_json(data)
    if parsed is None:
        return str(data.get("code", ""))
    return text(*parsed, tz)


# ---- one function per reason ---------------------------------------------------------------


def _g(x: float | None) -> str:
    return f"{x or 0:g}"


def _mib(mb: int | None) -> str:
    mb = mb or 0
    return f"{mb / 1024:g} GiB" if mb >= 1024 else f"{mb} MiB"


def _resources(f: WaitFacts, tz: tzinfo | None) -> str:
    if f.variant == "selection":
        idle = " (an exclusive job needs nodes where nothing runs)" if f.exclusive else ""
        return (
            f"no free node matches {f.selection}: {f.nodes_count} node(s) with {f.model} GPUs match, "
            f"{f.busy} of them busy{idle}; needs {_g(f.gpus)} free {f.model} GPU(s), "
            f"at most {f.most_on_node} free on one"
        )
    if f.model is None:
        return "waiting for free GPUs"
    where = "in all" if f.spread else "on one node"
    return f"needs {_g(f.gpus)} free {f.model} GPU(s) {where}; {f.free} free now (at most {f.most_on_node} on one node)"


def _host(f: WaitFacts, tz: tzinfo | None) -> str:
    if f.variant in ("cpu_only", "cpu_only_memory"):  # a CPU-only job short of CPUs, of memory
        behind = " (some are held for a job first in line)" if f.reserved else ""
        if f.variant == "cpu_only":
            return f"no node has {_g(f.cpus)} CPU core(s) free{behind}"
        return f"no node has {f.mem_mb or 0} MiB of host memory free{behind}"
    if f.variant == "memory":
        return (
            f"waiting for memory: needs {_mib(f.node_mem_mb)} of host memory beside {_g(f.per_node)} free {f.model} "
            f"GPU(s) on a node; the nodes with those GPUs free have at most {_mib(f.most_mem_mb)} left"
        )
    if f.node_cpus is None:
        return "waiting for CPUs or memory beside free GPUs"
    return (
        f"waiting for CPUs: needs {_g(f.node_cpus)} CPU(s) beside {_g(f.per_node)} free {f.model} GPU(s) on a node; "
        f"the nodes with those GPUs free have at most {_g(f.most_cpus)} CPU(s) left"
    )


def _asked(f: WaitFacts) -> str:
    asked = [f"{_g(f.cpus)} CPU(s)"] if f.cpus else []
    if f.mem_mb:
        asked.append(f"{_mib(f.mem_mb)} of memory")
    return " and ".join(asked)


def _reserved(f: WaitFacts, tz: tzinfo | None) -> str:
    if f.model is None:
        return "first in line: GPUs are held for it"
    short = f"{_host(f, tz)}; " if f.variant in ("cpus", "memory") else ""
    which = f" ({f.selection})" if f.selection else ""
    host = f" with {_asked(f)}" if f.cpus or f.mem_mb else ""
    nodes = ", ".join(f.nodes or ())
    more = "..." if (f.nodes_count or 0) > len(f.nodes or ()) else ""
    when = at(f.reserved_at, tz) if f.reserved_at is not None else "now"
    whole = " (an exclusive job needs nodes where nothing runs: held whole)" if f.exclusive else ""
    return (
        f"{short}first in line{which}: {_g(f.gpus)} {f.model} GPUs{host} on {nodes}{more} "
        f"are held for it from {when}{whole}"
    )


def _behind(f: WaitFacts, tz: tzinfo | None) -> str:
    when = at(f.reserved_at, tz) if f.reserved_at is not None else "not estimated"
    return f"would delay job {f.blocked_by}, first in line for {f.model} GPUs (its estimated start: {when})"


def _preempting(f: WaitFacts, tz: tzinfo | None) -> str:
    if f.variant == "stopping":
        return f"waiting for stopping jobs to release {f.model} GPUs"
    what = "shrinking elastic job(s)" if f.variant == "shrinking" else "preempting job(s)"
    names = ", ".join(str(v) for v in f.victims or ())
    return f"{what} {names} to free {_g(f.gpus)} {f.model} GPUs"


def _quota(f: WaitFacts, tz: tzinfo | None) -> str:
    if f.variant == "borrow_limit":
        return (
            f"team {f.team} would borrow {_g(f.used)} GPUs beyond its guaranteed quota; "
            f"its borrowing limit is {_g(f.limit)}"
        )
    if f.variant == "pool":
        return (
            f"team {f.team} holds {_g(f.used)} of its {_g(f.limit)}-GPU quota in pool {f.pool}: "
            f"{_g(f.asks)} more would exceed it (it starts elsewhere, or there when the team's jobs in {f.pool} end)"
        )
    return f"the {f.free} idle {f.model} GPUs include {_g(f.protected)} guaranteed to other teams that they do not lend"


def _no_fit(f: WaitFacts, tz: tzinfo | None) -> str:
    kinds = ", ".join(f.gpu_types) if f.gpu_types else "any model"
    if f.variant == "exclusive_fraction":
        return "--exclusive takes whole GPUs; ask for 1 GPU or more"
    if f.variant == "cpu_only_exclusive":
        return "--exclusive holds whole GPU nodes; a CPU-only job cannot ask for it"
    if f.variant == "cpu_only":
        where = " it may use" if f.selection else ""
        return (
            f"a CPU-only job asking for {_g(f.cpus)} CPU core(s) and {f.mem_mb or 0} MiB of host memory fits no "
            f"node{where} (the most on one node: {_g(f.most_cpus)} cores, {f.most_mem_mb or 0} MiB; a node that "
            "states neither takes no CPU-only job)"
        )
    if f.variant == "host":
        return (
            f"no node can host {_asked(f)} beside {_g(f.gpus)} GPU(s) as asked "
            f"(the largest node has {_g(f.most_cpus)} CPU(s) and {_mib(f.most_mem_mb)} of memory)"
        )
    if f.variant == "unmatched":
        if not f.nodes_count:
            return f"no node matches {f.selection}: the cluster has no nodes yet"
        offer = "; ".join(f"{n}: {labels or 'no labels'}" for n, labels in f.labels or ())
        shown = len(f.labels or ())
        more = f"; and {f.nodes_count - shown} more" if f.nodes_count > shown else ""
        return f"no node matches {f.selection} (nodes and their labels: {offer}{more})"
    if f.variant == "selection":
        nodes = ", ".join(f.nodes or ())
        more = "..." if (f.nodes_count or 0) > len(f.nodes or ()) else ""
        return (
            f"the {f.nodes_count} node(s) matching {f.selection} can never host {_g(f.gpus)} GPUs "
            f"of {kinds} as asked ({nodes}{more})"
        )
    sizes = ", ".join(f"{m}: {n} per node, {total} in all" for m, n, total in f.sizes or ())
    return f"no set of nodes can host {_g(f.gpus)} GPUs of {kinds} as asked ({sizes or 'no GPUs'})"


def _drained(f: WaitFacts, tz: tzinfo | None) -> str:
    parts = []
    for node, why, until in f.drains or ():
        end = f", until {at(until, tz)}" if until is not None else " with no end set"
        parts.append(f"node {node} is drained ({why}){end}")
    if f.more:
        parts.append(f"and {f.more} more drained node(s)")
    return "; ".join(parts) or "only drained nodes could host it"


def _backoff(f: WaitFacts, tz: tzinfo | None) -> str:
    return (
        f"restart held back until {at(f.until, tz, seconds=True)} (backoff)"
        if f.until is not None
        else "restart held back"
    )


def _begin(f: WaitFacts, tz: tzinfo | None) -> str:
    return (
        f"waits for its begin time {at(f.until, tz, seconds=True)}"
        if f.until is not None
        else "waits for its begin time"
    )


def _budget(f: WaitFacts, tz: tzinfo | None) -> str:
    parts = []
    if f.money_limit is not None:
        parts.append(f"spent {f.money or 0:.2f} of its {f.money_limit:g} money budget")
    if f.gpu_hours_limit is not None:
        parts.append(f"used {f.gpu_hours or 0:.2f} of its {f.gpu_hours_limit:g} GPU-hour budget")
    over = " and ".join(parts) or "is over its budget"
    end = f" ({at(f.until, tz)})" if f.until is not None else ""
    return (
        f"held: team {f.team} {over} for this {f.period} period; "
        f"released when the period rolls over{end} or the budget grows"
    )


def _held(f: WaitFacts, tz: tzinfo | None) -> str:
    return HELD_BY_USER


def _dependency(f: WaitFacts, tz: tzinfo | None) -> str:
    verb = "start" if f.kind == "after" else "end"
    when = f"expected to {verb} {at(f.at, tz)}" if f.at is not None else f"{verb} not estimated yet"
    said = f"waits for {'array' if f.array else 'job'} {f.job} ({f.state}, {when})"
    return said + (f" and {f.more} more" if f.more else "")


def _throttle(f: WaitFacts, tz: tzinfo | None) -> str:
    limit = int(f.limit or 0)
    return f"array {f.array_id} runs at most {limit} element{'s' if limit != 1 else ''} at once ({f.running} running)"


def _limit(f: WaitFacts, tz: tzinfo | None, hours: bool) -> str:
    cls = f.priority_class
    who = f.user if cls is None else f"{f.user}'s {cls} jobs"
    scope = "per-user" if cls is None else "per-class"
    if hours:
        ahead = f" and {f.ahead:.1f} more ahead in line" if f.ahead else ""
        held = f"{who} {'has' if cls is None else 'have'} {f.used or 0:.1f} GPU-hours in flight{ahead}"
        tail = f"this job adds {f.asks or 0:.1f} (GPUs x time limit)"
    else:
        running = f.used or 0
        ahead = f" and {f.ahead:g} more are ahead in line" if f.ahead else ""
        held = f"{who} {'runs' if cls is None else 'run'} {running:g} GPU{'s' if running != 1 else ''}{ahead}"
        tail = f"this job asks {_g(f.asks)}"
    said = f"{held}, the {scope} limit ({f.path}) is {_g(f.limit)}; {tail}"
    if f.variant == "never":
        said += ": it can never start under this limit; cancel it and submit it smaller or shorter"
    return said


def _gpu_limit(f: WaitFacts, tz: tzinfo | None) -> str:
    return _limit(f, tz, hours=False)


def _hour_limit(f: WaitFacts, tz: tzinfo | None) -> str:
    return _limit(f, tz, hours=True)


_SAY: dict[WaitReason, Callable[[WaitFacts, tzinfo | None], str]] = {
    WaitReason.RESOURCES: _resources,
    WaitReason.RESERVED: _reserved,
    WaitReason.BEHIND_RESERVATION: _behind,
    WaitReason.PREEMPTING: _preempting,
    WaitReason.QUOTA: _quota,
    WaitReason.NO_FIT: _no_fit,
    WaitReason.DRAINED: _drained,
    WaitReason.BACKOFF: _backoff,
    WaitReason.BEGIN: _begin,
    WaitReason.BUDGET: _budget,
    WaitReason.HELD: _held,
    WaitReason.DEPENDENCY: _dependency,
    WaitReason.THROTTLE: _throttle,
    WaitReason.USER_GPUS: _gpu_limit,
    WaitReason.CLASS_GPUS: _gpu_limit,
    WaitReason.USER_GPU_HOURS: _hour_limit,
    WaitReason.CLASS_GPU_HOURS: _hour_limit,
    WaitReason.CPUS: _host,
    WaitReason.MEMORY: _host,
}

__all__ = ["HELD_BY_USER", "at", "from_json", "reason_text", "render_stored", "sentence", "stored", "text", "to_json"]
