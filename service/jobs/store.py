"""The job store: training jobs in SQL (SQLite by default, PostgreSQL for several replicas).

A job moves ``queued -> running -> succeeded | failed | cancelled`` (or ``queued -> cancelled``).
Every transition is a compare-and-set ``UPDATE ... WHERE status = <expected>`` (and, once
running, ``AND worker_id = <owner>``), so two parties can never both win one: that is what
makes each job run, and its result land, exactly once.

- Claim: the oldest queued job, ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL (workers
  never wait on each other), a ``BEGIN IMMEDIATE`` transaction on SQLite.
- Heartbeat: the owner records progress every few seconds; the same statement tells it
  whether it still owns the job (a cancel or a recovery takes ownership away).
- Recovery: a running job whose heartbeat is older than ``stale_after`` lost its worker
  (killed, machine gone). It is requeued while it has been started fewer than
  ``max_attempts`` times, and failed after that, so a job that kills its worker cannot loop
  forever. A worker that shuts down cleanly gives its job back at once (``release``), and
  that start does not count as an attempt.
- Cancel: a queued or running job becomes ``cancelled`` at once; the worker running it sees
  that at its next heartbeat and stops the training process.
"""

from __future__ import annotations

import json
import logging
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from mbn_core.methods import DEFAULT_METHOD
from service.domain import (
    Conflict,
    InsufficientStorage,
    NotFound,
    Overloaded,
    Unavailable,
    shortened,
)
from service.jobs.database import (
    create_sqlite_file,
    disk_full,
    file_identity,
    immutable_engine,
    make_engine,
    sqlite_path,
    writable,
)
from service.jobs.model import STARTING_PHASE, TERMINAL_STATUSES, Job, is_job_id
from service.jobs.schema import NOTIFY_CHANNEL, db_now, jobs_table, migrate

log = logging.getLogger(__name__)

# Arbitrary constant naming the PostgreSQL advisory lock that serialises schema creation and
# the queue-length check of submit.
_PG_LOCK_KEY = zlib.crc32(b"mbn_jobs")
_ERROR_MAX_CHARS = 4000
# Seconds a listener waits for a notification before looking at its stop flag, and waits
# before reconnecting after losing its connection.
_LISTEN_TIMEOUT = 1.0
_LISTEN_RETRY = 5.0


