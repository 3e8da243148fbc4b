"""Version 12: nodes.labels, what jobs select a node by (submit --constraint; issue 16).

A JSON list of strings (flags such as ib, and key=value pairs such as rack=r1); NULL reads as no
labels, so rows of earlier versions need no rewrite.

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
    h.add_columns("nodes", sa.Column("labels", sa.Text))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
