"""Version 3: restarts with backoff, progress reports, attempts (legacy `meta.schema` 3).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns(
        "jobs",
        sa.Column("not_before", sa.Float),
        sa.Column("restarts", sa.Integer),
        sa.Column("progress_step", sa.Integer),
        sa.Column("progress_at", sa.Float),
        sa.Column("checkpoint_step", sa.Integer),
    )
    h.create_table(
        "attempts",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("started_at", sa.Float),
        sa.Column("ended_at", sa.Float, nullable=False),
        sa.Column("allocation", sa.Text),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("exit_codes", sa.Text, nullable=False),
        sa.Column("work_lost_s", sa.Float),
    )


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
