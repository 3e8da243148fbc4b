"""The head's per-job writes straight through SQLite's driver, in the caller's transaction.

Why (issue 18: the head's CPU per job): a trivial job's life runs eight write statements in the
head (its row and its "submitted" event; its start's update and event; its launch record; its
end's update, event and attempt), and SQLAlchemy's work around each one (the statement's cache
key, an execution context, a result object) cost ~30 us of CPU on top of SQLite's own few:
about a tenth of the head's CPU per job. Here each runs as plain SQL text on the transaction's
own DB-API connection: the same connection and transaction as the SQLAlchemy statements around
it, the same values stored (SQLite stores a Python bool as 0/1, as SQLAlchemy's Boolean does;
every other column of these tables is text or a number, given as such). The text is made from
the schema's tables, once per shape. A driver error is raised as SQLAlchemy's own
(`DBAPIError.instance`), so the store maps it (a full disk, a locked file) as any other.

The same for the BEGIN (and, when the durability level changes, the PRAGMA) that starts each
of the store's SQLite transactions, reads included (`run`), and for the reads of named jobs'
whole rows the head makes at each cycle's starts and after its starts and ends (`jobs_by_id`),
and the queued jobs' waits the loop writes after its plans (`update_jobs`).

SQLite only: on PostgreSQL the store runs SQLAlchemy's statements (`Store._driver_sql`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.exc import DBAPIError

from gpucluster.store import schema

IDS_PER_QUERY = 5000  # ids in one query's IN list: well under SQLite's 32,766 parameters
# Rows of one multi-row INSERT (`insert_many`): the submit writer's batches (up to 512) in one or
# two statements, well under SQLite's 32,766 parameters for any table here.
ROWS_PER_INSERT = 256
_TEXTS: dict[tuple[object, ...], str] = {}  # a statement's shape -> its SQL text (made once)


def insert(c: Connection, table: Table, row: Mapping[str, Any], verb: str = "INSERT") -> int:
    """INSERT `row` (column -> value) into `table`; `verb` "INSERT OR REPLACE" for an upsert.
    Returns the row's rowid: its id where the table's key is an INTEGER PRIMARY KEY (the jobs).

    Why the rowid rather than `RETURNING id`: SQLite's driver lets go of the interpreter at each
    step of a statement and takes it back after; RETURNING costs a second step per row, and each
    take-back of the interpreter waits while the API's event loop holds it (issue 18: the submit
    writer's commits spent most of their time waiting for the interpreter, not working)."""
    shape = ("insert", table.name, verb, *row)
    text = _TEXTS.get(shape)
    if text is None:
        names = _columns(table, row)
        text = f"{verb} INTO {table.name} ({', '.join(names)}) VALUES ({', '.join(':' + k for k in row)})"
        _TEXTS[shape] = text
    rowid = _run(c, text, row).lastrowid
    assert rowid is not None, "an INSERT always sets the rowid"
    return rowid


