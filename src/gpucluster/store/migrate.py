"""Bring a database to the current schema when the store opens it: Alembic, run programmatically.

The migration scripts ship inside the package (store/migrations/versions); users need no
alembic.ini and run no command. What the store does, in its write transaction (so two heads
opening one database at once take turns):

- an empty database: create every table and stamp the newest revision (Alembic is not even
  imported: the common case of a test or a first `gpucluster up` stays fast);
- a database from before Alembic (`meta.schema` N, no `alembic_version`): upgrade from revision
  000N's parent (revision N again: the old ad-hoc upgrade added columns under a stamp without
  changing it); the revisions only add what is missing, so whatever it added is kept as it is;
- an Alembic database at an older revision: upgrade to the newest;
- a revision or `meta.schema` this version does not know: refused, the database untouched (it
  was written by a newer gpucluster).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Column, Connection, MetaData, PrimaryKeyConstraint, String, Table, inspect, select, update

from gpucluster.errors import GpuclusterError
from gpucluster.store import schema

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
LEGACY_MAX = 4  # the last `meta.schema` written before Alembic; 1..4 map onto revisions 0001..0004

# Alembic's own bookkeeping table, as Alembic creates it.
version_table = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)


class NewerSchema(GpuclusterError):
    """The database was written by a newer gpucluster."""


def prepare(conn: Connection) -> str | None:
    """Make the database behind `conn` current (in `conn`'s transaction).

    Returns what was done, for the log ("created", "upgraded from N to M"); None if nothing.
    Raises NewerSchema, changing nothing, for a database of a newer version.
    """
    tables = set(inspect(conn).get_table_names())
    legacy = _legacy_version(conn) if "meta" in tables else None
    if legacy is not None and legacy > schema.SCHEMA_VERSION:
        raise NewerSchema(f"schema {legacy}")
    if "alembic_version" in tables:
        current = conn.execute(select(version_table.c.version_num)).scalar()
        if current is None or not current.isdigit() or int(current) > schema.SCHEMA_VERSION:
            raise NewerSchema(f"revision {current}")
        if legacy is not None and legacy < int(current):
            # `meta.schema` is below the revision: the schema was taken back by hand (or an older
            # data dir's meta table copied in); the idempotent revisions from there redo it.
            current = f"{max(legacy - 1, 0):04d}"
            conn.execute(update(version_table).values(version_num=current))
    elif "meta" in tables or "jobs" in tables:
        # From before Alembic. Its stamp N says revision N, but the old upgrade added columns
        # without a new stamp (queued_at under 2), so revision N itself is run again: every
        # revision adds only what is missing. No stamp (a crash between creating the tables and
        # stamping them): every revision.
        version = min(legacy or 1, LEGACY_MAX)
        if version > 1:
            version_table.create(conn)
            conn.execute(version_table.insert().values(version_num=f"{version - 1:04d}"))
        upgrade(conn)
        _stamp_legacy(conn, legacy)
        return f"upgraded from schema {legacy} (before Alembic) to revision {schema.HEAD_REVISION}"
    else:
        schema.metadata.create_all(conn)
        version_table.create(conn)
        conn.execute(version_table.insert().values(version_num=schema.HEAD_REVISION))
        conn.execute(schema.meta.insert().values(key="schema", value=str(schema.SCHEMA_VERSION)))
        return "created"
    if current == schema.HEAD_REVISION:
        _stamp_legacy(conn, legacy)
        return None
    if current == "0000":
        conn.execute(version_table.delete())  # from the start: Alembic's "no revision yet"
    upgrade(conn)
    _stamp_legacy(conn, legacy)
    return f"upgraded from revision {current} to {schema.HEAD_REVISION}"


def upgrade(conn: Connection, to: str = "heads") -> None:
    """Run the migration scripts on `conn` up to `to` (in its transaction)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    command.upgrade(config, to)


def script_head() -> str:
    """The newest revision among the shipped scripts (tests check it is schema.HEAD_REVISION)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def _legacy_version(conn: Connection) -> int | None:
    row = conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema")).first()
    return int(row[0]) if row is not None else None


def _stamp_legacy(conn: Connection, legacy: int | None) -> None:
    """Keep `meta.schema` at the schema version, so a gpucluster from before Alembic refuses a
    database that has moved past what it knows."""
    value = str(schema.SCHEMA_VERSION)
    if legacy is None:
        conn.execute(schema.meta.insert().values(key="schema", value=value))
    elif legacy != schema.SCHEMA_VERSION:
        conn.execute(update(schema.meta).where(schema.meta.c.key == "schema").values(value=value))
