"""Version 5: what each ended attempt used, from its processes' cgroups (CPU seconds, peak memory).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns("attempts", sa.Column("cpu_s", sa.Float), sa.Column("memory_peak_bytes", sa.BigInteger))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