class JobStore:
    """Training jobs in a SQL database reached through SQLAlchemy.

    Parameters
    ----------
    url : str
        ``sqlite:///path`` or ``postgresql+psycopg://...``.
    retry_after : int
        Seconds after which to retry, given with the ``Overloaded`` and ``Unavailable``
        errors it raises.
    clock : callable, optional
        Returns the time, in seconds since the epoch, that the store records and compares
        (submissions, claims, heartbeats, staleness). None, the default and what a service
        uses: the database's clock, so that hosts whose clocks disagree still agree on which
        job is stale. Tests pass a clock they move forward instead of sleeping.
    """

    def __init__(
        self, url: str, *, retry_after: int = 1, clock: Callable[[], float] | None = None
    ) -> None:
        self.url = url
        self.retry_after = retry_after
        self.clock = clock
        self.sqlite_path = sqlite_path(url)
        self.engine = make_engine(url)
        self.is_postgres = self.engine.dialect.name == "postgresql"
        # The SQLite file's identity (device, inode) when the schema was made: a store file
        # deleted or replaced under the running service is noticed on the next operation,
        # instead of writing jobs into a deleted file that nobody will ever read again.
        self._identity: tuple[int, int] | None = None
        self._file_lost = False
        self._immutable: Engine | None = None  # reads on a full disk (SQLite)

    # --- lifecycle ---------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Create or upgrade the table (Alembic migrations); safe when several processes
        start at once. A table made before migrations existed is taken as the baseline
        revision and upgraded: its jobs are kept."""
        if self.sqlite_path is not None:
            create_sqlite_file(self.sqlite_path)
        with self._translate(), self.engine.connect() as conn:
            conn.execution_options(mbn_immediate=True)
            with conn.begin():
                if self.is_postgres:
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_KEY)))
                migrate(conn)
        if self.sqlite_path is not None:
            self._identity = file_identity(self.sqlite_path)
            self._file_lost = False

    def ping(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """What keeps the store from durably recording a job now (empty: nothing)."""
        try:
            self._check_file()
            with self._translate(), self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
                if self.is_postgres:
                    read_only = conn.execute(sa.text("SHOW transaction_read_only")).scalar()
                    if read_only == "on":
                        return ["job store is read-only (transaction_read_only)"]
        except (Unavailable, InsufficientStorage) as exc:
            return [exc.message]
        except sa.exc.SQLAlchemyError as exc:
            return [f"job store unreachable ({type(exc).__name__})"]
        if self.sqlite_path is not None and not writable(self.sqlite_path):
            return ["job store is read-only (its file or directory cannot be written)"]
        return []

    def dispose(self) -> None:
        self.engine.dispose()
        if self._immutable is not None:
            self._immutable.dispose()

    # --- API side ----------------------------------------------------------------------------
    def queued_count(self) -> int:
        with self._read() as conn:
            return self._queued_count(conn)

    def submit(
        self,
        *,
        job_id: str,
        name: str,
        params: dict[str, Any],
        data_file: str,
        n_rows: int,
        n_features: int,
        max_queued: int | None,
        promote: bool = False,
    ) -> Job:
        """Queue a job whose data is already on disk (``promote``: make its model the
        default and its name's version once it succeeds). Raises ``Overloaded`` when the
        queue is full and ``Conflict`` when the id exists."""
        with self._write() as conn:
            if self.is_postgres:
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_KEY)))
            if max_queued is not None and self._queued_count(conn) >= max_queued:
                raise Overloaded(
                    f"{max_queued} training jobs are already queued; retry later",
                    retry_after=self.retry_after,
                )
            exists = conn.execute(
                sa.select(jobs_table.c.id).where(jobs_table.c.id == job_id)
            ).first()
            if exists:
                raise Conflict(f"job {job_id} already exists")
            conn.execute(
                jobs_table.insert().values(
                    id=job_id,
                    name=name,
                    status="queued",
                    progress=0.0,
                    params=json.dumps(params, sort_keys=True),
                    data_file=data_file,
                    n_rows=n_rows,
                    n_features=n_features,
                    attempts=0,
                    created_at=self._now(),
                    method=str(params.get("method", DEFAULT_METHOD)),
                    promote=promote,
                )
            )
            self._announce(conn, job_id)
        # Committed, but into the file that is still the store? (Deleted meanwhile, the
        # commit went into an unlinked file: the job would never run. Unavailable, not queued.)
        self._check_file()
        job = self.get(job_id)
        assert job is not None
        return job

    def get(self, job_id: str) -> Job | None:
        if not is_job_id(job_id):
            return None
        with self._read() as conn:
            row = (
                conn.execute(sa.select(jobs_table).where(jobs_table.c.id == job_id))
                .mappings()
                .first()
            )
        return None if row is None else Job.from_row(row)

    def require(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job is None:
            raise NotFound(f"no job {shortened(job_id)!r}")
        return job

    def list_jobs(self, *, status: str | None = None, limit: int = 100) -> list[Job]:
        query = sa.select(jobs_table).order_by(jobs_table.c.created_at.desc(), jobs_table.c.id)
        if status is not None:
            query = query.where(jobs_table.c.status == status)
        with self._read() as conn:
            rows = conn.execute(query.limit(limit)).mappings().all()
        return [Job.from_row(row) for row in rows]

    def count_by_status(self) -> dict[str, int]:
        with self._read() as conn:
            rows = conn.execute(
                sa.select(jobs_table.c.status, sa.func.count()).group_by(jobs_table.c.status)
            ).all()
        return {status: int(count) for status, count in rows}

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job. ``NotFound``, or ``Conflict`` when it finished."""
        job = self.require(job_id)
        with self._write() as conn:
            done = conn.execute(
                jobs_table.update()
                .where(
                    jobs_table.c.id == job_id,
                    jobs_table.c.status.in_(("queued", "running")),
                )
                .values(status="cancelled", finished_at=self._now())
            ).rowcount
        job = self.require(job_id)
        if not done:
            raise Conflict(
                f"job {job_id} already {job.status}; only queued or running jobs can be cancelled"
            )
        return job

    # --- worker side -------------------------------------------------------------------------
    def claim(self, worker_id: str) -> Job | None:
        """Take the oldest queued job for this worker, or None when there is none."""
        with self._write() as conn:
            row = conn.execute(
                sa.select(jobs_table.c.id)
                .where(jobs_table.c.status == "queued")
                .order_by(jobs_table.c.created_at, jobs_table.c.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            claimed = conn.execute(
                jobs_table.update()
                .where(jobs_table.c.id == row.id, jobs_table.c.status == "queued")
                .values(
                    status="running",
                    worker_id=worker_id,
                    started_at=self._now(),
                    heartbeat_at=self._now(),
                    progress=0.0,
                    # Never null while running: the training process loads its data first.
                    phase=STARTING_PHASE,
                    attempts=jobs_table.c.attempts + 1,
                )
            ).rowcount
            if not claimed:  # pragma: no cover - the row lock / immediate transaction prevent it
                return None
        return self.get(row.id)

    def heartbeat(self, job_id: str, worker_id: str, *, progress: float, phase: str | None) -> bool:
        """Record liveness and progress; False when the worker no longer owns the job
        (cancelled, or recovered after a missed heartbeat): it must stop."""
        with self._write() as conn:
            return bool(
                conn.execute(
                    self._owned(job_id, worker_id).values(
                        heartbeat_at=self._now(),
                        progress=min(1.0, max(0.0, progress)),
                        phase=phase,
                    )
                ).rowcount
            )

    def finish(
        self,
        job_id: str,
        worker_id: str,
        *,
        status: str,
        model_id: str | None = None,
        error: str | None = None,
    ) -> bool:
        """Record the outcome; False when the worker lost the job meanwhile."""
        assert status in TERMINAL_STATUSES
        values: dict[str, Any] = {"status": status, "finished_at": self._now(), "phase": None}
        if status == "succeeded":
            values.update(progress=1.0, model_id=model_id)
        if error is not None:
            values["error"] = error[:_ERROR_MAX_CHARS]
        with self._write() as conn:
            return bool(conn.execute(self._owned(job_id, worker_id).values(**values)).rowcount)

    def release(self, job_id: str, worker_id: str) -> bool:
        """Give a running job back to the queue (clean shutdown); the start does not count."""
        with self._write() as conn:
            released = bool(
                conn.execute(
                    self._owned(job_id, worker_id).values(
                        status="queued",
                        worker_id=None,
                        started_at=None,
                        heartbeat_at=None,
                        progress=0.0,
                        phase=None,
                        attempts=jobs_table.c.attempts - 1,
                    )
                ).rowcount
            )
            if released:
                self._announce(conn, job_id)
            return released

    def listen(self, wake: Callable[[], object], stop: threading.Event) -> None:
        """Call ``wake()`` whenever a job enters the queue, until ``stop`` is set (blocking:
        run it on a thread). PostgreSQL only (LISTEN/NOTIFY); elsewhere it returns at once
        and workers poll. A lost connection is retried; polling covers the gap."""
        if not self.is_postgres:
            return
        import psycopg

        conninfo = self.engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        while not stop.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    wake()  # anything queued while we were not listening
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=_LISTEN_TIMEOUT):
                            wake()
            except psycopg.Error as exc:
                log.warning("job notifications lost (%s); polling until they are back", exc)
                stop.wait(_LISTEN_RETRY)

    def recover_stale(self, *, stale_after: float, max_attempts: int) -> list[tuple[str, str]]:
        """Requeue or fail running jobs whose heartbeat is older than ``stale_after`` seconds.
        Returns ``(job_id, new_status)`` for each job recovered by this call."""
        cutoff = self._now() - stale_after
        with self._read() as conn:
            stale = conn.execute(
                sa.select(jobs_table.c.id, jobs_table.c.attempts, jobs_table.c.heartbeat_at).where(
                    jobs_table.c.status == "running", jobs_table.c.heartbeat_at < cutoff
                )
            ).all()
        recovered = []
        for job_id, attempts, heartbeat_at in stale:
            if attempts < max_attempts:
                values: dict[str, Any] = {
                    "status": "queued",
                    "worker_id": None,
                    "started_at": None,
                    "heartbeat_at": None,
                    "progress": 0.0,
                    "phase": None,
                }
            else:
                values = {
                    "status": "failed",
                    "finished_at": self._now(),
                    "error": f"its worker stopped responding {attempts} times; not retried",
                }
            with self._write() as conn:
                # Same heartbeat as read: a worker that woke up meanwhile keeps its job.
                won = conn.execute(
                    jobs_table.update()
                    .where(
                        jobs_table.c.id == job_id,
                        jobs_table.c.status == "running",
                        jobs_table.c.heartbeat_at == heartbeat_at,
                    )
                    .values(**values)
                ).rowcount
                if won and values["status"] == "queued":
                    self._announce(conn, job_id)
            if won:
                log.warning("job %s: worker lost, job %s", job_id, values["status"])
                recovered.append((job_id, values["status"]))
        return recovered

    # --- helpers -----------------------------------------------------------------------------
    def _now(self) -> sa.ColumnElement[float]:
        """The time to record or compare against, as an SQL expression: the database's
        clock, or the injected one's reading as a bound value."""
        if self.clock is None:
            return db_now()
        return sa.literal(self.clock(), sa.Double())

    def _announce(self, conn: Connection, job_id: str) -> None:
        """Tell listening workers that ``job_id`` is queued (sent when the transaction
        commits, never for one that rolls back)."""
        if self.is_postgres:
            conn.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, job_id)))

    def _owned(self, job_id: str, worker_id: str) -> sa.Update:
        return jobs_table.update().where(
            jobs_table.c.id == job_id,
            jobs_table.c.worker_id == worker_id,
            jobs_table.c.status == "running",
        )

    @staticmethod
    def _queued_count(conn: Connection) -> int:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(jobs_table.c.status == "queued")
            ).scalar_one()
        )

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        self._check_file()
        engine = self.engine
        if self._disk_full():
            # Each operation's connection is the only one (no pool): it makes SQLite's WAL
            # files anew, which a full disk refuses ("disk I/O error"), so a plain read
            # answered 507. The last connection closed checkpointed the WAL into the file:
            # read it as it is, making nothing (a write from another process not yet
            # checkpointed is missed until space returns).
            engine = self._immutable_engine()
        with self._translate(), engine.connect() as conn:
            yield conn

    def _immutable_engine(self) -> Engine:
        assert self.sqlite_path is not None
        if self._immutable is None:
            self._immutable = immutable_engine(self.sqlite_path)
        return self._immutable

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        self._check_file()
        with (
            self._translate(),
            self.engine.connect() as conn,
        ):
            conn.execution_options(mbn_immediate=True)
            with conn.begin():
                yield conn

    def _disk_full(self) -> bool:
        return disk_full(self.sqlite_path)

    def _check_file(self) -> None:
        """Unavailable when the SQLite file is not the one the store was opened on.

        Deleted: logged loudly (once), pooled connections dropped (they would write into
        the unlinked file), and every operation refused until a file is back. Back (e.g.
        restored from a backup): reconnected, the schema made if missing."""
        if self.sqlite_path is None or self._identity is None:
            return
        identity = file_identity(self.sqlite_path)
        if identity == self._identity:
            return
        self.engine.dispose()
        if identity is None:
            if not self._file_lost:
                self._file_lost = True
                log.critical(
                    "the SQLite job store %s was DELETED while running: every job in it is "
                    "lost; refusing job operations until the file is restored",
                    self.sqlite_path,
                )
            raise Unavailable(
                "the job store's file was deleted; jobs cannot be recorded (see the server log)",
                retry_after=self.retry_after,
            )
        log.critical(
            "the SQLite job store %s was replaced while running; using the new file",
            self.sqlite_path,
        )
        self._identity = None  # create_schema adopts the new file (or raises Unavailable)
        self.create_schema()

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except sa.exc.OperationalError as exc:
            reason = str(exc.orig or exc)
            # SQLITE_FULL, PostgreSQL's "No space left", or SQLite failing to make its
            # journal files on a full disk ("disk I/O error", "unable to open").
            if "full" in reason.lower() or self._disk_full():
                log.error("job store: disk full: %s", reason)
                raise InsufficientStorage(
                    "the job store's disk is full; free space and retry"
                ) from exc
            # Connection refused, database locked too long...: the client may retry.
            log.warning("job store unavailable: %s", reason)
            raise Unavailable(
                "the job store is unavailable; retry later", retry_after=self.retry_after
            ) from exc
