"""Version 4: identity and access (jobs.owner, users, memberships, tokens, audit), telemetry and
health, node presence, accounting (legacy `meta.schema` 4; the first Alembic head).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns("jobs", sa.Column("owner", sa.String(128)))
    h.create_table(
        "users",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("cluster_admin", sa.Boolean, nullable=False),
        sa.Column("unix_user", sa.String(64)),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    h.create_table(
        "memberships",
        sa.Column("user", sa.String(128), sa.ForeignKey("users.name"), primary_key=True),
        sa.Column("team", sa.String(128), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
    )
    h.create_table(
        "tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user", sa.String(128), sa.ForeignKey("users.name"), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float),
        sa.Column("revoked_at", sa.Float),
        sa.Column("note", sa.String(256), nullable=False),
        sqlite_autoincrement=True,
    )
    h.create_index("ix_tokens_user", "tokens", ["user"])
    h.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sqlite_autoincrement=True,
    )
    h.create_index("ix_audit_at", "audit", ["at"])
    h.create_table(
        "gpu_samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("gpu", sa.Integer, nullable=False),
        sa.Column("level", sa.Integer, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("jobs", sa.String(255), nullable=False),
        sa.Column("utilization", sa.Float),
        sa.Column("memory_used_mb", sa.Float),
        sa.Column("temperature_c", sa.Float),
        sa.Column("power_w", sa.Float),
        sa.Column("sm_clock_mhz", sa.Float),
        sa.Column("memory_clock_mhz", sa.Float),
    )
    h.create_index("ix_gpu_samples_level_at", "gpu_samples", ["level", "at"])
    h.create_index("ix_gpu_samples_node_gpu_at", "gpu_samples", ["node", "gpu", "at"])
    h.create_table(
        "node_states",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("drained", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("since", sa.Float, nullable=False),
    )
    h.create_table(
        "gpu_health",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("gpu", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("problem", sa.Text, nullable=False),
        sa.Column("since", sa.Float, nullable=False),
    )
    h.create_table(
        "job_flags",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("flag", sa.String(16), primary_key=True),
        sa.Column("since", sa.Float, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
    )
    h.create_table(
        "node_presence",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("incarnation", sa.String(128), nullable=False),
        sa.Column("up", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("since", sa.Float, nullable=False),
    )
    h.create_table(
        "job_usage",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128)),
        sa.Column("gpu_model", sa.String(255), nullable=False),
        sa.Column("gpus", sa.Float, nullable=False),
        sa.Column("allocation", sa.Text),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("accrued_until", sa.Float, nullable=False),
        sa.Column("gpu_seconds", sa.Float, nullable=False),
        sa.Column("cost", sa.Float, nullable=False),
        sa.Column("energy_j", sa.Float, nullable=False),
        sa.Column("used_gpu_seconds", sa.Float, nullable=False),
        sa.Column("sampled_gpu_seconds", sa.Float, nullable=False),
        sa.Column("final", sa.Boolean, nullable=False),
        sa.Column("outcome", sa.String(16)),
        sa.Column("work_lost_s", sa.Float),
    )
    h.create_index("ix_job_usage_until", "job_usage", ["accrued_until"])
    h.create_index("ix_job_usage_team_until", "job_usage", ["team", "accrued_until"])
    # Made by the accountant at its start before Alembic; part of the schema from here on.
    h.create_index("ix_attempts_ended_at", "attempts", ["ended_at"])


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
