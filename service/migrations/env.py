"""Alembic environment: migrations run on the connection ``JobStore.create_schema`` passes in
(``config.attributes["connection"]``), inside its transaction and lock."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table="mbn_alembic_version")
with context.begin_transaction():
    context.run_migrations()
