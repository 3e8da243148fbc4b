"""Version 16: nodes.cpus and nodes.memory_mb, the CPU cores and host memory (MiB) jobs may ask
for beside GPUs (submit --cpus/--mem; issue 16).

NULL reads as "not accounted" (any request fits the node), so rows of earlier versions need no
rewrite: a head that starts again records its nodes with what it discovers.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns("nodes", sa.Column("cpus", sa.Float), sa.Column("memory_mb", sa.BigInteger))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
