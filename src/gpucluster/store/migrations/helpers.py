"""Idempotent schema operations for the migrations.

Before Alembic, the store upgraded a data dir by creating every missing table and adding every
missing column, then stamped `meta.schema`. Such a database can hold more than its stamp says
(a version-2 stamp with `queued_at`, a version-3 one with the telemetry tables), so every step
here checks what is there before it adds: a legacy database mapped onto any revision upgrades
cleanly, and so does one a crash left between two steps of the old upgrade.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op


def _inspector() -> sa.Inspector:
    return sa.inspect(op.get_bind())


def has_table(name: str) -> bool:
    return name in _inspector().get_table_names()


def create_table(name: str, *columns: Any, **kw: Any) -> None:
    if not has_table(name):
        op.create_table(name, *columns, **kw)


def add_columns(table: str, *columns: sa.Column[Any]) -> None:
    have = {c["name"] for c in _inspector().get_columns(table)}
    for col in columns:
        if col.name not in have:
            op.add_column(table, col)


def create_index(name: str, table: str, columns: list[str], unique: bool = False) -> None:
    if name not in {ix["name"] for ix in _inspector().get_indexes(table)}:
        op.create_index(name, table, columns, unique=unique)


def is_sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"
