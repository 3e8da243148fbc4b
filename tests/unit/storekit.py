"""Raw SQL on a store's database, behind the store's back: a SQLite file or a PostgreSQL URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text


def engine_url(target: Path | str) -> str:
    if isinstance(target, Path):
        return f"sqlite:///{target}"
    return target.replace("postgresql://", "postgresql+psycopg://", 1)


def run_sql(target: Path | str, *statements: str) -> list[list[Any]]:
    """Run statements in one transaction; each one's rows (empty for those returning none)."""
    engine = create_engine(engine_url(target))
    try:
        with engine.begin() as c:
            out = []
            for stmt in statements:
                res = c.execute(text(stmt))
                out.append([tuple(r) for r in res] if res.returns_rows else [])
            return out
    finally:
        engine.dispose()
