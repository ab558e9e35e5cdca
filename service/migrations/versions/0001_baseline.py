"""The job table as deployments before migrations created it.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mbn_jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("progress", sa.Double, nullable=False),
        sa.Column("phase", sa.String(32)),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("data_file", sa.String(64), nullable=False),
        sa.Column("n_rows", sa.Integer, nullable=False),
        sa.Column("n_features", sa.Integer, nullable=False),
        sa.Column("model_id", sa.String(128)),
        sa.Column("error", sa.Text),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("worker_id", sa.String(128)),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("started_at", sa.Double),
        sa.Column("finished_at", sa.Double),
        sa.Column("heartbeat_at", sa.Double),
    )
    op.create_index("ix_mbn_jobs_status_created", "mbn_jobs", ["status", "created_at"])


def downgrade() -> None:
    op.drop_table("mbn_jobs")
