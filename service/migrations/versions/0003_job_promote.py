"""Each job records whether it asked to promote its model (jobs queued before did not).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mbn_jobs") as batch:
        batch.add_column(
            sa.Column("promote", sa.Boolean, nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("mbn_jobs") as batch:
        batch.drop_column("promote")
