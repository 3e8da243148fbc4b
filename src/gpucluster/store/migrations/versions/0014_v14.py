"""Version 14: the serving priority class (issue 23) sits between high and critical.

Priorities are stored as the core's integers (low 0, normal 1, high 2); critical moves from 3 to
4 so that serving can be 3. Job specs keep class names, so only `jobs.priority` changes.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE jobs SET priority = 4 WHERE priority = 3"))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
