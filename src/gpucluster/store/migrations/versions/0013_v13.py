"""Version 13: nodes.labels, what jobs select a node by (submit --constraint; issue 16).

A JSON list of strings (flags such as ib, and key=value pairs such as rack=r1); NULL reads as no
labels, so rows of earlier versions need no rewrite.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns("nodes", sa.Column("labels", sa.Text))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
