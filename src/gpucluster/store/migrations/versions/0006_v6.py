"""Version 6: the metrics a training script reports (gpucluster.train.report), per attempt.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.create_table(
        "job_metrics",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("step", sa.BigInteger),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("value", sa.Float, nullable=False),
    )
    h.create_index("ix_job_metrics_job", "job_metrics", ["job_id", "attempt"])


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
