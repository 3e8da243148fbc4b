"""The store: every durable fact of the head, behind a small typed interface.

SQLite (a file in the data dir, the default) or PostgreSQL (`gpucluster up --database URL`).
Writers take the database's write lock up front (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: a
transaction-scoped advisory lock) so two writers never deadlock on a lock upgrade nor interleave,
and state changes are compare-and-set on the current state: a cancel and a launch racing on one
job cannot both win. Every commit is durable (SQLite: WAL, synchronous=FULL; PostgreSQL:
synchronous_commit=on) before the API acknowledges it, except the queued jobs' wait reasons, which
the loop derives again each cycle (`_write(durable=False)`). Readers see one snapshot per transaction
(SQLite's deferred BEGIN; PostgreSQL's REPEATABLE READ).

One head per database: a head claims the lease (store/lease.py) and every write transaction it
makes checks, under the write lock, that it still holds it (LeaseLost otherwise, rolled back).
A database that cannot be reached (PostgreSQL down or restarting, SQLite locked too long) is a
DatabaseUnavailable, said once in the log per outage; pooled connections are checked before use
(pool_pre_ping), so the first call after the database returns succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import (
    URL,
    Connection,
    Engine,
    RowMapping,
    Select,
    String,
    Table,
    Update,
    and_,
    bindparam,
    case,
    cast,
    create_engine,
    event,
    exists,
    func,
    insert,
    literal,
    make_url,
    or_,
    select,
    update,
)
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.pool import PoolProxiedConnection

from gpucluster.containers import stored_name
from gpucluster.core.eligibility import Target, array_target, array_times
from gpucluster.core.lifecycle import StopReason, stop_overrides
from gpucluster.core.limits import queued_refusal
from gpucluster.core.policy import Limits
from gpucluster.core.selection import Selection, selection_of
from gpucluster.core.states import JobState, can_transition
from gpucluster.core.types import (
    Allocation,
    Dependency,
    DependencyKind,
    Gpu,
    JobRequest,
    Node,
    NodeSlice,
    Priority,
    RunningJob,
    Wait,
)
from gpucluster.errors import GpuclusterError
from gpucluster.models import JobSpec
from gpucluster.store import driver_sql, migrate, schema
from gpucluster.store import lease as leases
from gpucluster.store.lease import DEFAULT_LEASE_S, Holder, Lease
from gpucluster.store.read_cache import ReadCache
from gpucluster.store.specs import spec_of
from gpucluster.waits_text import to_json as wait_json

# PostgreSQL advisory lock key ("gpuclust" in ASCII): every write transaction holds it.
WRITE_LOCK_KEY = 0x67707563_6C757374
WRITES_CHANNEL = "gpucluster_writes"  # PostgreSQL: every write transaction notifies it at commit
IDS_PER_QUERY = 5000  # jobs named in one query's IN list (list_jobs(ids=...))


log = logging.getLogger("gpucluster.store")


# The statements of a job's start and end, built once: building them per call (and SQLAlchemy
# checking every value of `.values()`) cost the loop more than executing them. The SET clause
# is the parameters' columns; `match_id` is the WHERE's.
_ADD_EVENT = insert(schema.job_events)
# A submission's row, ids back in the order given (a lone client's batch is one row: building the
# statement each time cost more than executing it)
_ADD_JOBS = insert(schema.jobs).returning(schema.jobs.c.id, sort_by_parameter_order=True)
_GET_JOB = select(schema.jobs).where(schema.jobs.c.id == bindparam("match_id"))  # read at each start and end
# The scheduler's view of the queue (`Store.queued_requests`), built once: the head reads the jobs
# queued since its last read every cycle, and building the select each time was most of an empty
# read's 170 us (issue 18).
_QUEUED = select(
    schema.jobs.c.id,
    schema.jobs.c.gpus,
    schema.jobs.c.priority,
    schema.jobs.c.submitted_at,
    schema.jobs.c.team,
    schema.jobs.c.request,
    case((schema.jobs.c.request.is_(None), schema.jobs.c.spec), else_=None),
    schema.jobs.c.queued_at,
    schema.jobs.c.not_before,
    schema.jobs.c.held,
    schema.jobs.c.array_id,
    schema.jobs.c.owner,
).where(schema.jobs.c.state == JobState.QUEUED.value)
_QUEUED_AFTER = _QUEUED.where(schema.jobs.c.id > bindparam("after_id"))
# Jobs by id (`Store.list_jobs(ids=...)`: the loop's starting and ending jobs, every cycle).
_JOBS = select(schema.jobs)
_JOBS_IN = _JOBS.where(schema.jobs.c.id.in_(bindparam("ids", expanding=True)))
# The running jobs' whole rows (`Store.running_records`, after every start and end), built once too.
_RUNNING_ROWS = select(schema.jobs).where(schema.jobs.c.state == JobState.RUNNING.value)
# `Store.attained_gpu_seconds`, built once: the head reads it every plan under `las`, the
# default ordering, and building and compiling it each time was most of the read's 0.5 ms.
_ATTAINED = (
    select(
        schema.attempts.c.job_id, schema.attempts.c.started_at, schema.attempts.c.ended_at, schema.attempts.c.allocation
    )
    .select_from(schema.attempts.join(schema.jobs, schema.attempts.c.job_id == schema.jobs.c.id))
    .where(
        schema.jobs.c.state.in_([JobState.QUEUED.value, JobState.RUNNING.value]),
        schema.attempts.c.started_at.is_not(None),
    )
)
_RUNNING_ROWS_IN = _RUNNING_ROWS.where(schema.jobs.c.id.in_(bindparam("ids", expanding=True)))
_MOVES: dict[tuple[str, ...], Update] = {}
# The queued jobs' waits (`Store.set_wait_reasons`, after each plan), built once; its SET from
# the parameters' keys (reason, wait_reason, estimated_start).
_SET_WAITS = (
    update(schema.jobs)
    .where(schema.jobs.c.id == bindparam("match_id"))
    .where(schema.jobs.c.state == JobState.QUEUED.value)
)
_JOB_COLUMNS = frozenset(schema.jobs.c.keys())
_CONNECTION_SERIAL = itertools.count(1)  # names each writer connection in `others_wrote_token`


def _job_values(values: dict[str, Any]) -> dict[str, Any]:
    """`values` if each names a column of jobs: a parameter that names none would be dropped
    from the SET clause without a word, where `.values()` refused it."""
    if not values.keys() <= _JOB_COLUMNS:
        raise ArgumentError(f"not columns of jobs: {sorted(values.keys() - _JOB_COLUMNS)}")
    return values


def _move_from(states: tuple[str, ...]) -> Update:
    """UPDATE jobs SET ... WHERE id = :match_id AND state IN (states), one per set of states."""
    stmt = _MOVES.get(states)
    if stmt is None:
        j = schema.jobs.c
        stmt = _MOVES[states] = update(schema.jobs).where(j.id == bindparam("match_id")).where(j.state.in_(states))
    return stmt


class StoreError(RuntimeError, GpuclusterError):
    """The store cannot be used (locked by another head, unreadable, newer schema)."""


class DatabaseUnavailable(StoreError):
    """The database cannot be reached now (a PostgreSQL restart, a network cut, SQLite locked
    past its busy timeout). Nothing was changed; the same call succeeds once it is back (the API:
    503 with this message)."""


class LeaseHeld(StoreError):
    """Another head holds the database's lease and is alive: this one must not start."""


class QueueLimitReached(StoreError):
    """A submission would queue more jobs than its user may (the policy's `max_queued_jobs`,
    core/limits.py); nothing was stored. Checked in the write transaction, so two submissions at
    once cannot both pass."""


class LeaseLost(StoreError):
    """This head no longer holds the database's lease: another head took it over. The write was
    rolled back. Permanent (epochs only grow): this head must stop scheduling and touch no job."""


class DataDirUnwritable(StoreError):
    """A write failed because the data dir is full or read-only.

    SQLite rolled the transaction back, so the store keeps its last good state, and the next
    write succeeds once space (or write access) is back: callers answer with this message (the
    API: 507 when full, 503 when read-only) instead of failing with a stack trace.
    """

    def __init__(self, message: str, full: bool) -> None:
        super().__init__(message)
        self.full = full


_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def unwritable(data_dir: Path, e: BaseException) -> DataDirUnwritable | None:
    """`e` as a DataDirUnwritable if it says the disk is full or read-only; else None."""
    cause = getattr(e, "orig", None) or e
    text = str(cause)
    low = text.lower()
    code = cause.errno if isinstance(cause, OSError) else None
    if code in _FULL_ERRNOS or "disk is full" in low:
        full = True
    elif (
        code in _READ_ONLY_ERRNOS
        or "readonly" in low
        or "read-only" in low
        or ("unable to open database file" in low and _read_only_fs(data_dir))  # SQLite on a read-only mount
    ):
        full = False
    elif "disk i/o error" in low:  # what SQLite says for either; the free space tells which
        try:
            full = shutil.disk_usage(data_dir).free < 1024 * 1024
        except OSError:
            full = False
    else:
        return None
    what = "full" if full else "read-only"
    todo = "free some space" if full else "make it writable"
    return DataDirUnwritable(f"the data dir {data_dir} is {what}: {text}; nothing was changed, {todo} and retry", full)


def _read_only_fs(path: Path) -> bool:
    """Whether `path` is on a filesystem mounted read-only (where root cannot write either)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _postgres_unwritable(where: str, e: BaseException) -> DataDirUnwritable | None:
    """PostgreSQL's disk full (53100) or read-only transaction (25006) as a DataDirUnwritable."""
    cause = getattr(e, "orig", None) or e
    code = getattr(cause, "sqlstate", None)
    if code not in ("53100", "25006"):
        return None
    full = code == "53100"
    what, todo = ("full", "free some space") if full else ("read-only", "make it writable")
    return DataDirUnwritable(f"the database {where} is {what}: {cause}; nothing was changed, {todo} and retry", full)


def _target(where: Path | str) -> tuple[URL, Path | None]:
    """The URL of a store location, and its file for SQLite."""
    if isinstance(where, str) and "://" in where:
        try:
            url = make_url(where)
        except ArgumentError:
            raise StoreError(f"not a database URL: {where!r} (e.g. postgresql://user@host:5432/db)") from None
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+psycopg")
        if url.get_backend_name() == "sqlite":
            if not url.database or url.database == ":memory:":
                raise StoreError("a SQLite store needs a file: sqlite:////path/to/state.db")
            return url, Path(url.database)
        return url, None
    path = Path(where)
    return URL.create("sqlite", database=str(path)), path


# A writer's session idle inside a transaction this long is ended by the server (PostgreSQL's
# idle_in_transaction_session_timeout). Why: every write transaction holds the one advisory write
# lock, so a head frozen mid-transaction (SIGSTOP, a paused VM, a debugger) would otherwise hold it
# forever, and the next head, whose lease takeover is itself a write, would wait for it forever
# instead of taking over once the frozen head's lease expires. A live head never sits between two
# statements of a write for anything like this long; if a frozen one wakes, its transaction fails
# as a database outage does and its next write finds the lease gone (LeaseLost).
FROZEN_WRITER_TIMEOUT_S = 30.0


