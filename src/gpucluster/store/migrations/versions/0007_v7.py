"""Version 7: how long a container job's attempt waited for its image (attempts.pull_s).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns("attempts", sa.Column("pull_s", sa.Float))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
