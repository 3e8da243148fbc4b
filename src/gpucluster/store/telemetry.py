"""Telemetry in the store: GPU samples downsampled with age, node drain state, GPU health, job flags.

Why a module of its own: telemetry writes on its own thread and cadence, in batches (one
transaction per flush, whatever the number of GPUs), through the store's write lock, so the
scheduling loop waits at most one short transaction for it. The scheduling loop reads only the
drain state, which is cached here (one head per store: every write goes through this object).

Samples: level 0 rows are raw readings, kept `raw_s` (1 h); then merged into one-minute means
(level 1) kept `minute_s` (1 day); then one-hour means (level 2) kept until `retention_s`. Means
are weighted by the seconds each row covers, so the integral of power (energy) and of
utilisation over any window survives downsampling exactly; rows are merged only within one
(node, GPU, holders) group, so a job's samples are never mixed with another's. Accounting reads
`samples(job_id=...)`: per GPU, at, seconds, utilisation, power.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, insert, select, text

from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, Drain
from gpucluster.store import schema
from gpucluster.store.read_cache import ReadCache
from gpucluster.store.store import Store, allocation_from_json

RAW, MINUTE, HOUR = 0, 1, 2
LEVEL_SECONDS = {MINUTE: 60.0, HOUR: 3600.0}
NODE_WIDE = -1  # gpu_health.gpu for a problem of the whole node (it stopped reporting)


@dataclass(frozen=True)
class GpuSample:
    node: str
    gpu: int
    at: float
    seconds: float  # the period this row covers, from `at`
    jobs: tuple[int, ...] = ()  # the jobs holding the GPU then
    utilization: float | None = None  # percent
    memory_used_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    level: int = RAW

    @property
    def energy_j(self) -> float:
        return (self.power_w or 0.0) * self.seconds


@dataclass(frozen=True)
class NodeState:
    name: str
    drained: bool
    reason: str
    source: str  # user | health
    since: float
    until: float | None = None  # a user's drain's planned end (drain --until); None: none set


@dataclass(frozen=True)
class GpuProblem:
    node: str
    gpu: int  # NODE_WIDE for the node itself
    kind: str  # ecc | xid | temperature | silent
    problem: str
    since: float


@dataclass(frozen=True)
class JobFlag:
    job_id: int
    flag: str
    since: float
    message: str


def jobs_key(jobs: Iterable[int]) -> str:
    ids = sorted(set(jobs))
    return f",{','.join(map(str, ids))}," if ids else ""


def _jobs_of(key: str) -> tuple[int, ...]:
    return tuple(int(x) for x in key.strip(",").split(",") if x)


_MEASURES = ("utilization", "memory_used_mb", "temperature_c", "power_w", "sm_clock_mhz", "memory_clock_mhz")


@dataclass(frozen=True)
class Holding:
    """A running job as telemetry needs it: where it runs, its launch handle, whether stopping."""

    id: int
    allocation: Allocation
    launch: dict[str, Any] | None
    stop_reason: str | None
    kind: str = "batch"  # or session: idle reclaim follows the policy's interactive class


class TelemetryStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._states = ReadCache(lambda: self.read_states())  # looked up at each read: patchable

    def holdings(self) -> list[Holding]:
        """Running jobs with an allocation; only the columns telemetry reads (no spec parsing:
        at 128 running jobs that halves the cost of a telemetry round)."""
        j = schema.jobs.c
        q = select(j.id, j.allocation, j.launch, j.stop_reason, j.kind).where(j.state == JobState.RUNNING.value)
        with self.store._read() as c:
            rows = c.execute(q).all()
        return [
            Holding(r[0], a, json.loads(r[2]) if r[2] else None, r[3], r[4] or "batch")
            for r in rows
            if (a := allocation_from_json(r[1])) is not None
        ]

    # ---- samples ----------------------------------------------------------------------------

    def add_samples(self, samples: Sequence[GpuSample]) -> None:
        """One transaction for the whole batch."""
        if not samples:
            return
        rows = [
            {
                "node": s.node,
                "gpu": s.gpu,
                "level": s.level,
                "at": s.at,
                "seconds": s.seconds,
                "jobs": jobs_key(s.jobs),
                **{m: getattr(s, m) for m in _MEASURES},
            }
            for s in samples
        ]
        with self.store._write() as c:
            c.execute(insert(schema.gpu_samples), rows)

    def downsample(
        self, now: float, raw_s: float = 3600.0, minute_s: float = 86400.0, retention_s: float = 30 * 86400.0
    ) -> int:
        """Merge old raw rows into minute means, old minute rows into hour means, drop rows past
        retention; returns the number of rows removed. One transaction."""
        removed = 0
        # Buckets are floored: SQLite's CAST truncates (the same for times after 1970), while
        # PostgreSQL's rounds, which would put half of each bucket into the next one.
        floor = "CAST(at / :w AS INTEGER)" if self.store.dialect == "sqlite" else "FLOOR(at / :w)"
        with self.store._write() as c:
            for level, keep_s in ((RAW, raw_s), (MINUTE, minute_s)):
                width = LEVEL_SECONDS[level + 1]
                # Whole buckets only: a bucket is merged once, when all of it has aged out.
                cutoff = (now - keep_s) // width * width
                weighted = ", ".join(
                    f"SUM({m} * seconds) / NULLIF(SUM(CASE WHEN {m} IS NULL THEN 0 ELSE seconds END), 0)"
                    for m in _MEASURES
                )
                c.execute(
                    text(
                        f"INSERT INTO gpu_samples (node, gpu, level, at, seconds, jobs, {', '.join(_MEASURES)}) "
                        f"SELECT node, gpu, :next, {floor} * :w AS bucket, SUM(seconds), jobs, "
                        f"{weighted} FROM gpu_samples WHERE level = :level AND at < :cutoff "
                        "GROUP BY node, gpu, jobs, bucket"
                    ),
                    {"next": level + 1, "w": width, "level": level, "cutoff": cutoff},
                )
                res = c.execute(
                    delete(schema.gpu_samples).where(
                        and_(schema.gpu_samples.c.level == level, schema.gpu_samples.c.at < cutoff)
                    )
                )
                removed += res.rowcount
            res = c.execute(delete(schema.gpu_samples).where(schema.gpu_samples.c.at < now - retention_s))
            removed += res.rowcount
        return removed

    def samples(
        self,
        node: str | None = None,
        gpu: int | None = None,
        since: float | None = None,
        until: float | None = None,
        job_id: int | None = None,
        level: int | None = None,
    ) -> list[GpuSample]:
        """Samples of every resolution, oldest first; `job_id`: only while that job held the GPU."""
        t = schema.gpu_samples.c
        q = select(schema.gpu_samples).order_by(t.at, t.node, t.gpu)
        if node is not None:
            q = q.where(t.node == node)
        if gpu is not None:
            q = q.where(t.gpu == gpu)
        if since is not None:
            q = q.where(t.at + t.seconds > since)
        if until is not None:
            q = q.where(t.at < until)
        if job_id is not None:
            q = q.where(t.jobs.like(f"%,{int(job_id)},%"))
        if level is not None:
            q = q.where(t.level == level)
        with self.store._read() as c:
            rows = c.execute(q).mappings().all()
        return [
            GpuSample(
                node=r["node"],
                gpu=r["gpu"],
                at=r["at"],
                seconds=r["seconds"],
                jobs=_jobs_of(r["jobs"]),
                level=r["level"],
                **{m: r[m] for m in _MEASURES},
            )
            for r in rows
        ]

    def count_samples(self) -> dict[int, int]:
        """Rows per level."""
        with self.store._read() as c:
            rows = c.execute(text("SELECT level, COUNT(*) FROM gpu_samples GROUP BY level")).all()
        return {int(r[0]): int(r[1]) for r in rows}

    # ---- node drain state ---------------------------------------------------------------------

    def node_states(self) -> dict[str, NodeState]:
        """Every node with a recorded state (drained or not); cached between this store's writes
        (the same dict object until then: the head's node feed compares by identity). Another
        process's writes are seen after `forget_states`."""
        return self._states.get()

    def read_states(self) -> dict[str, NodeState]:
        """The node states read now, bypassing the cache (check mode's fresh build)."""
        with self.store._read() as c:
            rows = c.execute(select(schema.node_states)).mappings().all()
        return {
            r["name"]: NodeState(r["name"], bool(r["drained"]), r["reason"], r["source"], r["since"], r["until"])
            for r in rows
        }

    def forget_states(self) -> None:
        """Read the node states again next time: another process may have written them."""
        self._states.forget()

    def drains(self, states: Mapping[str, NodeState] | None = None) -> dict[str, Drain]:
        """Every drained node's reason and planned end, as the core's admission reads them (of
        `states` if given, else of the cached ones)."""
        states = self.node_states() if states is None else states
        return {n: Drain(s.reason, s.until) for n, s in states.items() if s.drained}

    def end_drains_due(self, now: float) -> list[str]:
        """Undrain the nodes whose drain's planned end has come; the nodes undrained."""
        due = [n for n, s in self.node_states().items() if s.drained and s.until is not None and s.until <= now]
        return [n for n in due if self.set_drained(n, False, "drain ended as planned", "user", now)]

    def set_drained(
        self, node: str, drained: bool, reason: str, source: str, now: float, until: float | None = None
    ) -> bool:
        """Drain or undrain a node; False if it already was in that state (nothing written).

        Draining a drained node again replaces why (and by whom) and its planned end, but keeps
        since when. A health drain sets no end: it lasts until someone undrains the node."""
        current = self.node_states().get(node)
        if (
            current is not None
            and current.drained == drained
            and (not drained or (current.reason == reason and current.until == until))
        ):
            return False
        if current is None and not drained:
            return False
        since = current.since if current is not None and current.drained and drained else now
        with self.store._write() as c:
            c.execute(
                self.store.upsert(schema.node_states).values(
                    name=node,
                    drained=drained,
                    reason=reason,
                    source=source,
                    since=since,
                    until=until if drained else None,
                )
            )
        self.forget_states()
        return True

    # ---- GPU health ---------------------------------------------------------------------------

    def problems(self) -> dict[tuple[str, int], GpuProblem]:
        with self.store._read() as c:
            rows = c.execute(select(schema.gpu_health)).mappings().all()
        return {
            (r["node"], r["gpu"]): GpuProblem(r["node"], r["gpu"], r["kind"], r["problem"], r["since"]) for r in rows
        }

    def set_problem(self, p: GpuProblem) -> None:
        with self.store._write() as c:
            c.execute(self.store.upsert(schema.gpu_health).values(**p.__dict__))

    def clear_problems(self, keys: Iterable[tuple[str, int]]) -> None:
        keys = list(keys)
        if not keys:
            return
        h = schema.gpu_health.c
        with self.store._write() as c:
            for node, gpu in keys:
                c.execute(delete(schema.gpu_health).where(and_(h.node == node, h.gpu == gpu)))

    # ---- job flags ----------------------------------------------------------------------------

    def flags(self, job_id: int | None = None) -> list[JobFlag]:
        f = schema.job_flags.c
        q = select(schema.job_flags).order_by(f.job_id, f.flag)
        if job_id is not None:
            q = q.where(f.job_id == job_id)
        with self.store._read() as c:
            rows = c.execute(q).mappings().all()
        return [JobFlag(r["job_id"], r["flag"], r["since"], r["message"]) for r in rows]

    def set_flag(self, flag: JobFlag) -> None:
        with self.store._write() as c:
            c.execute(self.store.upsert(schema.job_flags).values(**flag.__dict__))

    def clear_flag(self, job_id: int, flag: str) -> None:
        f = schema.job_flags.c
        with self.store._write() as c:
            c.execute(delete(schema.job_flags).where(and_(f.job_id == job_id, f.flag == flag)))
