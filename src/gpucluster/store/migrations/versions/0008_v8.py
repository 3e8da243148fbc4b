"""Version 8: holds and job arrays (issue 20): jobs.held, jobs.array_id, jobs.array_index; arrays.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns(
        "jobs",
        sa.Column("held", sa.Boolean),
        sa.Column("array_id", sa.Integer),
        sa.Column("array_index", sa.Integer),
    )
    h.create_index("ix_jobs_array", "jobs", ["array_id", "array_index"])
    h.create_table(
        "arrays",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("throttle", sa.Integer),
        sa.Column("sweep", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
