"""The job store's schema migrations (Alembic) and its clock.

An upgraded deployment keeps its jobs: a store made at an older schema (with the migration
table, or from before migrations existed) is upgraded in place by ``create_schema``. Times are
the database's, so hosts whose clocks disagree still agree on heartbeats and staleness.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from service.jobs import MIGRATIONS, VERSION_TABLE, JobStore, jobs_table, new_job_id
from service.jobs.database import create_sqlite_file, make_engine, sqlite_path


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    return str(request.getfixturevalue("postgres_url"))


# The column that the revision after each one adds.
ADDED_AFTER = {"0001": "method", "0002": "promote"}


def at_revision(url: str, revision: str, *, drop_version_table: bool = False) -> None:
    """The schema of ``revision``, with two jobs in it, as a deployment of that time had."""
    path = sqlite_path(url)
    if path is not None:
        create_sqlite_file(path)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS))
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            old = sa.Table("mbn_jobs", sa.MetaData(), autoload_with=conn)
            # Really the old schema: each revision added one column.
            assert ADDED_AFTER[revision] not in old.c
            # A store made at 0002 holds jobs of other methods than MBN.
            method = {} if "method" not in old.c else {"method": "pca"}
            for status in ("succeeded", "queued"):
                conn.execute(
                    old.insert().values(
                        id=new_job_id(), name=f"old-{status}", status=status, progress=0.5,
                        params=json.dumps({"n_clusterings": 20}), data_file="data.npy",
                        n_rows=10, n_features=3, attempts=1, created_at=time.time(), **method,
                    )
                )  # fmt: skip
            if drop_version_table:  # a table made by create_all, before migrations existed
                conn.execute(sa.text(f"DROP TABLE {VERSION_TABLE}"))
    finally:
        engine.dispose()


def head() -> str:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    revision = ScriptDirectory.from_config(config).get_current_head()
    assert revision is not None
    return revision


@pytest.mark.parametrize(
    ("revision", "before_migrations"),
    [("0001", False), ("0001", True), ("0002", False)],
    ids=["0001", "before-migrations", "0002"],
)
def test_an_upgraded_store_keeps_its_jobs(url: str, revision: str, before_migrations: bool) -> None:
    at_revision(url, revision, drop_version_table=before_migrations)
    store = JobStore(url)
    try:
        store.create_schema()
        jobs = store.list_jobs()
        assert sorted(job.name for job in jobs) == ["old-queued", "old-succeeded"]
        # Jobs of 0001 were all MBN; those of 0002 keep their method.
        assert {job.method for job in jobs} == {"mbn" if revision == "0001" else "pca"}
        assert {job.promote for job in jobs} == {False}  # no job before 0003 asked to promote
        assert all(job.params == {"n_clusterings": 20} for job in jobs)
        # ... and the upgraded store works: the old queued job is claimed, new jobs go in.
        claimed = store.claim("w1")
        assert claimed is not None and claimed.name == "old-queued"
        new = store.submit(
            job_id=new_job_id(), name="new", params={"method": "mbn"}, data_file="d.npy",
            n_rows=4, n_features=2, max_queued=None, promote=True,
        )  # fmt: skip
        assert new.status == "queued" and new.promote is True
        with store.engine.connect() as conn:
            assert MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE}
            ).get_current_heads() == (head(),)
    finally:
        store.dispose()


def test_the_table_definition_matches_the_migrations(url: str) -> None:
    store = JobStore(url)
    try:
        store.create_schema()
        with store.engine.connect() as conn:
            columns = {column["name"] for column in sa.inspect(conn).get_columns("mbn_jobs")}
        assert columns == set(jobs_table.c.keys())
    finally:
        store.dispose()


def test_heartbeats_and_staleness_use_the_database_clock(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(url)
    try:
        store.create_schema()
        job = store.submit(
            job_id=new_job_id(), name="m", params={}, data_file="d.npy", n_rows=4,
            n_features=2, max_queued=None,
        )  # fmt: skip
        # This host's clock runs an hour fast (a badly set machine among the workers).
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600)
        claimed = store.claim("w1")
        assert claimed is not None
        assert store.heartbeat(job.id, "w1", progress=0.5, phase="fit")
        beat = store.require(job.id).heartbeat_at
        assert beat is not None and abs(beat - real()) < 600  # the database's time
        # A worker with the fast clock does not see a fresh heartbeat as stale ...
        assert store.recover_stale(stale_after=60, max_attempts=3) == []
        # ... and staleness is still judged: by the database, a minus-second threshold
        # makes every running job stale.
        assert store.recover_stale(stale_after=-1, max_attempts=3) == [(job.id, "queued")]
    finally:
        store.dispose()
