"""Version 9: jobs.kind, what sort of work a job is (batch, or an interactive session); the same
on each accounting row, with the GPU-seconds it held idle (for `gpucluster usage`'s sessions).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for every job from before: they were all batch jobs.
    h.add_columns("jobs", sa.Column("kind", sa.String(16)))
    h.add_columns("job_usage", sa.Column("kind", sa.String(16)), sa.Column("idle_gpu_seconds", sa.Float))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
