"""A job's writes through SQLite's driver (store/driver_sql.py) store what SQLAlchemy's did."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError

from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, NodeSlice
from gpucluster.models import JobSpec
from gpucluster.store import AttemptRecord, DatabaseUnavailable, Store, driver_sql, schema

from .storekit import run_sql


def one_life(store: Store, through_driver: bool) -> int:
    """Submit, start, record the launch and end one job, every write the way asked."""
    store._driver_sql = through_driver
    job = store.create_job(JobSpec(command=["true"], gpus=2, name="x", hold=False), 1.0, "alice")
    alloc = Allocation((NodeSlice("n1", (0, 1)),))
    assert store.transition(
        job, JobState.RUNNING, 2.0, "started", expect=[JobState.QUEUED], allocation=alloc, attempt=1,
        started_at=2.0, launch=None, term_sent=False, kill_sent=False, not_before=None,
    )  # fmt: skip
    assert store.update_job(job, JobState.RUNNING, launch={"pid": 7, "run_dir": "/r"}, term_sent=True)
    ended = AttemptRecord(job, 1, 2.0, 3.0, alloc, "succeeded", "exited 0", (0, None), None, cpu_s=0.5)
    assert store.transition(job, JobState.SUCCEEDED, 3.0, "exited 0", expect=[JobState.RUNNING], ended_attempt=ended)
    assert not store.update_job(job, JobState.RUNNING, term_sent=False)  # no longer running: nothing changed
    return job


def stored(db: Path, table: str, key: str, job: int) -> list[tuple[Any, ...]]:
    """Every column's value and SQLite type (typeof) of `table`'s rows of `job`, ids left out."""
    columns = [c.name for c in schema.metadata.tables[table].columns if c.name not in ("id", "job_id")]
    picked = ", ".join(f"{c}, typeof({c})" for c in columns)
    return run_sql(db, f"SELECT {picked} FROM {table} WHERE {key} = {job} ORDER BY 1")[0]


def test_a_job_written_through_the_driver_is_stored_as_sqlalchemy_stored_it(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = Store(db)
    try:
        by_sqlalchemy, by_driver = one_life(store, False), one_life(store, True)
    finally:
        store.close()
    for table, key in (("jobs", "id"), ("job_events", "job_id"), ("attempts", "job_id")):
        assert stored(db, table, key, by_driver) == stored(db, table, key, by_sqlalchemy), table
    assert len(stored(db, "job_events", "job_id", by_driver)) == 3  # submitted, started, ended


def test_a_driver_error_is_sqlalchemys_so_the_store_maps_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    try:
        with pytest.raises(IntegrityError), store._write() as c:  # no job 999: the foreign key refuses it
            driver_sql.insert(c, schema.job_events, {"job_id": 999, "at": 1.0, "state": "queued", "reason": "x"})
    finally:
        store.close()


def test_only_columns_of_the_table_are_written_into_the_text(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    try:
        with pytest.raises(ValueError, match="not columns of jobs"), store._write() as c:
            driver_sql.update_job(c, ("queued",), {"match_id": 1, "state = 'x', reason": "y"})
        with pytest.raises(ValueError, match="not a job state"), store._write() as c:
            driver_sql.update_job(c, ("queued') OR ('1",), {"match_id": 1, "reason": "y"})
    finally:
        store.close()


def test_a_database_locked_past_the_busy_timeout_is_unavailable_not_a_driver_error(tmp_path: Path) -> None:
    """The BEGIN IMMEDIATE that starts each write runs through the driver too: SQLite's "database
    is locked" there is the store's DatabaseUnavailable (the API's 503, the loop's retry)."""
    store = Store(tmp_path / "s.db")
    other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    try:
        raw = store._writer.raw_connection()
        raw.driver_connection.execute("PRAGMA busy_timeout=50")  # type: ignore[union-attr]  # not 30 s
        raw.close()
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(DatabaseUnavailable, match="locked"):
            store.create_job(JobSpec(command=["true"], gpus=1), 1.0)
        other.execute("ROLLBACK")
        assert store.create_job(JobSpec(command=["true"], gpus=1), 2.0) > 0
    finally:
        other.close()
        store.close()


def test_named_jobs_read_through_the_driver_are_read_as_through_sqlalchemy(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    try:
        ended, queued = one_life(store, True), store.create_job(JobSpec(command=["true"], gpus=1), 4.0)
        running = store.create_job(JobSpec(command=["sleep", "9"], gpus=1, name="r"), 5.0)
        alloc = Allocation((NodeSlice("n1", (3,)),))
        assert store.transition(running, JobState.RUNNING, 6.0, "started", allocation=alloc, attempt=1, started_at=6.0)
        ids = [running, queued, ended, 999]  # 999: no such job
        reads = {}
        for through_driver in (False, True):
            store._driver_sql = through_driver
            reads[through_driver] = (store.list_jobs(ids=ids), store.running_records(ids))
    finally:
        store.close()
    assert reads[True] == reads[False]
    records, (views, running_records) = reads[True]
    assert [r.id for r in records] == sorted([running, queued, ended])
    assert [v.job_id for v, _ in views] == [r.id for r in running_records] == [running]


def test_a_batch_of_more_than_one_insert_holds_is_stored_in_order_as_sqlalchemy_stored_it(tmp_path: Path) -> None:
    """The submit writer's batch through the driver: each job's id is its row's (the rowid, not
    RETURNING), in the batch's order, and the events go in as multi-row INSERTs of at most
    ROWS_PER_INSERT rows: the same rows as SQLAlchemy's statements store."""
    db = tmp_path / "s.db"
    store = Store(db)
    n = driver_sql.ROWS_PER_INSERT + 5
    ids: dict[bool, list[int]] = {}
    try:
        for through in (False, True):
            store._driver_sql = through
            batch = [(JobSpec(command=["true"], name=f"j{i}"), float(i)) for i in range(n)]
            out = store.create_jobs_each(batch, ["alice"] * n)
            assert all(isinstance(i, int) for i in out)
            ids[through] = [int(i) for i in out]  # type: ignore[arg-type]
        for got in ids.values():
            assert got == list(range(got[0], got[0] + n))  # in the batch's order
            assert [store.get_job(i).name for i in got] == [f"j{i}" for i in range(n)]
    finally:
        store.close()
    for table, key in (("jobs", "id"), ("job_events", "job_id")):
        for a, b in zip(ids[False], ids[True], strict=True):
            assert stored(db, table, key, b) == stored(db, table, key, a), (table, a, b)


def test_a_multi_row_insert_error_is_sqlalchemys(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    try:
        rows = [{"job_id": 999, "at": 1.0, "state": "queued", "reason": "x"}] * 3
        with pytest.raises(IntegrityError), store._write() as c:  # no job 999: the foreign key refuses it
            driver_sql.insert_many(c, schema.job_events, rows)
    finally:
        store.close()
