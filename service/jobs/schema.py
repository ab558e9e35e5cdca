"""The job store's table, the database clock it records, and its migrations.

The table is made and changed by the Alembic migrations in ``service/migrations`` (the
definition here must match their head; tests/service/test_migrations.py checks it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

metadata = sa.MetaData()

jobs_table = sa.Table(
    "mbn_jobs",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("progress", sa.Double, nullable=False, default=0.0),
    sa.Column("phase", sa.String(32)),
    sa.Column("params", sa.Text, nullable=False),
    sa.Column("data_file", sa.String(64), nullable=False),
    sa.Column("n_rows", sa.Integer, nullable=False),
    sa.Column("n_features", sa.Integer, nullable=False),
    sa.Column("model_id", sa.String(128)),
    sa.Column("error", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("worker_id", sa.String(128)),
    # Seconds since the epoch (UTC): portable across both databases, no time zone surprises.
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("started_at", sa.Double),
    sa.Column("finished_at", sa.Double),
    sa.Column("heartbeat_at", sa.Double),
    # Rows from before the column were all MBN jobs: the migration's default is that fact, not
    # the registry's default method.
    sa.Column("method", sa.String(32), nullable=False, server_default="mbn"),
    # Whether the job asked for its model to become the default and its name's version.
    sa.Column("promote", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Index("ix_mbn_jobs_status_created", "status", "created_at"),
)
# The table is made and changed by the Alembic migrations in service/migrations (the
MIGRATIONS = Path(__file__).parent.parent / "migrations"
# The revision that is the table deployments made before migrations existed.
BASELINE_REVISION = "0001"
VERSION_TABLE = "mbn_alembic_version"
# PostgreSQL channel on which a job entering the queue is announced (LISTEN/NOTIFY), so idle
# stand-alone workers wake at once instead of at their next poll.
NOTIFY_CHANNEL = "mbn_jobs_queued"


class db_now(FunctionElement[float]):
    """The database's clock, in seconds since the epoch: every time the store records or
    compares (heartbeats, staleness, claims, submissions) is the database's, so workers on
    hosts whose clocks disagree still agree on which job is stale."""

    type = sa.Double()
    inherit_cache = True


@compiles(db_now, "postgresql")
def _now_postgresql(element: db_now, compiler: Any, **kw: Any) -> str:
    # clock_timestamp(), not now(): now() is the start of the transaction.
    return "EXTRACT(EPOCH FROM clock_timestamp())"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


def migrate(conn: Connection) -> None:
    """Bring the schema to the newest migration, on ``conn`` and inside its transaction."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    inspector = sa.inspect(conn)
    if inspector.has_table(jobs_table.name) and not inspector.has_table(VERSION_TABLE):
        command.stamp(config, BASELINE_REVISION)  # made before migrations: the baseline
    command.upgrade(config, "head")
