"""Finished runs and job workloads, read from the store for the run-time predictor (issue 24).

Why a module of its own: only the head's runtime model (head/runtime_model.py) reads these, in
small incremental batches (runs that ended after a watermark), and it needs the spec's name and
command, which the scheduler's compact `request` column leaves out.

A run is a job's last attempt that ended in success, or at its time limit (it ran at least that
long): failures, cancels and preemptions say nothing about how long the work takes.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_, select

from gpucluster.core.lifecycle import StopReason
from gpucluster.core.states import JobState
from gpucluster.store import schema
from gpucluster.store.store import IDS_PER_QUERY, Store, allocation_from_json


@dataclass(frozen=True)
class StoredRun:
    job_id: int
    ended_at: float
    run_s: float
    owner: str
    team: str
    name: str
    command: tuple[str, ...] | None  # None: not read, its workload is known to the caller
    gpus: float
    time_limit_s: float | None
    nodes: tuple[str, ...]  # the nodes its last attempt ran on (its GPU model is theirs)


def _command(spec_text: str | None, shared: dict[int, str], array_id: int | None) -> tuple[str, ...]:
    text = spec_text or (shared.get(array_id) if array_id is not None else None)
    if not text:
        return ()
    try:
        command = json.loads(text).get("command") or []
    except ValueError:
        return ()
    return tuple(str(c) for c in command[:2])


def _shared(c: Any, rows: Iterable[Any]) -> dict[int, str]:
    """Array elements share their first element's spec text: fetch those once."""
    j = schema.jobs.c
    wanted = sorted({int(r.array_id) for r in rows if not r.spec and r.array_id is not None})
    out: dict[int, str] = {}
    for at in range(0, len(wanted), IDS_PER_QUERY):
        q = select(j.id, j.spec).where(j.id.in_(wanted[at : at + IDS_PER_QUERY]))
        out.update({int(i): t for i, t in c.execute(q)})
    return out


def finished_runs(
    store: Store, after: tuple[float, int] | None, limit: int, known: Container[int] = ()
) -> list[StoredRun]:
    """Up to `limit` runs that ended after `after` (ended_at, job id), oldest first; with no
    watermark, the `limit` latest (a new head learns from recent history, not all of it).

    `known`: jobs whose workload the caller already has (it read them while they were queued or
    running): their spec's JSON is not parsed again for its command (`command` None). Why: that
    parse was a fifteenth of the head's CPU per trivial job in a drain (issue 18)."""
    a, j = schema.attempts.c, schema.jobs.c
    ran_out = and_(j.state == JobState.FAILED.value, j.stop_reason == StopReason.TIME_LIMIT.value)
    q = (
        select(
            j.id,
            a.ended_at,
            a.started_at,
            a.allocation,
            j.owner,
            j.team,
            j.name,
            j.spec,
            j.array_id,
            j.gpus,
            j.request,
        )
        .select_from(schema.attempts.join(schema.jobs, and_(a.job_id == j.id, a.attempt == j.attempt)))
        .where(a.started_at.is_not(None), or_(j.state == JobState.SUCCEEDED.value, ran_out))
    )
    if after is None:
        q = q.order_by(a.ended_at.desc(), j.id.desc()).limit(limit)
    else:
        at, job_id = after
        q = q.where(or_(a.ended_at > at, and_(a.ended_at == at, j.id > job_id)))
        q = q.order_by(a.ended_at, j.id).limit(limit)
    with store._read() as c:
        rows = list(c.execute(q).all())
        shared = _shared(c, rows)
    if after is None:
        rows.reverse()
    out = []
    for r in rows:
        alloc = allocation_from_json(r.allocation)
        request = json.loads(r.request) if r.request else {}
        out.append(
            StoredRun(
                job_id=int(r.id),
                ended_at=float(r.ended_at),
                run_s=max(0.0, float(r.ended_at) - float(r.started_at)),
                owner=r.owner or "",
                team=r.team,
                name=r.name,
                command=None if int(r.id) in known else _command(r.spec, shared, r.array_id),
                gpus=float(r.gpus),
                time_limit_s=request.get("tl"),
                nodes=tuple(s.node for s in alloc.slices) if alloc else (),
            )
        )
    return out


def workloads(store: Store, ids: Iterable[int]) -> dict[int, tuple[str, tuple[str, ...]]]:
    """Each job's name and the first two words of its command, by id (what makes two jobs the
    same workload: core/runtime_predict.workload_of)."""
    j = schema.jobs.c
    wanted = sorted(set(ids))
    out: dict[int, tuple[str, tuple[str, ...]]] = {}
    with store._read() as c:
        for at in range(0, len(wanted), IDS_PER_QUERY):
            rows = c.execute(
                select(j.id, j.name, j.spec, j.array_id).where(j.id.in_(wanted[at : at + IDS_PER_QUERY]))
            ).all()
            shared = _shared(c, rows)
            out.update({int(r.id): (r.name, _command(r.spec, shared, r.array_id)) for r in rows})
    return out
