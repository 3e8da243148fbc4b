"""Version 1: jobs, their events, nodes (the first release; legacy `meta.schema` 1).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.create_table(
        "meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    h.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),  # a Float from version 2 on
        sa.Column("gpu_type", sa.String(64)),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("ended_at", sa.Float),
        sa.Column("exit_code", sa.Integer),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("allocation", sa.Text),
        sa.Column("launch", sa.Text),
        sa.Column("stop_reason", sa.String(32)),
        sa.Column("stop_requested_at", sa.Float),
        sa.Column("term_sent", sa.Boolean, nullable=False),
        sa.Column("kill_sent", sa.Boolean, nullable=False),
        sqlite_autoincrement=True,
    )
    h.create_index("ix_jobs_state", "jobs", ["state"])
    h.create_index("ix_jobs_team_state", "jobs", ["team", "state"])
    h.create_table(
        "job_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    h.create_index("ix_job_events_job", "job_events", ["job_id"])
    h.create_table(
        "nodes",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("virtual", sa.Boolean, nullable=False),
        sa.Column("gpus", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
