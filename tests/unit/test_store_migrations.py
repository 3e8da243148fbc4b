"""Schema migrations (Alembic, store/migrate.py): data dirs of earlier versions upgrade without
losing a job, on SQLite and PostgreSQL; a database of a newer version is refused untouched.

The legacy databases (legacy/v1.sql, v2.sql, v3.sql) were written by the gpucluster commits of
those schema versions through their own store (legacy/make.py says how to rebuild them).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Boolean, MetaData, Table, create_engine, text

from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, NodeSlice, Priority
from gpucluster.store import Store, StoreError, migrate, schema

from .builders import spec
from .storekit import engine_url, run_sql

STORE_BACKENDS = ("sqlite", "postgresql")  # tests/unit/conftest.py
LEGACY = Path(__file__).resolve().parent / "legacy"
T0 = 1_700_000_000.0


def legacy_rows(version: int) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table of a legacy dump, by table."""
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    conn.executescript((LEGACY / f"v{version}.sql").read_text())
    tables = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
    names = [r[0] for r in conn.execute(tables)]
    return {n: [dict(r) for r in conn.execute(f"SELECT * FROM {n}")] for n in names}


def make_legacy(target: Path | str, version: int) -> None:
    """A database as version `version` left it: on SQLite its own dump; on PostgreSQL (which
    gpucluster never used before Alembic) the revision of that version with the dump's rows."""
    if isinstance(target, Path):
        with sqlite3.connect(target) as conn:
            conn.executescript((LEGACY / f"v{version}.sql").read_text())
        return
    engine = create_engine(engine_url(target))
    try:
        with engine.begin() as conn:
            migrate.upgrade(conn, f"{version:04d}")
            meta = MetaData()
            rows_of = legacy_rows(version)
            for name in sorted(rows_of, key=lambda n: n in ("job_events", "attempts")):  # jobs first
                rows = rows_of[name]
                table = Table(name, meta, autoload_with=conn)
                flags = [c.name for c in table.columns if isinstance(c.type, Boolean)]
                if rows:
                    conn.execute(table.insert(), [{**r, **{f: bool(r[f]) for f in flags}} for r in rows])
            for name in ("jobs", "job_events"):  # ids were given: move the sequences past them
                sequence = f"pg_get_serial_sequence('{name}', 'id')"
                conn.execute(text(f"SELECT setval({sequence}, (SELECT MAX(id) FROM {name}))"))
    finally:
        engine.dispose()


def schema_diffs(target: Path | str) -> list[Any]:
    engine = create_engine(engine_url(target))
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), schema.metadata)
    finally:
        engine.dispose()
    # SQLite keeps version 1's INTEGER `jobs.gpus` (type affinity stores fractions as they are).
    return [d for d in diffs if not (isinstance(d, list) and d[0][0] == "modify_type" and d[0][3] == "gpus")]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_legacy_database_upgrades_without_losing_a_job(store_target: Path | str, version: int) -> None:
    make_legacy(store_target, version)
    before = legacy_rows(version)
    store = Store(store_target)
    try:
        if isinstance(store_target, Path):
            assert (
                store.migrated == f"upgraded from schema {version} (before Alembic) to revision {schema.HEAD_REVISION}"
            )
        else:
            assert store.migrated == f"upgraded from revision {version:04d} to {schema.HEAD_REVISION}"
        jobs = store.list_jobs()
        assert [j.id for j in jobs] == [1, 2, 3, 4, 5]
        for j, old in zip(jobs, before["jobs"], strict=True):
            assert (j.name, j.team, j.state.value, int(j.priority), j.gpus) == (
                old["name"] or f"job-{old['id']}", old["team"], old["state"], old["priority"], old["gpus"]
            )  # fmt: skip
            assert (j.submitted_at, j.started_at, j.ended_at, j.exit_code, j.reason, j.attempt) == (
                old["submitted_at"], old["started_at"], old["ended_at"], old["exit_code"], old["reason"], old["attempt"]
            )  # fmt: skip
            assert j.spec.model_dump(exclude_defaults=True) == {
                k: v for k, v in json.loads(old["spec"]).items() if v not in (None, {}, False, 1, "default", "normal")
            } | ({"gpus": 2} if j.id == 1 else {})
            assert j.launch == (json.loads(old["launch"]) if old["launch"] else None)
            assert j.owner is None and j.restarts == (old.get("restarts") or 0)
        train, held = jobs[0], jobs[1]
        assert (train.spec.command, train.spec.env, train.priority) == (
            ["python", "train.py", "--epochs", "10"], {"WANDB_MODE": "offline"}, Priority.HIGH
        )  # fmt: skip
        assert train.request().time_limit_s == 7200 and train.request().gpu_types == ("H100-80GB",)
        assert held.allocation == Allocation((NodeSlice("node0", (0,)),))
        assert [r.job_id for r in store.queued_requests()] == [1]
        assert [e.state for e in store.events(4)] == [JobState.QUEUED, JobState.RUNNING, JobState.FAILED]
        assert sum(len(store.events(j.id)) for j in jobs) == len(before["job_events"])
        assert [a.exit_codes for a in store.attempts(4)] == ([(3,)] if version >= 3 else [])
        assert store.nodes()[0].node.name == "node0" and len(store.nodes()[0].node.gpus) == 8
        if version >= 2:
            assert store.load_usage() == ({"vision": 7200.0, "nlp": 30.0}, T0 + 30)
        # The upgraded database takes new jobs, new columns and all, and ids go on from there.
        new = store.create_job(spec(gpus=0.5, name="after"), T0 + 100, owner="alice")
        assert new == 6 and store.get_job(new).owner == "alice"  # type: ignore[union-attr]
        assert store.integrity_problems() == []
    finally:
        store.close()
    assert run_sql(store_target, "SELECT value FROM meta WHERE key = 'schema'", "SELECT * FROM alembic_version") == [
        [(str(schema.SCHEMA_VERSION),)],
        [(schema.HEAD_REVISION,)],
    ]
    assert schema_diffs(store_target) == []
    again = Store(store_target)
    try:
        assert again.migrated is None and len(again.list_jobs()) == 6
    finally:
        again.close()