def _postgres_engine(url: URL, write: bool, writer_id: str = "") -> Engine:
    options = (
        f"-c synchronous_commit=on -c idle_in_transaction_session_timeout={int(FROZEN_WRITER_TIMEOUT_S * 1000)}"
        if write
        else "-c default_transaction_read_only=on"
    )
    try:
        engine = create_engine(
            url,
            # Readers see one snapshot per transaction, as on SQLite; the single writer (the
            # advisory lock below) gets nothing from more than READ COMMITTED.
            isolation_level="READ COMMITTED" if write else "REPEATABLE READ",
            pool_size=5,
            max_overflow=30,
            pool_pre_ping=True,  # a server restart leaves dead connections in the pool
            connect_args={"connect_timeout": 10, "application_name": "gpucluster", "options": options},
        )
    except ImportError as e:
        raise StoreError(f"PostgreSQL needs the psycopg driver: pip install 'gpucluster[postgres]' ({e})") from None
    if write:

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # The one writer's lock, and a notification sent at commit (none on a rollback) that
            # names the writing store: another store's listener knows someone else wrote
            # (`Store.others_wrote_token`). One statement, one round trip.
            conn.exec_driver_sql(
                f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY}), pg_notify('{WRITES_CHANNEL}', %(w)s)",
                {"w": writer_id},
            )

    return engine


@dataclass(frozen=True)
class JobRecord:
    id: int
    name: str
    team: str
    state: JobState
    priority: Priority
    gpus: float
    gpu_type: str | None
    spec: JobSpec
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    reason: str
    attempt: int
    allocation: Allocation | None
    launch: dict[str, Any] | None
    stop_reason: str | None
    stop_requested_at: float | None
    term_sent: bool
    kill_sent: bool
    wait_reason: str | None = None
    estimated_start: float | None = None
    stop_message: str | None = None
    last_checkpoint_at: float | None = None
    not_before: float | None = None
    restarts: int = 0
    progress_step: int | None = None
    progress_at: float | None = None
    checkpoint_step: int | None = None
    owner: str | None = None  # who submitted it (None: before identities existed)
    failed_rank: int | None = None  # the process that failed first (stop_reason "failure")
    held: bool = False
    array_id: int | None = None  # an array's element: its array (the first element's id) ...
    array_index: int | None = None  # ... and its index there

    def request(self) -> JobRequest:
        return request_from(
            self.id,
            self.gpus,
            self.priority,
            self.submitted_at,
            self.team,
            request_json(self.spec),
            not_before=self.not_before,
            user=self.owner or "",
        )


# A whole read's running jobs kept for the next (`Store.running_records`): job id -> (hash of
# its row, its running view and stop reason, or None where it has none, its record).
KnownRunning = dict[int, tuple[int, "tuple[RunningJob, str | None] | None", JobRecord]]


@dataclass(frozen=True)
class AttemptRecord:
    """An ended attempt: when and where it ran, how it ended, and the work it lost."""

    job_id: int
    attempt: int
    started_at: float | None
    ended_at: float
    allocation: Allocation | None
    outcome: str  # succeeded, failed, preempted, cancelled, not_started
    reason: str
    exit_codes: tuple[int | None, ...]
    work_lost_s: float | None
    cpu_s: float | None = None  # all its processes, from their cgroups; None: no cgroups there
    memory_peak_bytes: int | None = None  # each process's cgroup's peak, summed
    pull_s: float | None = None  # a container job's image pull (the longest of its processes'); None: none


@dataclass(frozen=True)
class EventRecord:
    at: float
    state: JobState
    reason: str


@dataclass(frozen=True)
class NodeRecord:
    node: Node
    virtual: bool


def allocation_to_json(a: Allocation) -> str:
    out: list[dict[str, Any]] = []
    for s in a.slices:
        d: dict[str, Any] = {"node": s.node, "gpu_indices": list(s.gpu_indices)}
        if s.share < 1:
            d["share"] = s.share
            d["memory_mb"] = s.memory_mb
        if s.cpus:
            d["cpus"] = s.cpus
        if s.host_memory_mb:
            d["host_memory_mb"] = s.host_memory_mb
        out.append(d)
    return json.dumps(out)


def allocation_from_json(text: str | None) -> Allocation | None:
    if not text:
        return None
    return Allocation(
        tuple(
            NodeSlice(
                d["node"],
                tuple(d["gpu_indices"]),
                d.get("share", 1.0),
                d.get("memory_mb"),
                d.get("cpus", 0.0),
                d.get("host_memory_mb", 0),
            )
            for d in json.loads(text)
        )
    )


def request_json(spec: JobSpec, after: tuple[Dependency, ...] = ()) -> str:
    """The scheduler-facing part of a spec, compact: what `queued_requests` needs besides columns.
    `after`: its dependencies as resolved at submit (a target id that names an array means the
    whole array; aftercorr becomes one dependency per element)."""
    d: dict[str, Any] = {}
    if after:
        d["d"] = [[a.kind.value, a.job_id, 1 if a.array else 0] for a in after]
    if spec.gpu_types:
        d["t"] = list(spec.gpu_types)
    if spec.gpu_memory_mb is not None:
        d["m"] = spec.gpu_memory_mb
    if spec.min_gpu_memory_mb is not None:
        d["mm"] = spec.min_gpu_memory_mb
    if spec.time_limit is not None:
        d["tl"] = spec.time_limit
    if spec.nodes is not None:
        d["n"] = spec.nodes
    if spec.min_gpus is not None:
        d["mn"] = spec.min_gpus
    if spec.begin is not None:
        d["b"] = spec.begin
    if spec.nodelist is not None:
        d["nl"] = sorted(set(spec.nodelist))
    if spec.exclude:
        d["xn"] = sorted(set(spec.exclude))
    if spec.constraint:
        d["c"] = spec.constraint
    if spec.exclusive:
        d["x"] = 1
    if spec.image and (image := stored_name(spec.image)) is not None:
        d["i"] = image  # a placement tie-breaker only (core/image_affinity.py); absent in older rows
    if spec.cpus is not None:
        d["cp"] = spec.cpus
    if spec.mem is not None:
        d["hm"] = spec.mem_mb
    return json.dumps(d, separators=(",", ":"))


def _queued_request(r: Any) -> JobRequest:
    """A queued job's request from a row of `Store.queued_requests`' select."""
    return request_from(
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        r[5] if r[5] is not None else _request_of_spec(r[6]),
        r[7],
        r[8],
        held=bool(r[9]),
        array_id=r[10],
        user=r[11] or "",
    )


def request_from(
    job_id: int,
    gpus: float,
    priority: int,
    submitted_at: float,
    team: str,
    request: str | None,
    queued_at: float | None = None,
    not_before: float | None = None,
    held: bool = False,
    array_id: int | None = None,
    user: str = "",
) -> JobRequest:
    d = json.loads(request) if request else {}
    deps = d.get("d")
    return JobRequest(
        job_id=job_id,
        gpus=gpus,
        gpu_types=tuple(d.get("t", ())),
        priority=Priority(priority),
        submitted_at=submitted_at,
        team=team,
        gpu_memory_mb=d.get("m"),
        min_gpu_memory_mb=d.get("mm"),
        time_limit_s=d.get("tl"),
        nodes=d.get("n"),
        queued_at=queued_at,
        min_gpus=d.get("mn"),
        not_before=not_before,
        begin=d.get("b"),
        held=held,
        after=tuple(Dependency(DependencyKind(k), i, bool(a)) for k, i, a in deps) if deps else (),
        array_id=array_id,
        user=user,
        selection=_selection(d) if ("nl" in d or "xn" in d or "c" in d or "x" in d) else None,
        image=d.get("i"),
        cpus=d.get("cp", 0.0),
        mem_mb=d.get("hm", 0),
    )


def _selection(d: dict[str, Any]) -> Selection | None:
    """A request's node selection (`request_json`'s nl, xn, c, x)."""
    return selection_of(d.get("nl"), d.get("xn", ()), d.get("c"), bool(d.get("x")))


