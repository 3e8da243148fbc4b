"""Version 10: services (a record plus its replica jobs, services/).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.create_table(
        "services",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128)),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("ready_once", sa.Boolean, nullable=False),
    )
    h.create_table(
        "service_replicas",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("service", sa.String(128), sa.ForeignKey("services.name"), nullable=False),
        sa.Column("job_id", sa.Integer),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("draining_since", sa.Float),
    )
    h.create_index("ix_service_replicas_service", "service_replicas", ["service"])


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
