"""Accounting in the store: one `job_usage` row per job attempt, and the accountant's watermarks.

Why a module of its own: only the head's accountant (head/accounting.py) writes here, on the
loop's thread, in one transaction per accrual step (rows and watermarks together, so a crash
never counts a telemetry sample twice nor an attempt's end half); the API reads windows of rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import and_, func, or_, select

from gpucluster.core.types import Allocation
from gpucluster.store import schema
from gpucluster.store.store import AttemptRecord, Store, allocation_from_json, allocation_to_json

SAMPLES_MARK = "accounting.samples_id"  # the last gpu_samples row whose energy was counted
ATTEMPTS_MARK = "accounting.attempts_at"  # attempts ended before this were all made final


@dataclass(frozen=True)
class UsageRow:
    job_id: int
    attempt: int
    team: str
    owner: str | None
    gpu_model: str
    gpus: float
    allocation: Allocation | None
    started_at: float
    accrued_until: float
    gpu_seconds: float = 0.0
    cost: float = 0.0
    energy_j: float = 0.0
    used_gpu_seconds: float = 0.0
    sampled_gpu_seconds: float = 0.0
    final: bool = False
    outcome: str | None = None
    work_lost_s: float | None = None
    kind: str = "batch"  # the job's: batch | session
    idle_gpu_seconds: float = 0.0  # GPU-seconds held with a reading at or under IDLE_UTILIZATION

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @property
    def cpu_seconds(self) -> float:
        """CPU core-seconds held so far: the cores of its allocation (`--cpus`, a CPU-only job's
        included) times the time accrued. Derived, not stored: the allocation is in the row and
        the cores are held at a constant rate, so it is exact for any part of the interval."""
        cores = sum(s.cpus for s in self.allocation.slices) if self.allocation is not None else 0.0
        return cores * max(0.0, self.accrued_until - self.started_at)

    def accrue(self, until: float, cost_per_s: float) -> UsageRow:
        """GPU-seconds and cost of holding the allocation up to `until` (never backwards)."""
        dt = until - self.accrued_until
        if dt <= 0:
            return self
        return replace(
            self,
            accrued_until=until,
            gpu_seconds=self.gpu_seconds + self.gpus * dt,
            cost=self.cost + cost_per_s * dt,
        )


@dataclass(frozen=True)
class RawSample:
    id: int
    node: str
    gpu: int
    at: float
    seconds: float
    jobs: tuple[int, ...]
    utilization: float | None
    power_w: float | None


@dataclass(frozen=True)
class EndedAttempt:
    record: AttemptRecord
    team: str
    owner: str | None
    kind: str = "batch"


_COLUMNS = [c.name for c in schema.job_usage.columns]


def _row(r: Any) -> UsageRow:
    d = dict(r)
    d["allocation"] = allocation_from_json(d["allocation"])
    d["final"] = bool(d["final"])
    d["kind"] = d.get("kind") or "batch"  # rows from before version 7
    d["idle_gpu_seconds"] = d.get("idle_gpu_seconds") or 0.0
    return UsageRow(**d)


def _values(row: UsageRow) -> dict[str, Any]:
    d = {name: getattr(row, name) for name in _COLUMNS}
    d["allocation"] = allocation_to_json(row.allocation) if row.allocation is not None else None
    return d


class UsageStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    # ---- the accountant's side ------------------------------------------------------------

    def open_rows(self) -> dict[tuple[int, int], UsageRow]:
        """Rows of attempts not yet final (running, or ended while the head was down)."""
        u = schema.job_usage.c
        with self.store._read() as c:
            rows = c.execute(select(schema.job_usage).where(u.final.is_(False))).mappings().all()
        return {(r["job_id"], r["attempt"]): _row(r) for r in rows}

    def rows_of_jobs(self, job_ids: Iterable[int]) -> list[UsageRow]:
        ids = sorted(set(job_ids))
        if not ids:
            return []
        u = schema.job_usage.c
        with self.store._read() as c:
            rows = c.execute(select(schema.job_usage).where(u.job_id.in_(ids))).mappings().all()
        return [_row(r) for r in rows]

    def cost_of_other_attempts(self, job_id: int, attempt: int) -> float:
        """What a job's other attempts cost: the base its `max_cost` is checked against."""
        u = schema.job_usage.c
        with self.store._read() as c:
            v = c.execute(
                select(func.coalesce(func.sum(u.cost), 0.0)).where(and_(u.job_id == job_id, u.attempt != attempt))
            ).scalar_one()
        return float(v)

    def ended_attempts(self, since: float) -> list[EndedAttempt]:
        """Attempts that ended at or after `since` and have no final row yet."""
        a, j, u = schema.attempts.c, schema.jobs.c, schema.job_usage.c
        q = (
            select(a.job_id, a.attempt, a.started_at, a.ended_at, a.allocation, a.outcome, a.reason)
            .add_columns(a.work_lost_s, j.team, j.owner, j.kind)
            .join_from(schema.attempts, schema.jobs, j.id == a.job_id)
            .outerjoin(schema.job_usage, and_(u.job_id == a.job_id, u.attempt == a.attempt))
            .where(a.ended_at >= since, or_(u.final.is_(None), u.final.is_(False)))
        )
        with self.store._read() as c:
            rows = c.execute(q).all()
        return [
            EndedAttempt(
                AttemptRecord(
                    job_id=r[0],
                    attempt=r[1],
                    started_at=r[2],
                    ended_at=r[3],
                    allocation=allocation_from_json(r[4]),
                    outcome=r[5],
                    reason=r[6],
                    exit_codes=(),
                    work_lost_s=r[7],
                ),
                team=r[8],
                owner=r[9],
                kind=r[10] or "batch",
            )
            for r in rows
        ]

    def new_samples(self, after_id: int, limit: int = 50_000) -> list[RawSample]:
        """Raw telemetry rows written since `after_id` that name a holder, oldest first."""
        t = schema.gpu_samples.c
        q = (
            select(t.id, t.node, t.gpu, t.at, t.seconds, t.jobs, t.utilization, t.power_w)
            .where(and_(t.id > after_id, t.level == 0, t.jobs != ""))
            .order_by(t.id)
            .limit(limit)
        )
        with self.store._read() as c:
            rows = c.execute(q).all()
        return [
            RawSample(r[0], r[1], r[2], r[3], r[4], tuple(int(x) for x in r[5].strip(",").split(",") if x), r[6], r[7])
            for r in rows
        ]

    def last_sample_id(self) -> int:
        with self.store._read() as c:
            return int(c.execute(select(func.coalesce(func.max(schema.gpu_samples.c.id), 0))).scalar_one())

    def marks(self) -> dict[str, str]:
        m = schema.meta.c
        with self.store._read() as c:
            rows = c.execute(select(m.key, m.value).where(m.key.in_([SAMPLES_MARK, ATTEMPTS_MARK]))).all()
        return {r[0]: r[1] for r in rows}

    def save(self, rows: Sequence[UsageRow], marks: dict[str, str]) -> None:
        """Upsert rows and set watermarks, in one transaction."""
        if not rows and not marks:
            return
        with self.store._write() as c:
            if rows:
                c.execute(self.store.upsert(schema.job_usage), [_values(r) for r in rows])
            for key, value in marks.items():
                c.execute(self.store.upsert(schema.meta).values(key=key, value=value))

    # ---- readers ---------------------------------------------------------------------------

    def window(self, since: float | None, until: float | None, teams: Iterable[str] | None = None) -> list[UsageRow]:
        """Rows that overlap [since, until]; `teams` limits them to what the caller may see."""
        u = schema.job_usage.c
        q = select(schema.job_usage)
        if since is not None:
            q = q.where(u.accrued_until >= since)
        if until is not None:
            q = q.where(u.started_at <= until)
        if teams is not None:
            q = q.where(u.team.in_(list(teams)))
        with self.store._read() as c:
            rows = c.execute(q).mappings().all()
        return [_row(r) for r in rows]

    def job_names(self, job_ids: Iterable[int]) -> dict[int, str]:
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        j = schema.jobs.c
        with self.store._read() as c:
            rows = c.execute(select(j.id, j.name).where(j.id.in_(ids))).all()
        return {r[0]: r[1] for r in rows}

    def totals(self) -> dict[tuple[str, str], tuple[float, float, float]]:
        """All-time (GPU-seconds, cost, energy J) per (team, GPU model): the /metrics counters' base."""
        u = schema.job_usage.c
        q = select(u.team, u.gpu_model, func.sum(u.gpu_seconds), func.sum(u.cost), func.sum(u.energy_j)).group_by(
            u.team, u.gpu_model
        )
        with self.store._read() as c:
            rows = c.execute(q).all()
        return {(r[0], r[1]): (float(r[2]), float(r[3]), float(r[4])) for r in rows}