@pytest.mark.backends("sqlite")  # legacy databases are SQLite files: PostgreSQL came with Alembic
def test_a_legacy_stamp_whose_old_upgrade_already_added_columns_upgrades(store_target: Path | str) -> None:
    """The old ad-hoc upgrade added columns and tables beyond what a stamp says (queued_at under
    version 2); the revisions add only what is missing."""
    make_legacy(store_target, 2)
    run_sql(store_target, "ALTER TABLE jobs ADD COLUMN queued_at FLOAT", "UPDATE jobs SET queued_at = submitted_at")
    store = Store(store_target)
    try:
        assert [r.queued_at for r in store.queued_requests()] == [T0]
        assert store.integrity_ok()
    finally:
        store.close()


def test_a_new_database_has_the_same_schema_as_a_migrated_one(store_target: Path | str) -> None:
    Store(store_target).close()  # created from the tables, stamped with the newest revision
    assert schema_diffs(store_target) == []
    assert run_sql(store_target, "SELECT * FROM alembic_version") == [[(schema.HEAD_REVISION,)]]


def test_every_revision_from_an_empty_database_gives_the_current_schema(store_target: Path | str) -> None:
    engine = create_engine(engine_url(store_target))
    try:
        with engine.begin() as conn:
            migrate.upgrade(conn)
    finally:
        engine.dispose()
    assert schema_diffs(store_target) == []
    store = Store(store_target)  # the newest revision already: nothing to do but stamp meta.schema
    try:
        assert store.migrated is None and store.integrity_ok()
    finally:
        store.close()


@pytest.mark.parametrize("revision", ["0099", "5f3a9c2e1b7d"])
def test_a_database_of_a_newer_version_is_refused_untouched(store_target: Path | str, revision: str) -> None:
    store = Store(store_target)
    job = store.create_job(spec(), T0)
    store.close()
    run_sql(store_target, f"UPDATE alembic_version SET version_num = '{revision}'")
    with pytest.raises(StoreError, match=rf"written by a newer gpucluster \(revision {revision}\); upgrade first"):
        Store(store_target)
    assert run_sql(store_target, "SELECT version_num FROM alembic_version", "SELECT id FROM jobs") == [
        [(revision,)],
        [(job,)],
    ]


def test_the_shipped_scripts_end_at_the_schema_version() -> None:
    assert migrate.script_head() == schema.HEAD_REVISION == f"{schema.SCHEMA_VERSION:04d}"


def test_critical_jobs_stay_critical_when_serving_takes_their_number(store_target: Path | str) -> None:
    """0014 put the serving class (3) between high and critical: a critical job written by 0013
    (priority 3) must still read as critical, never as a service replica's class."""
    store = Store(store_target)
    critical, high = store.create_job(spec(priority="critical"), T0), store.create_job(spec(priority="high"), T0)
    store.close()
    run_sql(
        store_target,
        f"UPDATE jobs SET priority = 3 WHERE id = {critical}",  # as revision 0013 stored critical
        "UPDATE alembic_version SET version_num = '0013'",
    )
    store = Store(store_target)
    try:
        assert store.migrated == f"upgraded from revision 0013 to {schema.HEAD_REVISION}"
        assert [store.get_job(i).priority for i in (critical, high)] == [Priority.CRITICAL, Priority.HIGH]  # type: ignore[union-attr]
    finally:
        store.close()
