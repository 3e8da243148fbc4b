"""Version 15: service_jobs, every job that was a replica of a service (issue 23).

Replica rows go when a replica is replaced; this table keeps the link, so that a service's
GPU-hours, cost and energy are the sum of its replica jobs' usage. Filled here from the replica
rows that exist; replicas replaced before this version are not counted.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpucluster.store.migrations import helpers as h

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if not h.has_table("service_jobs"):
        h.create_table(
            "service_jobs",
            sa.Column("service", sa.String(128), sa.ForeignKey("services.name"), primary_key=True),
            sa.Column("job_id", sa.Integer, primary_key=True),
        )
        op.execute(
            sa.text(
                "INSERT INTO service_jobs (service, job_id) "
                "SELECT DISTINCT service, job_id FROM service_replicas WHERE job_id IS NOT NULL"
            )
        )


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