def insert_many(c: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT each of `rows` (all with the same columns, in the same order) into `table`, up to
    ROWS_PER_INSERT in one statement (one step of SQLite's: the interpreter let go and taken back
    once, where `executemany` did it for each row; see `insert`)."""
    if not rows:
        return
    names = list(rows[0])
    driver = _driver(c)
    for at in range(0, len(rows), ROWS_PER_INSERT):
        chunk = rows[at : at + ROWS_PER_INSERT]
        shape = ("insert_many", table.name, len(chunk), *names)
        text = _TEXTS.get(shape)
        if text is None:
            one = "(" + ", ".join("?" * len(names)) + ")"
            text = _TEXTS[shape] = (
                f"INSERT INTO {table.name} ({', '.join(_columns(table, names))}) VALUES {', '.join([one] * len(chunk))}"
            )
        params = [row[k] for row in chunk for k in names]
        try:
            driver.execute(text, params)
        except sqlite3.Error as e:
            raise DBAPIError.instance(text, params, e, sqlite3.Error) from e


def update_job(c: Connection, states: tuple[str, ...], values: Mapping[str, Any]) -> int:
    """UPDATE jobs SET `values` (but `match_id`) WHERE id = :match_id AND state IN `states`:
    how many rows it changed (0 or 1)."""
    return int(_run(c, _update_text(states, values), values).rowcount)


def update_jobs(c: Connection, states: tuple[str, ...], rows: Sequence[Mapping[str, Any]]) -> None:
    """`update_job` for each of `rows` (all with the same keys, in the same order), in one call."""
    if not rows:
        return
    text = _update_text(states, rows[0])
    try:
        _driver(c).executemany(text, rows)
    except sqlite3.Error as e:
        raise DBAPIError.instance(text, rows, e, sqlite3.Error) from e


def _update_text(states: tuple[str, ...], values: Mapping[str, Any]) -> str:
    shape = ("update_job", states, *values)
    text = _TEXTS.get(shape)
    if text is None:
        names = [k for k in values if k != "match_id"]
        _columns(schema.jobs, names)
        for state in states:  # written into the text: only a state's plain name may be
            if not state.isalpha():
                raise ValueError(f"not a job state: {state!r}")
        sets = ", ".join(f"{k} = :{k}" for k in names)
        within = ", ".join(f"'{s}'" for s in states)
        text = _TEXTS[shape] = f"UPDATE jobs SET {sets} WHERE jobs.id = :match_id AND jobs.state IN ({within})"
    return text


def jobs_by_id(c: Connection, ids: Sequence[int], state: str | None = None) -> list[sqlite3.Row]:
    """The whole rows of jobs `ids` (only those in `state`, if given), each column read by name
    (`row["spec"]`) as from SQLAlchemy's mappings; in chunks of `chunk` ids. Why: the head
    reads its starting jobs' rows and, after each start and end, its told running jobs' rows
    (store.py `list_jobs`, `running_records`)."""
    head = _TEXTS.get(("jobs_by_id", state))
    if head is None:
        if state is not None and not state.isalpha():
            raise ValueError(f"not a job state: {state!r}")
        where = f"jobs.state = '{state}' AND " if state is not None else ""
        columns = ", ".join(f"jobs.{c.name}" for c in schema.jobs.columns)  # as SQLAlchemy's select(jobs) names them
        head = f"SELECT {columns} FROM jobs WHERE {where}jobs.id IN "
        _TEXTS[("jobs_by_id", state)] = head
    rows: list[sqlite3.Row] = []
    cursor = _driver(c).cursor()
    cursor.row_factory = sqlite3.Row
    try:
        for at in range(0, len(ids), IDS_PER_QUERY):
            chunk = [int(i) for i in ids[at : at + IDS_PER_QUERY]]
            text = head + "(" + ", ".join("?" * len(chunk)) + ")"
            try:
                rows += cursor.execute(text, chunk).fetchall()
            except sqlite3.Error as e:
                raise DBAPIError.instance(text, chunk, e, sqlite3.Error) from e
    finally:
        cursor.close()
    return rows


def run(c: Connection, text: str) -> None:
    """A statement without parameters (BEGIN IMMEDIATE, a PRAGMA) on the connection's driver.
    Why: the store begins every transaction with one, reads included, and SQLAlchemy's
    execution around it cost several times SQLite's own work."""
    _run(c, text, {})


def _columns(table: Table, names: Any) -> list[str]:
    """`names`, each checked to be a column of `table` (they are written into the text)."""
    out = [str(k) for k in names]
    unknown = [k for k in out if k not in table.c]
    if unknown:
        raise ValueError(f"not columns of {table.name}: {unknown}")
    return out


def _driver(c: Connection) -> sqlite3.Connection:
    driver = c.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection), "driver_sql is for SQLite's own driver"
    return driver


def _run(c: Connection, text: str, params: Mapping[str, Any]) -> sqlite3.Cursor:
    try:
        return _driver(c).execute(text, params)
    except sqlite3.Error as e:
        raise DBAPIError.instance(text, params, e, sqlite3.Error) from e
