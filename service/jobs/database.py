"""The job store's database connections: the engines for SQLite and PostgreSQL, and the
SQLite file's own checks (made once and never again by a connection, its identity, whether
it can be written, free space, reads that make no files on a full disk)."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

# A SQLite store's disk with less free space than this counts as full (SQLite's own errors
# on a full disk are often "disk I/O error").
FULL_BELOW_BYTES = 1 << 20


def sqlite_path(url: str) -> Path | None:
    if not url.startswith("sqlite"):
        return None
    path = sa.engine.make_url(url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return Path(path).absolute()


def create_sqlite_file(path: Path) -> None:
    """Create an empty SQLite file if there is none: the engine itself never creates one
    (``mode=rw``), so a deleted store is an error, not a silent new empty store."""
    import sqlite3

    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        sqlite3.connect(path).close()


def file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def writable(path: Path) -> bool:
    """Whether the file and its directory (journal files) can be written, read-only mounts
    included (``os.access`` reports those even for root)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # mode=rw: connecting never creates the file (see create_sqlite_file).
            url = f"sqlite:///file:{urllib.parse.quote(str(path))}?mode=rw&uri=true"
        # No pool: a connection per operation, so no file descriptor outlives it. A store
        # file deleted or replaced is never written through a stale descriptor, and the
        # file system can be remounted read-only by an operator.
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            poolclass=sa.pool.NullPool,
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy emit BEGIN itself (below), WAL so readers never block writers.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # Writers take the write lock up front: read-then-update is then atomic.
            immediate = conn.get_execution_options().get("mbn_immediate", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


def disk_full(path: Path | None) -> bool:
    """Whether the disk of the SQLite file ``path`` has less than ``FULL_BELOW_BYTES`` free
    (False for PostgreSQL, ``path`` None, or a disk that cannot be asked)."""
    if path is None:
        return False
    try:
        stats = os.statvfs(path.parent)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < FULL_BELOW_BYTES


def immutable_engine(path: Path) -> Engine:
    """An engine that reads the SQLite file ``path`` as it is, making no journal files."""
    quoted = urllib.parse.quote(str(path))
    return sa.create_engine(
        f"sqlite:///file:{quoted}?immutable=1&uri=true",
        connect_args={"check_same_thread": False},
        poolclass=sa.pool.NullPool,
    )
