"""Version 11: jobs.failed_rank, which process of a distributed attempt failed first, as data.

Before, the rank was written at the start of `stop_message` ("rank 2 exit code 1") and parsed
back with a regular expression when the attempt ended; a message that changed wording would have
silently lost it.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa

from gpucluster.store.migrations import helpers as h

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    h.add_columns("jobs", sa.Column("failed_rank", sa.Integer))


def downgrade() -> None:
    raise NotImplementedError("gpucluster never downgrades a data dir")