class Store:
    """The head's state in SQLite (a file; the default) or PostgreSQL (a URL).

    `Store(path)`: a SQLite file. `Store("postgresql://user@host/db")`: a PostgreSQL database
    (driver psycopg 3; extra `postgres`). Either way, opening brings the schema up to date
    (store/migrate.py) and every write is one durable transaction taken under one lock:
    SQLite's write lock (`BEGIN IMMEDIATE`), or on PostgreSQL a transaction-scoped advisory
    lock, so writers from any number of processes never interleave there either.
    """

    def __init__(self, path: Path | str) -> None:
        self.url, self.path = _target(path)
        self.dialect = self.url.get_backend_name()
        self.display = self.url.render_as_string(hide_password=True) if self.path is None else str(self.path)
        self._durable = True  # False only inside `_write(durable=False)`, under the write lock
        # A job's per-job writes (its row, events, state changes, attempt) as plain SQL through
        # SQLite's driver (store/driver_sql.py); SQLAlchemy's statements on PostgreSQL.
        self._driver_sql = self.dialect == "sqlite"
        # PostgreSQL: this store's name in its writes' notifications, and the connection that
        # listens for the others' (`others_wrote_token`), opened on first use.
        self._writer_id = f"{os.getpid()}-{next(_CONNECTION_SERIAL)}-{time.time_ns()}"
        self._listener: Any = None
        self._listener_serial = 0
        self._others_writes = 0
        self._listener_lock = threading.Lock()
        self._writer = self._engine(self.url, write=True)
        self._reader = self._engine(self.url, write=False)
        self._write_lock = threading.Lock()
        # The open transaction of `batch`, and its thread: that thread's writes join it.
        self._batch: Connection | None = None
        self._batch_thread: int | None = None
        # The node rows, cached between this store's writes; another process's are seen by
        # `forget_nodes` (the head's node feed calls it when `others_wrote_token` moves).
        self._nodes = ReadCache(lambda: self.read_nodes())  # looked up at each read: patchable
        self._upserts: dict[str, Any] = {}
        self.lease: Lease | None = None  # held by this store's head (claim); every write checks it
        self.lease_lost: str | None = None  # why not any more, once a write found it taken
        self._lease_seen: tuple[Lease, str] | None = None  # (claim, row text) a write last found it in
        self._outage_since: float | None = None  # monotonic, while the database is unreachable
        self._outage_lock = threading.Lock()
        # Told the id of each job whose running view (`running_rows`) or record a write may have
        # changed while it runs: the head's event-fed running jobs (head/running_cache.py). Called after the write, from
        # the writer's thread, whether or not it committed (a told job is only read again).
        self._running_watchers: list[Callable[[int], None]] = []
        # Such writes begun and not yet told, and how many ever began (`running_changes`).
        self._running_changes_lock = threading.Condition()
        self._running_changing = 0
        self._running_changes_begun = 0
        try:
            with self._writer.begin() as c:
                self.migrated = migrate.prepare(c)
        except migrate.NewerSchema as e:
            self.close()
            raise StoreError(f"{self.display} was written by a newer gpucluster ({e}); upgrade first") from None
        except (OperationalError, DBAPIError) as e:
            self.close()
            raise StoreError(f"cannot open the state database {self.display}: {e.orig}") from e

    def _engine(self, url: URL, write: bool) -> Engine:
        if self.dialect == "postgresql":
            return _postgres_engine(url, write, self._writer_id)
        if self.dialect != "sqlite":
            raise StoreError(f"unsupported database {self.display}: use a SQLite file or a postgresql:// URL")
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        begin = "BEGIN IMMEDIATE" if write else "BEGIN"

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, below
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # Through the driver (store/driver_sql.py): this runs at every transaction.
            if write:  # SQLite takes the level only outside a transaction; set it when it changes
                level = "FULL" if self._durable else "NORMAL"
                if conn.info.get("synchronous") != level:
                    driver_sql.run(conn, f"PRAGMA synchronous={level}")
                    conn.info["synchronous"] = level
            driver_sql.run(conn, begin)

        return engine

    def upsert(self, table: Table) -> Any:
        """An INSERT that replaces the row with the same primary key (SQLite's INSERT OR REPLACE,
        PostgreSQL's INSERT ... ON CONFLICT DO UPDATE of every other column)."""
        stmt = self._upserts.get(table.name)
        if stmt is None:
            if self.dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert as pg_insert

                ins = pg_insert(table)
                keys = [c.name for c in table.primary_key.columns]
                rest = {c.name: ins.excluded[c.name] for c in table.columns if c.name not in keys}
                stmt = ins.on_conflict_do_update(index_elements=keys, set_=rest)
            else:
                stmt = insert(table).prefix_with("OR REPLACE")
            self._upserts[table.name] = stmt
        return stmt

    def claim(
        self,
        holder: Holder | None = None,
        duration_s: float = DEFAULT_LEASE_S,
        holds_data_dir: bool = False,
        say: Any = None,
        sleep: Any = time.sleep,
    ) -> Lease:
        """Take the database's lease (store/lease.py): from now on every write checks it.

        Free, expired, released, or held by a head that is certainly dead (this machine, and the
        data dir whose lock the caller holds when `holds_data_dir`, or a pid that is gone): taken
        at once, with the next epoch. Held by another head: watched until it expires (taken
        then: its holder stopped renewing) or is renewed (LeaseHeld: its holder is alive).
        `say(line)` tells the operator why the head waits.
        """
        holder = holder or Holder.this_process()
        self.lease = self.lease_lost = None  # the claim's own transactions check nothing
        first: Lease | None = None
        deadline: float | None = None
        while True:
            with self._write() as c:
                got, found, now = leases.try_take(c, holder, duration_s, holds_data_dir)
            if got is not None:
                self.lease, self.lease_lost = got, None
                if found is not None and found.holder != holder:
                    how = (
                        "which released it"
                        if found.expires_at == 0
                        else "whose lease had expired"
                        if found.expires_at <= now
                        else "which is gone"
                    )
                    log.log(
                        logging.INFO if found.expires_at == 0 else logging.WARNING,
                        "took over the database's lease (epoch %d) from %s, %s",
                        got.epoch,
                        found.holder.describe(),
                        how,
                    )
                return got
            assert found is not None
            if first is None:
                first = found
                deadline = time.monotonic() + min(found.expires_at - now, found.duration_s) + 2.0
                if say is not None:
                    say(
                        f"the database {self.display} is leased to {found.holder.describe()} for "
                        f"{found.expires_at - now:.0f} s more; waiting: it is taken over if that head does not "
                        "renew it, refused if it does"
                    )
            elif (
                not found.same_claim(first)
                or found.renewed_at != first.renewed_at
                or time.monotonic() > (deadline or 0)
            ):
                raise LeaseHeld(
                    f"another gpucluster head is using the database {self.display}: {found.holder.describe()} "
                    f"holds its lease (epoch {found.epoch}) and renews it; stop it first"
                )
            sleep(0.2)

    def renew(self) -> Lease:
        """Extend the lease by its duration from now. LeaseLost if another head took it over
        (even after it expired: a lease nobody else took is still this head's);
        DatabaseUnavailable if the database cannot be reached (retry)."""
        mine = self.lease
        if mine is None:
            raise StoreError("renew: this store holds no lease (claim first)")
        with self._write() as c:  # checks that the lease is still ours
            now = leases.db_now(c)
            new = Lease(mine.holder, mine.epoch, now + mine.duration_s, now, mine.duration_s)
            leases.write(c, new, existed=True)
        self.lease = new
        return new

    def release(self) -> None:
        """Give the lease up (a clean stop): the next head takes it at once, and this store
        writes nothing more (LeaseLost). Nothing if the lease was lost already."""
        mine = self.lease
        if mine is None or self.lease_lost is not None:
            return
        with self._write() as c:
            now = leases.db_now(c)
            leases.write(c, Lease(mine.holder, mine.epoch, 0.0, now, mine.duration_s), existed=True)
        self.lease_lost = "this head released the database's lease (it is stopping): it changes nothing any more"

    def _check_lease(self, conn: Connection) -> None:
        """In a write transaction, under the write lock: does this head still hold the lease?"""
        mine = self.lease
        if mine is None:
            return
        if self.lease_lost is None:
            raw = leases.read_raw(conn)
            seen = self._lease_seen
            if raw is not None and seen is not None and seen[0] is mine and seen[1] == raw:
                return  # the very row this same claim was last checked against: unchanged
            found = Lease.from_json(raw) if raw is not None else None
            if raw is not None and found is not None and found.same_claim(mine):
                self._lease_seen = (mine, raw)
                return
            self.lease_lost = leases.lost_message(mine, found)
            log.error("%s", self.lease_lost)
        raise LeaseLost(self.lease_lost)

    def close(self) -> None:
        self._writer.dispose()
        self._reader.dispose()
        with self._listener_lock:
            if self._listener is not None:
                with contextlib.suppress(Exception):
                    self._listener.close()
                self._listener = None

    def others_wrote_token(self) -> tuple[int, int] | None:
        """A value that changes whenever a connection other than this store's writer commits (another
        process, another Store on the same database); this store's own writes, from any thread,
        leave it alone. None where it cannot be told (on PostgreSQL while no listener can connect).

        Why: the head keeps its queue and running jobs from what it is told (head/queue_cache.py,
        head/running_cache.py) and read the store whole every 5 s only to catch other processes'
        writes (the CLI's direct writes, a second head or API process): at 100,000 queued that
        read cost more than the cycle's plan. SQLite's `PRAGMA data_version` says it for one
        connection: it changes when another connection commits. It is read on the writer
        connection, under the write lock (so no write of this store is under way), without a
        transaction (BEGIN IMMEDIATE would take the file's write lock); the connection's serial is
        part of the value, so a value read on another pooled writer connection always differs.
        Inside this thread's `batch` it is read on the batch's own connection: its write
        transaction took the file's write lock, so every other connection's commit is before it
        (and in the value), and none can come until it ends.
        PostgreSQL has no such pragma: each write transaction notifies (LISTEN/NOTIFY) with its
        store's id, and a connection of this store counts the others' (`_others_notified`).
        """
        if self.dialect == "postgresql":
            return self._others_notified()
        if self.dialect != "sqlite":
            return None
        if self._batch_thread == threading.get_ident():
            assert self._batch is not None
            with self._errors_mapped():
                return _data_version(self._batch.connection)
        with self._write_lock, self._errors_mapped():
            raw = self._writer.raw_connection()
            try:
                return _data_version(raw)
            finally:
                raw.close()  # back to the pool

    @property
    def others_wrote_at_once(self) -> bool:
        """Whether `others_wrote_token` counts every other connection's commit made before it is
        read (SQLite's data_version), not only those whose notice has come (PostgreSQL's
        notifications arrive just after each commit)."""
        return self.dialect == "sqlite"

    def _others_notified(self) -> tuple[int, int] | None:
        """PostgreSQL's `others_wrote_token`: every write transaction notifies `WRITES_CHANNEL` at
        its commit with its store's id (`_postgres_engine`); a connection of this store's own
        LISTENs, and counts the notifications of other stores. A new listener (the first call,
        or after the server went away) has a new serial, so its first value always differs;
        None while it cannot listen."""
        import psycopg

        with self._listener_lock:
            try:
                if self._listener is None or self._listener.closed:
                    conninfo = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
                    listener = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
                    listener.execute(f"LISTEN {WRITES_CHANNEL}")
                    self._listener, self._others_writes = listener, 0
                    self._listener_serial = next(_CONNECTION_SERIAL)
                for n in self._listener.notifies(timeout=0):
                    if n.payload != self._writer_id:
                        self._others_writes += 1
            except psycopg.Error as e:
                log.debug("no write notifications from %s: %s", self.display, e)
                with contextlib.suppress(Exception):
                    if self._listener is not None:
                        self._listener.close()
                self._listener = None
                return None
            return self._listener_serial, self._others_writes

    def watch_running(self, told: Callable[[int], None]) -> None:
        """Call `told(job_id)` after every write that may start, stop, end or otherwise change a
        running job (its record, or its view as `running_rows` reads it). Why here: every end
        path (the loop's, the API's cancels, budget and idle stops, crash recovery, a test's own
        write) goes through one of these few methods, so none can be left untold; the watcher
        reads the job back."""
        self._running_watchers.append(told)

    @contextmanager
    def _telling(self, job_id: int, running: bool = True) -> Iterator[None]:
        """Around a write that may change a running job (`running`): its watchers are told after
        it, committed or not (a told job is only read again; one not told would be missed)."""
        if not running:
            yield
            return
        with self._running_changes_lock:
            self._running_changing += 1
            self._running_changes_begun += 1
        try:
            yield
        finally:
            try:
                for told in self._running_watchers:
                    told(job_id)
            finally:
                with self._running_changes_lock:
                    self._running_changing -= 1
                    if not self._running_changing:
                        self._running_changes_lock.notify_all()

    def running_changes(self) -> tuple[int, int]:
        """(writes that may change a running job begun and not yet told, how many ever began).

        Why: check mode compares the head's event-fed running jobs with a fresh read, and a write
        of another thread that commits between the two reads, or is told only after the fresh
        read saw it, shows a difference that is not one. The head calls a difference a mismatch
        only across a span in which no such write was under way: none at its start, and none
        begun by its end (head/loop.py `_check_state`, head/running_cache.py `check_records`).
        """
        with self._running_changes_lock:
            return self._running_changing, self._running_changes_begun

    def wait_running_changes_told(self, timeout_s: float) -> bool:
        """Wait until no write that may change a running job is under way (False: still after `timeout_s`)."""
        with self._running_changes_lock:
            return self._running_changes_lock.wait_for(lambda: not self._running_changing, timeout_s)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every write this thread makes in the block, in one transaction committed at its end.

        Why: each commit costs the head a BEGIN, a lease check, a commit and (SQLite, FULL) an
        fsync, whatever it holds; the loop's per-job writes of one cycle (the starts of 8 jobs,
        the ends of 8 others) cost 8 of them where one would do (issue 18: the head's CPU per
        job). All or nothing: a write that raises rolls the whole block back. Other threads'
        writes wait for the block, as for any write, so the block holds only store calls, never
        a launch or a signal that must follow a durable record. Nested blocks join the outer one.
        """
        if self._batch_thread == threading.get_ident():
            yield
            return
        with self._write() as conn:
            self._batch, self._batch_thread = conn, threading.get_ident()
            try:
                yield
            finally:
                self._batch, self._batch_thread = None, None

    @contextmanager
    def _write(self, durable: bool = True) -> Iterator[Connection]:
        """One write transaction under the write lock, durable (fsync'd) before it returns.

        `durable=False` is for what the head derives again at its next cycle (why queued jobs
        wait): its commit reaches the database file's log before it returns, so it survives a kill
        -9 of the head, but is not fsync'd (SQLite WAL with synchronous=NORMAL; PostgreSQL
        synchronous_commit=off): an OS crash or power loss may lose it, never corrupt the file, and
        the next durable commit makes it durable too. Why (issue 18): the loop rewrote wait
        reasons after each submission, and that fsync held the write lock the next submission's
        commit waits for.
        """
        if self._batch_thread == threading.get_ident():
            assert self._batch is not None
            yield self._batch  # inside `batch`: its transaction, committed (lease checked) once, durable
            return
        # Writers queue on a Python lock, not on SQLite's busy handler, which sleeps 1-100 ms
        # between retries and cut submit throughput by 4x under concurrent clients.
        with self._write_lock:
            self._durable = durable
            try:
                with self._errors_mapped(), self._writer.begin() as conn:
                    if not durable and self.dialect == "postgresql":
                        conn.exec_driver_sql("SET LOCAL synchronous_commit TO off")
                    self._check_lease(conn)
                    yield conn
            finally:
                self._durable = True

    @contextmanager
    def _errors_mapped(self) -> Iterator[None]:
        """A full or read-only data dir becomes a DataDirUnwritable, an unreachable database a
        DatabaseUnavailable (either way the transaction is rolled back)."""
        try:
            yield
        except (DBAPIError, OSError) as e:
            clear = unwritable(self.path.parent, e) if self.path is not None else _postgres_unwritable(self.display, e)
            if clear is not None:
                raise clear from e
            down = self._unavailable(e)
            if down is None:
                raise
            raise down from e
        if self._outage_since is not None:
            self._outage_over()

    def _unavailable(self, e: BaseException) -> DatabaseUnavailable | None:
        """`e` as a DatabaseUnavailable if it says the database cannot be reached; logged once per outage."""
        if not isinstance(e, DBAPIError):
            return None
        cause = e.orig if e.orig is not None else e
        first_line = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        if self.dialect == "postgresql":
            if not (e.connection_invalidated or isinstance(e, OperationalError)):
                return None
        elif not (isinstance(e, OperationalError) and any(w in first_line.lower() for w in ("locked", "busy"))):
            return None
        down = DatabaseUnavailable(f"database unavailable: {first_line}")
        with self._outage_lock:
            starting = self._outage_since is None
            if starting:
                self._outage_since = time.monotonic()
        if starting:
            log.warning("%s; calls answer 503 and scheduling waits until it is back", down)
        return down

    def _outage_over(self) -> None:
        with self._outage_lock:
            since, self._outage_since = self._outage_since, None
        if since is not None:
            log.warning("database available again after %.1f s", time.monotonic() - since)

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._errors_mapped(), self._reader.begin() as conn:  # a read-only mount can refuse reads too
            yield conn

    # ---- jobs -------------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, now: float, owner: str | None = None, limits: Limits | None = None) -> int:
        """Insert a queued job in its own transaction; returns its id once the insert is durable.

        No group commit here: the head's submissions share commits in one place,
        head/submit_batcher.py, which calls `create_jobs_each`."""
        outcome = self.create_jobs_each([(spec, now)], [owner], limits)[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def create_jobs(self, items: list[tuple[JobSpec, float]], owners: list[str | None] | None = None) -> list[int]:
        """Insert queued jobs in one transaction; their ids, in order, once durable."""
        with self._write_lock:
            return self._insert_jobs(items, owners)

    def create_jobs_each(
        self, items: list[tuple[JobSpec, float]], owners: list[str | None] | None = None, limits: Limits | None = None
    ) -> list[int | Exception]:
        """As `create_jobs`, for submissions of different callers batched together: each one's id,
        or the error that kept that one alone out (see `_insert_each`); `limits`: the policy's,
        whose `max_queued_jobs` a submission may not go beyond (QueueLimitReached)."""
        with self._write_lock:
            return self._insert_each(items, owners, limits)

    def _insert_each(
        self, items: list[tuple[JobSpec, float]], owners: list[str | None] | None = None, limits: Limits | None = None
    ) -> list[int | Exception]:
        """All items in one transaction; if it fails, each item again in its own, so that one
        item that cannot be stored fails alone rather than every submission batched with it.

        Validation refuses what it knows to be unstorable (models.unstorable); this is for what
        it does not know. A failure of the store itself (a full disk) fails each retry too."""
        try:
            return list(self._insert_jobs(items, owners, limits))
        except Exception as e:
            if len(items) == 1:
                return [e]
        out: list[int | Exception] = []
        for n, item in enumerate(items):
            try:
                out.append(self._insert_jobs([item], [owners[n]] if owners else None, limits)[0])
            except Exception as e:
                out.append(e)
        return out

    def _insert_jobs(
        self, items: list[tuple[JobSpec, float]], owners: list[str | None] | None = None, limits: Limits | None = None
    ) -> list[int]:
        with self._errors_mapped(), self._writer.begin() as c:
            self._check_lease(c)
            if limits is not None and limits.limits_queued and owners:
                self._check_queued(c, limits, [(o, spec, 1) for o, (spec, _) in zip(owners, items, strict=True)])
            arrays = self._arrays_among(c, {i for spec, _ in items for _, i in _dependency_ids(spec)})
            rows = [
                self._job_row(spec, now, owners[n] if owners else None, _resolve(spec, arrays))
                for n, (spec, now) in enumerate(items)
            ]
            if self._driver_sql:  # a row at a time, each id (its rowid) back as it is inserted: in order
                ids = [driver_sql.insert(c, schema.jobs, row) for row in rows]
            else:
                ids = [int(r[0]) for r in c.execute(_ADD_JOBS, rows)]
            events = [
                {"job_id": job_id, "at": now, "state": JobState.QUEUED.value, "reason": "submitted"}
                for job_id, (_, now) in zip(ids, items, strict=True)
            ]
            if self._driver_sql:
                driver_sql.insert_many(c, schema.job_events, events)
            else:
                c.execute(_ADD_EVENT, events)
        return ids

    @staticmethod
    def _check_queued(c: Connection, limits: Limits, wanted: list[tuple[str | None, JobSpec, int]]) -> None:
        """Raise QueueLimitReached if queuing `wanted` (owner, spec, how many jobs: an array's
        elements) would take an owner beyond a `max_queued_jobs`; in the caller's transaction,
        so the count cannot change before the insert. A job without an owner is not limited."""
        users = sorted({o for o, _, _ in wanted if o})
        if not users:
            return
        j = schema.jobs.c
        q = (
            select(j.owner, j.priority, func.count())
            .where(j.state == JobState.QUEUED.value, j.owner.in_(users))
            .group_by(j.owner, j.priority)
        )
        queued: dict[tuple[str, int], int] = {(o, int(p)): int(n) for o, p, n in c.execute(q)}
        for owner, spec, count in wanted:
            if not owner:
                continue
            priority = Priority.parse(spec.priority)
            total = sum(n for (o, _), n in queued.items() if o == owner)
            why = queued_refusal(limits, owner, priority, total, queued.get((owner, int(priority)), 0), count)
            if why is not None:
                raise QueueLimitReached(why)
            queued[(owner, int(priority))] = queued.get((owner, int(priority)), 0) + count

    @staticmethod
    def _arrays_among(c: Connection, ids: set[int]) -> set[int]:
        """Which of `ids` name an array (a dependency on one waits for all its elements)."""
        if not ids:
            return set()
        a = schema.arrays.c
        return {int(r[0]) for r in c.execute(select(a.id).where(a.id.in_(list(ids))))}

    @staticmethod
    def _job_row(spec: JobSpec, now: float, owner: str | None, after: tuple[Dependency, ...]) -> dict[str, Any]:
        return {
            "name": spec.name or "",  # unnamed jobs read back as job-<id>
            "team": spec.team,
            "state": JobState.QUEUED.value,
            "priority": int(Priority.parse(spec.priority)),
            "gpus": spec.gpu_count,
            "gpu_type": ",".join(spec.gpu_types) or None,
            "request": request_json(spec, after),
            "spec": spec.model_dump_json(),
            "submitted_at": now,
            "queued_at": now,
            "not_before": spec.begin if spec.begin is not None and spec.begin > now else None,
            "reason": "submitted",
            "attempt": 0,
            "term_sent": False,
            "kill_sent": False,
            "owner": owner,
            "held": True if spec.hold else None,
            "kind": spec.kind,
        }

    # ---- arrays, holds and dependencies (issue 20) ---------------------------------------

    def create_array(
        self,
        spec: JobSpec,
        indices: tuple[int, ...],
        now: float,
        owner: str | None = None,
        throttle: int | None = None,
        sweep: str | None = None,
        corr: int | None = None,
        limits: Limits | None = None,
    ) -> int:
        """Insert an array's elements, one queued job each, in one transaction; returns the array's
        id (its first element's job id) once durable. The elements share one spec text and one
        request; `corr`: an array whose element i each element i waits for (aftercorr)."""
        j = schema.jobs.c
        with self._write() as c:
            if limits is not None and limits.limits_queued:
                self._check_queued(c, limits, [(owner, spec, len(indices))])  # every element counts
            arrays = self._arrays_among(c, {i for _, i in _dependency_ids(spec)})
            after = _resolve(spec, arrays)
            base = self._job_row(spec, now, owner, after)
            first = int(
                c.execute(insert(schema.jobs).returning(j.id), [{**base, "array_index": indices[0]}]).scalar_one()
            )
            c.execute(update(schema.jobs).where(j.id == first).values(array_id=first))
            c.execute(
                insert(schema.arrays).values(
                    id=first, count=len(indices), throttle=throttle, sweep=sweep, created_at=now
                )
            )
            # The other elements are copies of the first made by the database itself, one
            # INSERT ... SELECT per run of evenly spaced indices: nothing per element crosses
            # from Python (100,000 rows sent as parameters took seconds; this well under one).
            source = schema.jobs.alias("source")
            copied = [c.name for c in schema.jobs.c if c.name not in ("id", "array_index")]
            for run_first, run_last, step in _runs(indices[1:]):
                seq = select(literal(run_first).label("i"), literal(first).label("source")).cte("seq", recursive=True)
                seq = seq.union_all(select(seq.c.i + step, seq.c.source).where(seq.c.i + step <= run_last))
                # The spec text is the first element's alone (`_shared_specs` reads it for the
                # others): a 100,000-element array stores it once, not 100,000 times.
                columns = [literal("").label(name) if name == "spec" else source.c[name] for name in copied]
                rows = (
                    select(*columns, seq.c.i)
                    .select_from(source.join(seq, source.c.id == seq.c.source))  # the first row, once per index
                    .where(source.c.id == first)
                    .order_by(seq.c.i)
                )
                c.execute(insert(schema.jobs).from_select([*copied, "array_index"], rows))
            if corr is not None:
                # aftercorr: element i also waits for element i of `corr` (afterok), where it has one.
                request = json.loads(str(base["request"]))
                slot = -1  # where each element's partner id goes, in the request's JSON text
                d = [*request.get("d", []), [DependencyKind.AFTEROK.value, slot, 0]]
                before, after_ = json.dumps({**request, "d": d}, separators=(",", ":")).rsplit(str(slot), 1)
                partner = schema.jobs.alias("partner")
                same = and_(partner.c.array_id == corr, partner.c.array_index == j.array_index)
                pick = select(cast(partner.c.id, String)).where(same).scalar_subquery()
                c.execute(
                    update(schema.jobs)
                    .where(j.array_id == first, exists().where(same))
                    .values(request=literal(before) + pick + literal(after_))
                )
            # One "submitted" event for the array, on its first element: `events` reads it for
            # every element (100,000 event rows cost a quarter of the insert).
            c.execute(
                insert(schema.job_events).values(
                    job_id=first, at=now, state=JobState.QUEUED.value, reason=f"submitted (array of {len(indices)})"
                )
            )
        return first

    def array(self, array_id: int) -> tuple[int, int | None, str | None] | None:
        """An array's element count, throttle and sweep (JSON); None if `array_id` names no array."""
        a = schema.arrays.c
        with self._read() as c:
            row = c.execute(select(a.count, a.throttle, a.sweep).where(a.id == array_id)).first()
        return None if row is None else (int(row[0]), row[1], row[2])

    def set_throttle(self, array_id: int, throttle: int | None) -> bool:
        with self._write() as c:
            res = c.execute(update(schema.arrays).where(schema.arrays.c.id == array_id).values(throttle=throttle))
        return res.rowcount == 1

    def array_elements(self, array_id: int, index: int | None = None) -> list[tuple[int, JobState]]:
        """An array's elements (or the one at `index`) as (job id, state), in index order."""
        j = schema.jobs.c
        q = select(j.id, j.state).where(j.array_id == array_id).order_by(j.array_index)
        if index is not None:
            q = q.where(j.array_index == index)
        with self._read() as c:
            return [(int(i), JobState(st)) for i, st in c.execute(q)]

    def element_states(self, array_id: int, index: int | None = None) -> list[tuple[int, JobState, bool]]:
        """An array's elements (or the one at `index`) as (job id, state, held), in index order:
        what a state filter (`cancel 41 --state held`) chooses from."""
        j = schema.jobs.c
        q = select(j.id, j.state, j.held).where(j.array_id == array_id).order_by(j.array_index)
        if index is not None:
            q = q.where(j.array_index == index)
        with self._read() as c:
            return [(int(i), JobState(st), bool(h)) for i, st, h in c.execute(q)]

    def specs_with_dependencies(self, after_id: int, limit: int) -> list[tuple[int, JobSpec]]:
        """The specs of jobs (an array: its first element) newer than `after_id` that have
        dependencies, oldest first: where a pipeline's later steps are found (a dependent always
        has a larger id than what it waits for)."""
        j = schema.jobs.c
        q = (
            select(j.id, j.spec)
            .where(j.id > after_id, j.request.like('%"d":%'), j.array_id.is_(None) | (j.array_id == j.id))
            .order_by(j.id)
            .limit(limit)
        )
        with self._read() as c:
            return [(int(i), spec_of(text)) for i, text in c.execute(q)]

    def array_counts(self, array_ids: Iterable[int]) -> dict[int, dict[str, int]]:
        """Each array's elements counted by state, for a one-line listing."""
        wanted = list(array_ids)
        j = schema.jobs.c
        out: dict[int, dict[str, int]] = {}
        with self._read() as c:
            for at in range(0, len(wanted), IDS_PER_QUERY):
                q = (
                    select(j.array_id, j.state, func.count())
                    .where(j.array_id.in_(wanted[at : at + IDS_PER_QUERY]))
                    .group_by(j.array_id, j.state)
                )
                for a, st, n in c.execute(q):
                    out.setdefault(int(a), {})[st] = int(n)
        return out

    def set_held(self, ids: Iterable[int], held: bool) -> list[int]:
        """Hold or release queued jobs; the ids it changed (jobs not queued are left alone)."""
        wanted = list(ids)
        j = schema.jobs.c
        changed: list[int] = []
        with self._write() as c:
            for at in range(0, len(wanted), IDS_PER_QUERY):
                chunk = wanted[at : at + IDS_PER_QUERY]
                q = select(j.id).where(j.id.in_(chunk), j.state == JobState.QUEUED.value)
                q = q.where(j.held.is_(None) | (j.held == False)) if held else q.where(j.held == True)  # noqa: E712
                hit = [int(r[0]) for r in c.execute(q)]
                if hit:
                    c.execute(update(schema.jobs).where(j.id.in_(hit)).values(held=True if held else None))
                changed += hit
        return changed

    def set_array_held(self, array_id: int, held: bool) -> int:
        """Hold or release an array's queued elements in one statement; how many changed."""
        j = schema.jobs.c
        q = update(schema.jobs).where(j.array_id == array_id, j.state == JobState.QUEUED.value)
        q = q.where(j.held.is_(None) | (j.held == False)) if held else q.where(j.held == True)  # noqa: E712
        with self._write() as c:
            return int(c.execute(q.values(held=True if held else None)).rowcount)

    def cancel_array_queued(self, array_id: int, now: float, reason: str) -> int:
        """Cancel an array's queued (and preempted) elements in one transaction; how many."""
        j = schema.jobs.c
        waiting = and_(j.array_id == array_id, j.state.in_([JobState.QUEUED.value, JobState.PREEMPTED.value]))
        with self._write() as c:
            c.execute(
                insert(schema.job_events).from_select(
                    ["job_id", "at", "state", "reason"],
                    select(j.id, literal(now), literal(JobState.CANCELLED.value), literal(reason)).where(waiting),
                )
            )
            res = c.execute(
                update(schema.jobs).where(waiting).values(state=JobState.CANCELLED.value, reason=reason, ended_at=now)
            )
        return int(res.rowcount)

    def running_by_array(self) -> dict[int, int]:
        """Running elements per array: what an array's throttle is measured against."""
        j = schema.jobs.c
        q = (
            select(j.array_id, func.count())
            .where(j.state == JobState.RUNNING.value, j.array_id.is_not(None))
            .group_by(j.array_id)
        )
        with self._read() as c:
            return {int(a): int(n) for a, n in c.execute(q)}

    def throttles(self, array_ids: Iterable[int]) -> dict[int, int]:
        wanted = list(array_ids)
        a = schema.arrays.c
        out: dict[int, int] = {}
        with self._read() as c:
            for at in range(0, len(wanted), IDS_PER_QUERY):
                q = select(a.id, a.throttle).where(a.id.in_(wanted[at : at + IDS_PER_QUERY]), a.throttle.is_not(None))
                out.update({int(i): int(t) for i, t in c.execute(q)})
        return out

    def dependency_targets(
        self, wanted: Iterable[tuple[int, bool]], default_time_limit_s: float, now: float = 0.0
    ) -> dict[tuple[int, bool], Target]:
        """Each dependency target's state and expected start and end (eligibility's view): a job,
        or (is_array) an array's elements summed up, its end that of its last element."""
        keys = set(wanted)
        jobs = [i for i, is_array in keys if not is_array]
        arrays = [i for i, is_array in keys if is_array]
        j = schema.jobs.c
        out: dict[tuple[int, bool], Target] = {}
        with self._read() as c:
            for at in range(0, len(jobs), IDS_PER_QUERY):
                q = select(j.id, j.state, j.started_at, j.request, j.estimated_start, j.attempt).where(
                    j.id.in_(jobs[at : at + IDS_PER_QUERY])
                )
                for i, st, started, request, estimate, attempt in c.execute(q):
                    state = JobState(st)
                    limit = json.loads(request).get("tl") if request else None
                    duration = limit or default_time_limit_s
                    start = started if state is JobState.RUNNING else estimate
                    end = None if start is None or state.terminal else start + duration
                    out[(int(i), False)] = Target(state, bool(attempt), False, start, end)
            for array_id in arrays:
                counts: dict[str, int] = {}
                ever = 0
                pending = j.state.in_([JobState.QUEUED.value, JobState.PREEMPTED.value])
                per_state = select(
                    j.state,
                    func.count(),
                    func.sum(case((j.attempt > 0, 1), else_=0)),
                    func.max(case((j.state == JobState.RUNNING.value, j.started_at), else_=j.estimated_start)),
                    func.sum(case((and_(pending, j.estimated_start.is_(None)), 1), else_=0)),
                ).where(j.array_id == array_id)
                latest: float | None = None  # the latest known start of a pending element
                unknown = 0  # pending elements without an estimate (past the throttle, say)
                for st, n, begun, start, blind in c.execute(per_state.group_by(j.state)):
                    counts[st] = int(n)
                    ever += int(begun or 0)
                    if not JobState(st).terminal:
                        latest = start if latest is None or (start is not None and start > latest) else latest
                        unknown += int(blind or 0)
                if counts:
                    shape = c.execute(
                        select(j.request, schema.arrays.c.throttle)
                        .join_from(schema.jobs, schema.arrays, schema.arrays.c.id == j.id)
                        .where(j.id == array_id)
                    ).first()
                    limit = (json.loads(shape[0]).get("tl") if shape and shape[0] else None) or default_time_limit_s
                    throttle = shape[1] if shape else None
                    start, end = array_times(latest, unknown, limit, throttle, now)
                    summary = array_target({JobState(k): n for k, n in counts.items()}, ever)
                    out[(array_id, True)] = replace(summary, expected_start=start, expected_end=end)
        return out

    def get_job(self, job_id: int) -> JobRecord | None:
        with self._read() as c:
            row = c.execute(_GET_JOB, {"match_id": job_id}).mappings().first()
            shared = self._shared_specs(c, [row] if row else [])
        return _job(row, shared) if row else None

    @staticmethod
    def _shared_specs(c: Connection, rows: Iterable[Any]) -> dict[int, JobSpec]:
        """The spec of each array among `rows` whose elements share their first element's."""
        wanted = sorted({int(r["array_id"]) for r in rows if not r["spec"] and r["array_id"] is not None})
        j = schema.jobs.c
        out: dict[int, JobSpec] = {}
        for at in range(0, len(wanted), IDS_PER_QUERY):
            q = select(j.id, j.spec).where(j.id.in_(wanted[at : at + IDS_PER_QUERY]))
            out.update({int(i): spec_of(text) for i, text in c.execute(q)})
        return out

    def list_jobs(
        self,
        states: Iterable[JobState] | None = None,
        team: str | None = None,
        limit: int | None = None,
        teams: Iterable[str] | None = None,
        ids: Iterable[int] | None = None,
        text: str | None = None,
        offset: int = 0,
        collapse: bool = False,
    ) -> list[JobRecord]:
        """Jobs, oldest first; `teams` keeps only those teams' jobs (what a member may see);
        `ids` only those jobs (not with `limit`); `text` those whose name or owner contains it
        (any case) or whose id it is; `limit` the newest N after skipping the newest `offset`
        (a page of a newest-first listing)."""
        if ids is not None and (limit is not None or offset):
            raise ValueError("list_jobs: `limit` picks the newest jobs, `ids` names them: give one")
        q_in: Select[Any] | None = None
        if ids is not None and states is None and team is None and teams is None and not text and not collapse:
            q, q_in = _JOBS, _JOBS_IN  # the loop's starting and ending jobs, every cycle: built once
        else:
            q = self._jobs_where(select(schema.jobs), states, team, teams, text, collapse).order_by(schema.jobs.c.id)
        if limit is not None or offset:
            q = q.order_by(None).order_by(schema.jobs.c.id.desc()).limit(limit).offset(offset or None)
        with self._read() as c:
            if q_in is not None and ids is not None and self._driver_sql:
                rows: list[Any] = driver_sql.jobs_by_id(c, list(ids))
            else:
                rows = _rows_of(c, q, ids, q_in)
            shared = self._shared_specs(c, rows)
        records = [_job(r, shared) for r in rows]
        return sorted(records, key=lambda j: j.id)

    def count_matching_jobs(
        self,
        states: Iterable[JobState] | None = None,
        team: str | None = None,
        teams: Iterable[str] | None = None,
        text: str | None = None,
        collapse: bool = False,
    ) -> int:
        """How many jobs `list_jobs` with the same filters lists without a limit: the total a
        paged listing shows ("51-100 of 1,234")."""
        q = self._jobs_where(select(func.count()).select_from(schema.jobs), states, team, teams, text, collapse)
        with self._read() as c:
            return int(c.execute(q).scalar_one())

    @staticmethod
    def _jobs_where(
        q: Select[Any],
        states: Iterable[JobState] | None,
        team: str | None,
        teams: Iterable[str] | None,
        text: str | None,
        collapse: bool = False,
    ) -> Select[Any]:
        """`collapse`: an array only as its first element, which a state filter keeps if any of
        the array's elements is in one of the states."""
        j = schema.jobs.c
        if collapse:
            q = q.where(or_(j.array_id.is_(None), j.array_id == j.id))
        if states is not None and collapse:
            values = [s.value for s in states]
            element = schema.jobs.alias("element")
            any_in = exists().where(element.c.array_id == j.id, element.c.state.in_(values))
            q = q.where(or_(and_(j.array_id.is_(None), j.state.in_(values)), and_(j.array_id == j.id, any_in)))
        elif states is not None:
            q = q.where(j.state.in_([s.value for s in states]))
        if team is not None:
            q = q.where(j.team == team)
        if teams is not None:
            q = q.where(j.team.in_(list(teams)))
        if text:
            words = [j.name.icontains(text, autoescape=True), j.owner.icontains(text, autoescape=True)]
            digits = text.removeprefix("#")
            if digits.isdigit() and len(digits) <= 18:
                words.append(j.id == int(digits))
            q = q.where(or_(*words))
        return q

    def run_seconds(self, ids: Iterable[int]) -> dict[int, float]:
        """Seconds each job's ended attempts ran, summed, by job id (jobs with none are absent):
        a requeued job's run time is its attempts', not the span from its latest start to its
        end, which counts the time it waited in the queue between them."""
        a = schema.attempts.c
        wanted = list(ids)
        out: dict[int, float] = {}
        with self._read() as c:
            for at in range(0, len(wanted), IDS_PER_QUERY):
                q = (
                    select(a.job_id, func.sum(a.ended_at - a.started_at))
                    .where(a.job_id.in_(wanted[at : at + IDS_PER_QUERY]), a.started_at.is_not(None))
                    .group_by(a.job_id)
                )
                out.update({int(i): max(0.0, float(s or 0.0)) for i, s in c.execute(q)})
        return out

    def queued_teams(self) -> dict[int, str]:
        """Each queued job's team, by id: enough to order and filter the queue before parsing specs."""
        j = schema.jobs.c
        with self._read() as c:
            return {i: t for i, t in c.execute(select(j.id, j.team).where(j.state == JobState.QUEUED.value))}

    def queued_requests(
        self, after_id: int | None = None, known: dict[int, tuple[int, JobRequest]] | None = None
    ) -> list[JobRequest]:
        """The scheduler's view of the queue: only the columns it needs, no spec parsing.

        `known`: job id -> (hash of its row, its request) from the caller's earlier reads. A row
        unchanged since is answered with that very request, not parsed again, and `known` takes
        every row read (the caller drops the jobs that left the queue). Why: a whole read at
        100,000 queued (the head's, after another process wrote) spent 1.4 s of its 1.65 s
        parsing requests that had not changed. The spec (large) is read only for a row without
        a request (a job from before requests were stored)."""
        with self._read() as c:
            rows = _raw_rows(c, _QUEUED) if after_id is None else _raw_rows(c, _QUEUED_AFTER, {"after_id": after_id})
        if known is None:
            return [_queued_request(r) for r in rows]
        out: list[JobRequest] = []
        for r in rows:
            key = hash(tuple(r))
            hit = known.get(r[0])
            if hit is not None and hit[0] == key:
                out.append(hit[1])
            else:
                req = _queued_request(r)
                known[r[0]] = (key, req)
                out.append(req)
        return out

    def running_jobs(self) -> list[RunningJob]:
        """The scheduler's view of running jobs: where, whose, since when, and whether stopping."""
        return [job for job, _ in self.running_rows()]

    def running_rows(self, ids: Iterable[int] | None = None) -> list[tuple[RunningJob, str | None]]:
        """`running_jobs` with each job's stop reason (None: no stop under way); only `ids`
        among them if given (the jobs a watcher was told of, `watch_running`)."""
        j = schema.jobs.c
        q = select(*(j[c] for c in _VIEW_COLUMNS)).where(j.state == JobState.RUNNING.value)
        with self._read() as c:
            rows = _rows_of(c, q, ids)
        return [v for v in map(_running_view, rows) if v is not None]

    def running_records(
        self, ids: Iterable[int] | None = None, known: KnownRunning | None = None
    ) -> tuple[list[tuple[RunningJob, str | None]], list[JobRecord]]:
        """`running_rows(ids)` and `list_jobs(states=[RUNNING], ids=ids)` from one read of the rows.

        Why: the head keeps both for the jobs it was told of (head/running_cache.py), and read each
        told job twice, two queries and two parses of the same rows, after every start and end.

        `known` (a whole read only, `ids` None): job id -> (hash of its row, its view, its record)
        from the caller's last whole read; a row unchanged since is answered with those very
        objects, and `known` becomes this read's. Why: at 1,000 nodes a whole read (after
        another process wrote, and the periodic safety read) parsed ~2,500 unchanged records.
        An array element without a spec of its own is built from its first element's, which
        never changes under it (`change_spec` gives the siblings their own copy first)."""
        with self._read() as c:
            if ids is not None and self._driver_sql:
                rows: list[Any] = driver_sql.jobs_by_id(c, list(ids), JobState.RUNNING.value)
            else:
                rows = _rows_of(c, _RUNNING_ROWS, ids, _RUNNING_ROWS_IN)
            rows.sort(key=lambda r: int(r["id"]))
            if known is None or ids is not None:
                shared = self._shared_specs(c, rows)
                views = [v for v in map(_running_view, rows) if v is not None]
                return views, [_job(r, shared) for r in rows]
            keys = [hash(tuple(r.values())) for r in rows]
            hits = [
                hit if (hit := known.get(int(r["id"]))) is not None and hit[0] == key else None
                for r, key in zip(rows, keys, strict=True)
            ]
            shared = self._shared_specs(c, [r for r, hit in zip(rows, hits, strict=True) if hit is None])
        out: KnownRunning = {
            int(r["id"]): hit if hit is not None else (key, _running_view(r), _job(r, shared))
            for r, key, hit in zip(rows, keys, hits, strict=True)
        }
        known.clear()
        known.update(out)
        return [v for _, v, _ in out.values() if v is not None], [record for _, _, record in out.values()]

    def running_allocations(self) -> list[tuple[int, Allocation]]:
        j = schema.jobs.c
        with self._read() as c:
            rows = c.execute(select(j.id, j.allocation).where(j.state == JobState.RUNNING.value)).all()
        return [(r[0], a) for r in rows if (a := allocation_from_json(r[1])) is not None]

    def set_wait_reasons(self, reasons: dict[int, Wait]) -> None:
        """Record why queued jobs wait; jobs that left the queue meanwhile are left alone.

        The wait is kept structured, as JSON in the row's reason column (its code also in
        wait_reason): the sentence is made by whoever reads it (waits_text.render_stored). Rows
        written before hold a sentence there, and are shown as they are."""
        if not reasons:
            return
        texts: dict[int, str] = {}  # jobs that wait alike share one Wait: its JSON made once
        rows = [
            {
                "match_id": k,
                "reason": texts[id(v)] if id(v) in texts else texts.setdefault(id(v), json.dumps(wait_json(v))),
                "wait_reason": v.reason.value,
                "estimated_start": v.estimated_start,
            }
            for k, v in reasons.items()
        ]
        with self._write(durable=False) as c:  # derived again each cycle: see `_write`
            if self._driver_sql:
                driver_sql.update_jobs(c, (JobState.QUEUED.value,), rows)
            else:
                c.execute(_SET_WAITS, rows)

    def load_usage(self) -> tuple[dict[str, float], float | None]:
        """Decayed GPU-seconds per team and when they were saved."""
        with self._read() as c:
            rows = c.execute(select(schema.team_usage)).mappings().all()
        if not rows:
            return {}, None
        return {r["team"]: r["gpu_seconds"] for r in rows}, max(r["updated_at"] for r in rows)

    def save_usage(self, usage: dict[str, float], now: float) -> None:
        with self._write() as c:
            c.execute(schema.team_usage.delete())
            if usage:
                c.execute(
                    insert(schema.team_usage),
                    [{"team": t, "gpu_seconds": v, "updated_at": now} for t, v in usage.items()],
                )

    def session_gpus(self, owner: str) -> float:
        """GPUs `owner`'s interactive sessions hold or wait for (queued, preempted, running): what
        the policy's interactive.max_gpus_per_user bounds."""
        j = schema.jobs.c
        active = [JobState.QUEUED.value, JobState.PREEMPTED.value, JobState.RUNNING.value]
        with self._read() as c:
            total = c.execute(
                select(func.sum(j.gpus)).where(j.owner == owner, j.kind == "session", j.state.in_(active))
            ).scalar()
        return float(total or 0.0)

    def count_jobs(self) -> dict[str, int]:
        with self._read() as c:
            rows = c.execute(select(schema.jobs.c.state, func.count()).group_by(schema.jobs.c.state)).all()
        return {str(s): int(n) for s, n in rows}

    def events(self, job_id: int) -> list[EventRecord]:
        """A job's history, oldest first; an array element's starts with its array's submission
        (recorded once, on the first element)."""
        e, j = schema.job_events.c, schema.jobs.c
        with self._read() as c:
            array_id = c.execute(select(j.array_id).where(j.id == job_id)).scalar()
            q = select(schema.job_events).where(e.job_id == job_id)
            if array_id is not None and array_id != job_id:
                q = select(schema.job_events).where(
                    or_(e.job_id == job_id, and_(e.job_id == array_id, e.id == self._first_event(array_id)))
                )
            rows = c.execute(q.order_by(e.id)).mappings().all()
        return [EventRecord(r["at"], JobState(r["state"]), r["reason"]) for r in rows]

    @staticmethod
    def _first_event(job_id: int) -> Any:
        e = schema.job_events.c
        return select(func.min(e.id)).where(e.job_id == job_id).scalar_subquery()

    def transition(
        self,
        job_id: int,
        to: JobState,
        now: float,
        reason: str,
        expect: Iterable[JobState] | None = None,
        ended_attempt: AttemptRecord | None = None,
        **fields: Any,
    ) -> bool:
        """Move a job to `to` if its state is one of `expect` (default: any that may move there).

        Returns False, changing nothing, when the job is not in such a state: the caller lost a
        race (the job was cancelled, finished, or moved by someone else) and must not act.
        `ended_attempt`, the record of the attempt this change ends, is written in the same
        transaction, so an attempt is recorded exactly when its job leaves it.
        """
        allowed = [s for s in (expect or JobState) if can_transition(s, to)]
        values: dict[str, Any] = {"state": to.value, "reason": reason}
        if "allocation" in fields:
            a = fields.pop("allocation")
            values["allocation"] = allocation_to_json(a) if a is not None else None
        if "launch" in fields:
            launch = fields.pop("launch")
            values["launch"] = json.dumps(launch) if launch is not None else None
        values.update(fields)
        if to.terminal:
            values.setdefault("ended_at", now)
        with self._telling(job_id, to is JobState.RUNNING or JobState.RUNNING in allowed), self._write() as c:
            if self._update_job(c, tuple(s.value for s in allowed), {"match_id": job_id, **_job_values(values)}) != 1:
                return False
            self._add_event(c, {"job_id": job_id, "at": now, "state": to.value, "reason": reason})
            if ended_attempt is not None:
                a = ended_attempt
                row = {
                    "job_id": a.job_id,
                    "attempt": a.attempt,
                    "started_at": a.started_at,
                    "ended_at": a.ended_at,
                    "allocation": allocation_to_json(a.allocation) if a.allocation else None,
                    "outcome": a.outcome,
                    "reason": a.reason,
                    "exit_codes": json.dumps(list(a.exit_codes)),
                    "work_lost_s": a.work_lost_s,
                    "cpu_s": a.cpu_s,
                    "memory_peak_bytes": a.memory_peak_bytes,
                    "pull_s": a.pull_s,
                }
                if self._driver_sql:
                    driver_sql.insert(c, schema.attempts, row, verb="INSERT OR REPLACE")
                else:
                    # One statement shape, its values as parameters: a `.values(...)` statement per
                    # end was a new statement whose cache key SQLAlchemy worked out again each time.
                    c.execute(self.upsert(schema.attempts), row)
        return True

    def _update_job(self, c: Connection, states: tuple[str, ...], values: dict[str, Any]) -> int:
        """UPDATE jobs SET `values` WHERE id = :match_id AND state IN `states`: rows changed."""
        if self._driver_sql:
            return driver_sql.update_job(c, states, values)
        return int(c.execute(_move_from(states), values).rowcount)

    def _add_event(self, c: Connection, event: dict[str, Any]) -> None:
        """One row of job_events (job_id, at, state, reason)."""
        if self._driver_sql:
            driver_sql.insert(c, schema.job_events, event)
        else:
            c.execute(_ADD_EVENT, event)

    def recent_attempts(self, limit: int) -> list[tuple[float, float, Allocation | None, float, float | None, bool]]:
        """The `limit` attempts that ended last, oldest first, each as (started at, ended at,
        allocation, its job's queued at, its time limit, whether the head stopped it at that
        limit): what the head learns its start and stop latencies from (head/latency.py)."""
        a, j = schema.attempts.c, schema.jobs.c
        q = (
            select(a.started_at, a.ended_at, a.allocation, j.queued_at, j.submitted_at, j.request, j.stop_reason)
            .select_from(schema.attempts.join(schema.jobs, a.job_id == j.id))
            .add_columns(a.attempt == j.attempt)
            .where(a.started_at.is_not(None))
            .order_by(a.ended_at.desc())
            .limit(limit)
        )
        with self._read() as c:
            rows = c.execute(q).all()
        out = []
        for started, ended, alloc, queued, submitted, request, stop, latest in reversed(rows):
            limit_s = json.loads(request).get("tl") if request else None
            timed_out = bool(latest) and stop == StopReason.TIME_LIMIT.value
            out.append((started, ended, allocation_from_json(alloc), queued or submitted, limit_s, timed_out))
        return out

    def attained_gpu_seconds(self) -> dict[int, float]:
        """Job id -> GPU-seconds over its ended attempts, for every queued or running job that
        had one: the attained service an attained-service ordering ranks by (core/attained.py;
        the running attempt is added by the core from the job's start). Read from the attempt
        rows, written in the transaction that ends each attempt, so it never lags an accountant
        step. Only jobs that ran before have rows: the read is small, and the head asks only
        when the policy ranks jobs."""
        with self._read() as c:
            rows = _raw_rows(c, _ATTAINED)
        out: dict[int, float] = {}
        for job_id, started, ended, alloc in rows:
            allocation = allocation_from_json(alloc)
            if allocation is not None:
                out[job_id] = out.get(job_id, 0.0) + allocation.gpu_count * max(0.0, ended - started)
        return out

    def attempts(self, job_id: int) -> list[AttemptRecord]:
        """The ended attempts of a job, oldest first."""
        a = schema.attempts.c
        with self._read() as c:
            rows = c.execute(select(schema.attempts).where(a.job_id == job_id).order_by(a.attempt)).mappings().all()
        return [
            AttemptRecord(
                job_id=r["job_id"],
                attempt=r["attempt"],
                started_at=r["started_at"],
                ended_at=r["ended_at"],
                allocation=allocation_from_json(r["allocation"]),
                outcome=r["outcome"],
                reason=r["reason"],
                exit_codes=tuple(json.loads(r["exit_codes"])),
                work_lost_s=r["work_lost_s"],
                cpu_s=r["cpu_s"],
                memory_peak_bytes=r["memory_peak_bytes"],
                pull_s=r["pull_s"],
            )
            for r in rows
        ]

    def record_progress(
        self,
        job_id: int,
        now: float,
        step: int | None,
        checkpoint_at: float | None,
        checkpoint_step: int | None,
    ) -> bool:
        """Store a running job's progress report; False if the job is not running."""
        values: dict[str, Any] = {"progress_at": now}
        if step is not None:
            values["progress_step"] = step
        if checkpoint_at is not None:
            values["last_checkpoint_at"] = checkpoint_at
        if checkpoint_step is not None:
            values["checkpoint_step"] = checkpoint_step
        return self.update_job(job_id, JobState.RUNNING, **values)

    def record_metrics(self, job_id: int, now: float, step: int | None, metrics: dict[str, float]) -> bool:
        """Store what a running job's script reported, under its current attempt; False if the
        job is not running (its report belongs to no attempt)."""
        j = schema.jobs.c
        with self._write() as c:
            row = c.execute(select(j.attempt).where(j.id == job_id).where(j.state == JobState.RUNNING.value)).first()
            if row is None:
                return False
            c.execute(
                insert(schema.job_metrics),
                [
                    {"job_id": job_id, "attempt": row[0], "name": k, "step": step, "at": now, "value": v}
                    for k, v in metrics.items()
                ],
            )
        return True

    def job_metrics(self, job_id: int) -> list[tuple[int, str, int | None, float, float]]:
        """Every reported value of a job: (attempt, name, step, at, value), in report order."""
        m = schema.job_metrics.c
        with self._read() as c:
            rows = c.execute(
                select(m.attempt, m.name, m.step, m.at, m.value).where(m.job_id == job_id).order_by(m.at, m.name)
            ).all()
        return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def running_metrics(self) -> list[tuple[int, str, str, float]]:
        """The newest value of each metric of each running job's current attempt: (job, team,
        name, value), for /metrics."""
        m, j = schema.job_metrics.c, schema.jobs.c
        newest = (
            select(m.job_id, m.name, func.max(m.at).label("at"))
            .join(schema.jobs, (j.id == m.job_id) & (j.attempt == m.attempt))
            .where(j.state == JobState.RUNNING.value)
            .group_by(m.job_id, m.name)
            .subquery()
        )
        with self._read() as c:
            rows = c.execute(
                select(m.job_id, j.team, m.name, m.value)
                .join(newest, (m.job_id == newest.c.job_id) & (m.name == newest.c.name) & (m.at == newest.c.at))
                .join(schema.jobs, j.id == m.job_id)
                .order_by(m.job_id, m.name)
            ).all()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def request_stop(
        self, job_id: int, reason: str, now: float, message: str | None = None, failed_rank: int | None = None
    ) -> bool:
        """Mark a running job to be stopped, unless a stop is already under way.

        A second request (a cancel during a time-limit stop) must not restart the grace period,
        nor change why the job is ending; which stop may replace which one under way is the
        lifecycle's table (core/lifecycle.py `stop_overrides`), applied here in one conditional
        UPDATE each so a concurrent request cannot slip between a read and a write.
        """
        stop = StopReason(reason)
        j = schema.jobs.c
        running = update(schema.jobs).where(j.id == job_id).where(j.state == JobState.RUNNING.value)
        with self._telling(job_id), self._write() as c:
            res = c.execute(
                running.where(j.stop_reason.is_(None)).values(
                    stop_reason=stop.value, stop_requested_at=now, stop_message=message, failed_rank=failed_rank
                )
            )
            for override in stop_overrides(stop):
                if res.rowcount:
                    break
                values: dict[str, Any] = {"stop_reason": stop.value}
                if not override.keeps_message:
                    values["stop_message"] = message
                res = c.execute(running.where(j.stop_reason == override.replaces.value).values(**values))
        return res.rowcount == 1

    def change_spec(
        self,
        job_id: int,
        expect: JobState,
        spec: JobSpec,
        now: float,
        reason: str,
        not_before: float | None = None,
        was: JobSpec | None = None,
    ) -> bool:
        """Replace the spec of a job still in state `expect` (`gpucluster update`), in one
        transaction with its event: False, changing nothing, if the job left that state or
        (given `was`, the spec the change was made from) its spec is no longer `was`: two
        updates at once must not let the second silently undo the first.

        A queued job gets its scheduler-facing columns and `request` rewritten from the new spec
        (the dependencies resolved at submit are kept as they were) and `not_before`; a running
        one only its spec and request (the head reads its time limit from them every cycle).
        An array's first element holds the spec its sibling elements share (`spec` ''): before
        it changes, the siblings get their own copy of the old one."""
        j = schema.jobs.c
        # A running job's time limit is in its running view.
        with self._telling(job_id, expect is JobState.RUNNING), self._write() as c:
            row = c.execute(select(j.state, j.request, j.spec, j.array_id).where(j.id == job_id)).first()
            if row is None or row[0] != expect.value:
                return False
            if was is not None:
                # An array element's '' spec is its array's first element's (`_shared_spec`).
                current = row[2] or c.execute(select(j.spec).where(j.id == row[3])).scalar() or ""
                if JobSpec.model_validate_json(current) != was:
                    return False
            old_request = json.loads(row[1]) if row[1] else {}
            request = json.loads(request_json(spec))
            if "d" in old_request:
                request["d"] = old_request["d"]
            values: dict[str, Any] = {
                "spec": spec.model_dump_json(),
                "request": json.dumps(request, separators=(",", ":")),
            }
            if expect is JobState.QUEUED:
                values.update(
                    name=spec.name or "",
                    priority=int(Priority.parse(spec.priority)),
                    gpus=spec.gpu_count,
                    gpu_type=",".join(spec.gpu_types) or None,
                    not_before=not_before,
                )
            if row[3] == job_id and row[2]:
                c.execute(
                    update(schema.jobs).where(j.array_id == job_id, j.id != job_id, j.spec == "").values(spec=row[2])
                )
            res = c.execute(update(schema.jobs).where(j.id == job_id, j.state == expect.value).values(**values))
            if res.rowcount != 1:
                return False
            c.execute(insert(schema.job_events).values(job_id=job_id, at=now, state=expect.value, reason=reason))
        return True

    def update_job(self, job_id: int, expect: JobState, **fields: Any) -> bool:
        """Change bookkeeping fields of a job still in state `expect` (no state change, no event)."""
        if "launch" in fields:
            fields["launch"] = json.dumps(fields["launch"]) if fields["launch"] is not None else None
        with self._telling(job_id, expect is JobState.RUNNING), self._write() as c:  # records kept too
            return self._update_job(c, (expect.value,), {"match_id": job_id, **_job_values(fields)}) == 1

    # ---- nodes ------------------------------------------------------------------------------

    def put_node(self, node: Node, virtual: bool, now: float) -> None:
        labels = json.dumps(sorted(node.labels)) if node.labels else None
        gpus = json.dumps(
            [
                {"index": g.index, "model": g.model, "memory_mb": g.memory_mb, "uuid": g.uuid, "domain": g.domain}
                for g in node.gpus
            ]
        )
        host = {"cpus": node.cpus, "memory_mb": node.memory_mb}
        with self._write() as c:
            res = c.execute(
                update(schema.nodes)
                .where(schema.nodes.c.name == node.name)
                .values(virtual=virtual, gpus=gpus, updated_at=now, labels=labels, **host)
            )
            if res.rowcount == 0:
                c.execute(
                    insert(schema.nodes).values(
                        name=node.name, virtual=virtual, gpus=gpus, updated_at=now, labels=labels, **host
                    )
                )
        self.forget_nodes()

    def nodes(self) -> list[NodeRecord]:
        """The node rows in name order; the same list object until a write or `forget_nodes`
        (the head's node feed compares by identity)."""
        return self._nodes.get()

    def forget_nodes(self) -> None:
        """Read the node rows again next time: another process may have written them."""
        self._nodes.forget()

    def read_nodes(self) -> list[NodeRecord]:
        """The node rows read now, bypassing the cache (check mode's fresh build)."""
        with self._read() as c:
            rows = c.execute(select(schema.nodes).order_by(schema.nodes.c.name)).mappings().all()
        return [
            NodeRecord(
                Node(
                    r["name"],
                    tuple(Gpu(**g) for g in json.loads(r["gpus"])),
                    frozenset(json.loads(r["labels"])) if r["labels"] else frozenset(),
                    r["cpus"],
                    r["memory_mb"],
                ),
                bool(r["virtual"]),
            )
            for r in rows
        ]

    def integrity_ok(self) -> bool:
        return not self.integrity_problems()

    def integrity_problems(self) -> list[str]:
        """What is wrong with the stored state; [] when nothing is.

        The same checks on both databases: no row refers to a missing job or user, every job is
        in a known state, every running job holds an allocation, no GPU is handed out beyond
        all of it, and the schema is the current one; on SQLite, also the file's own
        integrity_check and foreign_key_check.
        """
        problems: list[str] = []
        j = schema.jobs.c
        refs = [
            (schema.job_events, "job_id", schema.jobs, "id"),
            (schema.attempts, "job_id", schema.jobs, "id"),
            (schema.job_flags, "job_id", schema.jobs, "id"),
            (schema.memberships, "user", schema.users, "name"),
            (schema.tokens, "user", schema.users, "name"),
        ]
        with self._read() as c:
            if self.dialect == "sqlite":
                found = [str(r[0]) for r in c.exec_driver_sql("PRAGMA integrity_check")]
                if found != ["ok"]:
                    problems += [f"sqlite integrity_check: {r}" for r in found]
                for r in c.exec_driver_sql("PRAGMA foreign_key_check"):
                    problems.append(f"{r[0]} row {r[1]} refers to a missing {r[2]} row")
            for child, col, parent, key in refs:
                orphans = c.execute(
                    select(func.count()).select_from(child).where(~exists().where(parent.c[key] == child.c[col]))
                ).scalar_one()
                if orphans:
                    problems.append(f"{orphans} {child.name} row(s) refer to a missing {parent.name} row")
            known = [s.value for s in JobState]
            for state, n in c.execute(select(j.state, func.count()).where(j.state.not_in(known)).group_by(j.state)):
                problems.append(f"{n} job(s) in an unknown state {state!r}")
            for (job_id,) in c.execute(
                select(j.id).where(j.state == JobState.RUNNING.value, j.allocation.is_(None)).limit(10)
            ):
                problems.append(f"job {job_id} is running without an allocation")
            version = c.execute(select(migrate.version_table.c.version_num)).scalars().all()
            if version != [schema.HEAD_REVISION]:
                problems.append(f"schema revision {version}, expected [{schema.HEAD_REVISION!r}]")
            rows = c.execute(select(j.id, j.allocation).where(j.state == JobState.RUNNING.value)).all()
        held: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for job_id, text_ in rows:
            allocation = allocation_from_json(text_)
            for sl in allocation.slices if allocation is not None else ():
                for gpu in sl.gpu_indices:
                    held.setdefault((sl.node, gpu), []).append((job_id, sl.share))
        for (node_name, gpu), holders in sorted(held.items()):
            if sum(share for _, share in holders) > 1 + 1e-9:
                jobs = ", ".join(str(job_id) for job_id, _ in holders)
                problems.append(f"GPU {gpu} of {node_name} is handed out beyond all of it (jobs {jobs})")
        return problems


def _data_version(raw: PoolProxiedConnection) -> tuple[int, int]:
    """`Store.others_wrote_token` on one SQLite connection: its serial and its data_version."""
    serial = raw.info.setdefault("serial", next(_CONNECTION_SERIAL))
    cur = raw.cursor()
    try:
        cur.execute("PRAGMA data_version")
        version = cur.fetchone()[0]  # type: ignore[index]  # the pragma always answers one row
    finally:
        cur.close()
    return int(serial), int(version)


def _raw_rows(c: Connection, q: Select[Any], params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """`q`'s rows as the driver gives them, without SQLAlchemy's per-row processing: for a select
    of integers, floats, text and booleans (a boolean may come as 0/1: read it with `bool`), the
    same values. Why: the head's whole read of 100,000 queued jobs spent 0.23 s of CPU in
    `Result.all()`, 0.12 s in the driver's fetch alone."""
    result = c.execute(q, params)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def _rows_of(
    c: Connection, q: Select[Any], ids: Iterable[int] | None, q_in: Select[Any] | None = None
) -> list[RowMapping]:
    """The jobs' rows `q` selects; only `ids` among them if given, a bound parameter per id in
    chunks under every driver's limit (PostgreSQL: 65,535). `q_in`: `q` already narrowed to the
    expanding parameter `ids` (built once by a caller that reads often)."""
    if ids is None:
        return list(c.execute(q).mappings())
    wanted = list(ids)
    if q_in is None:
        q_in = q.where(schema.jobs.c.id.in_(bindparam("ids", expanding=True)))
    return [
        r
        for at in range(0, len(wanted), IDS_PER_QUERY)
        for r in c.execute(q_in, {"ids": wanted[at : at + IDS_PER_QUERY]}).mappings()
    ]


# What `_running_view` reads of a job's row.
_VIEW_COLUMNS = (
    "id",
    "allocation",
    "team",
    "priority",
    "started_at",
    "request",
    "spec",
    "last_checkpoint_at",
    "stop_reason",
    "gpus",
    "owner",
)


def _running_view(r: Any) -> tuple[RunningJob, str | None] | None:
    """A running job's row (a mapping with `_VIEW_COLUMNS`) as the scheduler sees it, with its stop
    reason (None: no stop under way); None if it holds no allocation."""
    allocation = allocation_from_json(r["allocation"])
    if allocation is None:
        return None
    req = json.loads(r["request"] if r["request"] is not None else _request_of_spec(r["spec"]))
    started = r["started_at"] or 0.0
    # A checkpoint older than this attempt's start (a restart resumed from it) saves this
    # attempt nothing: its work counts from the start.
    checkpoint = r["last_checkpoint_at"]
    checkpoint = checkpoint if checkpoint is not None and checkpoint >= started else None
    stop = r["stop_reason"]
    job = RunningJob(
        job_id=r["id"],
        allocation=allocation,
        team=r["team"],
        priority=Priority(r["priority"]),
        started_at=started,
        time_limit_s=req.get("tl"),
        last_checkpoint_at=checkpoint,
        stopping=stop is not None,
        max_gpus=int(r["gpus"]) if req.get("mn") is not None else None,  # elastic: may grow
        min_gpus=int(req["mn"]) if req.get("mn") is not None else None,  # and shrink
        user=r["owner"] or "",
        exclusive=bool(req.get("x")),
    )
    return job, stop


def _job(r: Any, shared: dict[int, JobSpec] | None = None) -> JobRecord:
    return JobRecord(
        id=r["id"],
        name=r["name"] or f"job-{r['id']}",
        team=r["team"],
        state=JobState(r["state"]),
        priority=Priority(r["priority"]),
        gpus=r["gpus"],
        gpu_type=r["gpu_type"],
        spec=spec_of(r["spec"]) if r["spec"] else (shared or {})[r["array_id"]],
        submitted_at=r["submitted_at"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        exit_code=r["exit_code"],
        reason=r["reason"],
        attempt=r["attempt"],
        allocation=allocation_from_json(r["allocation"]),
        launch=json.loads(r["launch"]) if r["launch"] else None,
        stop_reason=r["stop_reason"],
        stop_requested_at=r["stop_requested_at"],
        term_sent=bool(r["term_sent"]),
        kill_sent=bool(r["kill_sent"]),
        wait_reason=r["wait_reason"],
        estimated_start=r["estimated_start"],
        stop_message=r["stop_message"],
        last_checkpoint_at=r["last_checkpoint_at"],
        not_before=r["not_before"],
        restarts=r["restarts"] or 0,
        progress_step=r["progress_step"],
        progress_at=r["progress_at"],
        checkpoint_step=r["checkpoint_step"],
        owner=r["owner"],
        failed_rank=r["failed_rank"],
        held=bool(r["held"]),
        array_id=r["array_id"],
        array_index=r["array_index"],
    )


def _runs(indices: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Sorted indices as runs (first, last, step) of evenly spaced ones: 0-99999 is one run."""
    runs: list[tuple[int, int, int]] = []
    n = 0
    while n < len(indices):
        first = indices[n]
        if n + 1 == len(indices):
            runs.append((first, first, 1))
            break
        step = indices[n + 1] - first
        last = n + 1
        while last + 1 < len(indices) and indices[last + 1] - indices[last] == step:
            last += 1
        runs.append((first, indices[last], step))
        n = last + 1
    return runs


def _dependency_ids(spec: JobSpec) -> list[tuple[DependencyKind, int]]:
    return [
        (kind, i)
        for kind, ids in (
            (DependencyKind.AFTER, spec.after),
            (DependencyKind.AFTEROK, spec.afterok),
            (DependencyKind.AFTERNOTOK, spec.afternotok),
            (DependencyKind.AFTERANY, spec.afterany),
        )
        for i in ids
    ]


def _resolve(spec: JobSpec, arrays: set[int]) -> tuple[Dependency, ...]:
    """A spec's dependencies, each target a job or (its id names an array) the whole array."""
    return tuple(Dependency(kind, i, i in arrays) for kind, i in _dependency_ids(spec))


def _request_of_spec(spec_json: str) -> str:
    """For rows written before the request column existed."""
    return request_json(spec_of(spec_json))


def overlapped(before: tuple[int, int], after: tuple[int, int]) -> bool:
    """Whether a write that may change a running job was under way at some moment between two
    readings of `Store.running_changes`: one was at the first, or one began since."""
    return before[0] != 0 or after[1] != before[1]
