"""Each job records its embedding method (jobs queued before were all MBN).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mbn_jobs") as batch:
        batch.add_column(sa.Column("method", sa.String(32), nullable=False, server_default="mbn"))


def downgrade() -> None:
    with op.batch_alter_table("mbn_jobs") as batch:
        batch.drop_column("method")
