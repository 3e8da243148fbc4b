"""Alembic environment: the store hands over its open connection (in its write transaction).

Run programmatically by gpucluster.store.migrate; no alembic.ini is needed. For a developer's
`alembic` command line, `url` in the config's main section names the database instead.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gpucluster.store import schema

config = context.config
connection = config.attributes.get("connection")

if connection is not None:
    context.configure(connection=connection, target_metadata=schema.metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    with create_engine(config.get_main_option("url") or "sqlite://").connect() as conn:
        context.configure(connection=conn, target_metadata=schema.metadata)
        with context.begin_transaction():
            context.run_migrations()
