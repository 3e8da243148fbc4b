"""Version 12: node_states.until, a drain's planned end (`gpucluster drain --until 14:00`).

Why: a drain without an end left queued jobs that only the drained node could host with "no set
of nodes can host it" and no estimate; with its end known the scheduler says so, the estimates
count from it, and the head ends the drain by itself then.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns("node_states", sa.Column("until", sa.Float))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
