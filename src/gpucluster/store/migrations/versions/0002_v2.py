"""Version 2: the scheduler's columns (request, wait reason, estimates, checkpoints, queued_at),
fractional GPUs, team_usage (legacy `meta.schema` 2).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpucluster.store.migrations import helpers as h

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns(
        "jobs",
        sa.Column("request", sa.Text),
        sa.Column("wait_reason", sa.String(32)),
        sa.Column("estimated_start", sa.Float),
        sa.Column("stop_message", sa.Text),
        sa.Column("last_checkpoint_at", sa.Float),
        sa.Column("queued_at", sa.Float),  # added under the version-2 stamp, so it may be missing
    )
    if not h.is_sqlite():
        # SQLite keeps a fraction in an INTEGER column as it is (type affinity); others must change it.
        op.alter_column("jobs", "gpus", type_=sa.Float, existing_nullable=False)
    h.create_table(
        "team_usage",
        sa.Column("team", sa.String(128), primary_key=True),
        sa.Column("gpu_seconds", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
