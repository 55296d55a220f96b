"""The job catalog of a server: every job it knows, one row and one string id each, with its
settings and where it stands.

One SQLite file, ``<db>.d/catalog.db`` beside the default job's ``--db`` (in memory when
``--db :memory:``). A row's ``kind`` says what the job is:

- ``default``: the job of the server's flags (id ``default``, rounds in ``--db``); its row
  is written at every start from its database, which stays its authority;
- ``created``: a job created over the API (``POST /api/jobs``), rounds in ``<db>.d/<id>.db``;
- ``past``: a finished default job an earlier start moved to ``<db>.jobs/``
  (``--on-finished-job new``; :mod:`~rpsagg_server.jobs.pastjobs`), id its file's stem,
  with what the dashboard shows of it (``summary``). Its rows are added at every start for
  the files of that folder the catalog lacks, so a move interrupted anywhere is listed at
  the next start.

Every change is one transaction with ``synchronous=FULL``, committed before the HTTP answer:
a ``201`` means the job survives a crash, a ``200`` to a cancel means it stays cancelled.

The crash story, per state (what a restart does with each row):

- ``queued``: started when a slot is free (``--max-jobs``), as if just created;
- ``running``: resumed from its database (a job that crashed before its first round was
  written starts fresh: nothing of it was acknowledged);
- ``done`` / ``failed`` / ``cancelled``: nothing is opened; the row's ``summary`` (written
  when the job closed, after its end was durable in its database) describes it, and its
  database is opened read-only when its rounds are asked for
  (:mod:`~rpsagg_server.jobs.endedjobs`). An ended job whose row has no summary yet (a
  crash between its end and its close; a cancel acknowledged but not yet written to its own
  database) is opened at start, cancelled again if it was, and closed.

The catalog row is written first and the job's database second, so the catalog is the
authority on a created job's state.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpsagg_server.domain.errors import InvalidRequest
from rpsagg_server.domain.jobstate import ENDED, JobState
from rpsagg_server.jobs.pastjobs import past_jobs
from rpsagg_server.settings.jobspec import JOB_KEYS

log = logging.getLogger("rpsagg.server")

#: every job state, in order
JOB_STATES = tuple(JobState)
#: the catalog's own file in ``<db>.d/``, beside the jobs' ``<id>.db``
CATALOG_FILE = "catalog.db"
#: job ids whose database would be one of the store's own files, compared without case (a
#: case-insensitive file system maps ``Catalog`` there too)
RESERVED_IDS = frozenset({Path(CATALOG_FILE).stem})
#: what a row is (module docstring)
KINDS = ("default", "created", "past")
#: the id of the job the server's flags start
DEFAULT_JOB = "default"
_COLUMNS = "id, seq, settings, state, created_at, started_at, finished_at, failure, kind, summary"


#: how a job's id is spelled (created jobs get ``j`` and 8 hex digits)
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: the kinds of job a server runs (a past job is only listed)
_CURRENT = ("default", "created")


def check_job_id(job_id: object) -> None:
    """Refuse an id that is not :data:`JOB_ID`'s shape, or one of :data:`RESERVED_IDS`
    (:class:`~rpsagg_server.domain.errors.InvalidRequest`)."""
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise InvalidRequest("id must be 1..64 characters of [A-Za-z0-9._-], starting with a "
                         f"letter or digit; got {job_id!r}")
    if job_id.lower() in RESERVED_IDS:
        raise InvalidRequest(f"id {job_id!r} is reserved (the store's own files use it)")


def new_job_id(taken: Container[str]) -> str:
    """A created job's id when it names none: ``j`` and 8 random hex digits, not in
    ``taken``."""
    while True:
        job_id = "j" + secrets.token_hex(4)
        if job_id not in taken:
            return job_id


@dataclass(frozen=True)
class JobRecord:
    """A catalog row."""

    id: str
    seq: int
    settings: dict[str, Any]
    state: JobState
    created_at: float
    started_at: float | None
    finished_at: float | None
    failure: str
    kind: str = "created"
    #: what an ended job's rounds came to (:func:`~.jobviews.summary`, written as it
    #: closes); a past job's file, rounds (done of all) and clients
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def job_settings(self) -> dict[str, Any]:
        """Its job settings as recorded (the row's own keys, such as ``_memory``, left out)."""
        return {k: v for k, v in self.settings.items() if k in JOB_KEYS}


class CatalogError(Exception):
    """A catalog write failed (the change did not happen)."""


def catalog_dir(db: str) -> Path | None:
    """The folder of the created jobs of a server whose default job is ``db``: ``<db>.d``
    (None for an in-memory server)."""
    if db in ("", ":memory:") or db.startswith("file:"):
        return None
    p = Path(db)
    return p.with_name(p.name + ".d")


class Catalog:
    """The created jobs (thread-safe; every write commits before it returns).

    Parameters
    ----------
    db : str
        The default job's ``--db``; the catalog is ``<db>.d/catalog.db``.
    """

    def __init__(self, db: str) -> None:
        self.folder = catalog_dir(db)
        if self.folder is None:
            path = ":memory:"
        else:
            self.folder.mkdir(exist_ok=True)
            path = str(self.folder / CATALOG_FILE)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA busy_timeout = 5000")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, "
            "settings TEXT NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL, "
            "started_at REAL, finished_at REAL, failure TEXT NOT NULL DEFAULT '')")
        have = {r[1] for r in self._conn.execute("PRAGMA table_info(jobs)")}
        for column in ("kind TEXT NOT NULL DEFAULT 'created'",
                       "summary TEXT NOT NULL DEFAULT '{}'"):  # a catalog from before kinds
            if column.split()[0] not in have:
                self._conn.execute(f"ALTER TABLE jobs ADD COLUMN {column}")

    def job_db(self, job_id: str) -> str:
        """The database path of a created job (``:memory:`` for an in-memory server)."""
        assert job_id.lower() not in RESERVED_IDS, job_id
        return ":memory:" if self.folder is None else str(self.folder / f"{job_id}.db")

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        with self._lock:
            try:
                cur = self._conn.execute(sql, args)
            except sqlite3.Error as exc:
                raise CatalogError(str(exc)) from exc
            return cur.rowcount

    def add(self, job_id: str, settings: dict[str, Any]) -> JobRecord:
        """Record a new queued job (durable when this returns)."""
        now = time.time()
        with self._lock:
            try:
                seq = self._conn.execute("SELECT MAX(0, COALESCE(MAX(seq), 0)) + 1 FROM jobs") \
                    .fetchone()[0]
                self._conn.execute(
                    "INSERT INTO jobs (id, seq, settings, state, created_at) "
                    "VALUES (?, ?, ?, 'queued', ?)",
                    (job_id, seq, json.dumps(settings, sort_keys=True), now))
            except sqlite3.Error as exc:
                raise CatalogError(str(exc)) from exc
        return JobRecord(job_id, int(seq), dict(settings), JobState.QUEUED, now, None, None, "")

    def put_default(self, state: JobState, settings: dict[str, Any], failure: str,
                    started_at: float | None, finished_at: float | None) -> JobRecord:
        """Write the default job's row as its database says it stands (at every start)."""
        assert state in JOB_STATES
        now = time.time()
        with self._lock:
            try:
                old = self._conn.execute("SELECT created_at FROM jobs WHERE id = ?",
                                         (DEFAULT_JOB,)).fetchone()
                created = now if old is None else float(old[0])
                self._conn.execute(
                    "INSERT OR REPLACE INTO jobs (id, seq, settings, state, created_at, "
                    "started_at, finished_at, failure, kind) "
                    "VALUES (?, 0, ?, ?, ?, ?, ?, ?, 'default')",
                    (DEFAULT_JOB, json.dumps(settings, sort_keys=True), state, created,
                     started_at, finished_at, failure))
            except sqlite3.Error as exc:
                raise CatalogError(str(exc)) from exc
        return JobRecord(DEFAULT_JOB, 0, dict(settings), state, created, started_at,
                         finished_at, failure, "default")

    def drop_default(self) -> None:
        """Remove the default job's row (a start with ``--no-default-job``)."""
        self._write("DELETE FROM jobs WHERE id = ? AND kind = 'default'", (DEFAULT_JOB,))

    def add_past(self, job_id: str, state: JobState, settings: dict[str, Any], failure: str,
                 started_at: float | None, finished_at: float | None,
                 summary: dict[str, Any]) -> bool:
        """Record a past job, unless its id is taken; returns whether it was added."""
        assert state in ENDED
        args = (job_id, json.dumps(settings, sort_keys=True), state, started_at or 0.0,
                started_at, finished_at, failure, json.dumps(summary, sort_keys=True))
        return self._write(
            "INSERT OR IGNORE INTO jobs (id, seq, settings, state, created_at, started_at, "
            "finished_at, failure, kind, summary) "
            "VALUES (?, -1, ?, ?, ?, ?, ?, ?, 'past', ?)", args) == 1

    def add_past_jobs(self, db: str) -> list[str]:
        """Add the jobs moved to ``<db>.jobs/`` that the catalog lacks (every start: a move
        interrupted anywhere is listed at the next); returns their ids."""
        known = {r.id for r in self.all()}
        added = []
        for job in past_jobs(db, known):
            past_id = job.file.removesuffix(".db")
            summary = {"file": job.file, "rounds": job.rounds, "rounds_done": job.rounds_done,
                       "clients": job.clients}
            if self.add_past(past_id, job.state, job.config, job.failure, job.started_at,
                             job.last_round_at, summary):
                added.append(past_id)
            else:
                log.warning("[Jobs] past job %s: its id is taken; not listed", past_id)
        return added

    def set_state(self, job_id: str, state: JobState, failure: str = "",
                  only_from: tuple[str, ...] = JOB_STATES) -> bool:
        """Move a job to ``state`` (``running`` stamps ``started_at``, an end state
        ``finished_at``) if it is in one of ``only_from``; durable when this returns.

        Returns
        -------
        bool
            Whether it moved (False: it was in another state, which stays).
        """
        assert state in JOB_STATES
        now = time.time()
        where = f"WHERE id = ? AND state IN ({', '.join('?' * len(only_from))})"
        if state == JobState.RUNNING:
            sql = "UPDATE jobs SET state = ?, started_at = COALESCE(started_at, ?) "
            args: tuple[Any, ...] = (state, now)
        elif state in ENDED:
            sql = "UPDATE jobs SET state = ?, finished_at = COALESCE(finished_at, ?), failure = ? "
            args = (state, now, failure)
        else:
            sql, args = "UPDATE jobs SET state = ? ", (state,)
        return self._write(sql + where, (*args, job_id, *only_from)) == 1

    def set_summary(self, job_id: str, summary: dict[str, Any]) -> None:
        """Record what an ended job's rounds came to (it is closed next); durable when this
        returns."""
        self._write("UPDATE jobs SET summary = ? WHERE id = ?",
                    (json.dumps(summary, sort_keys=True), job_id))

    def delete(self, job_id: str) -> None:
        """Drop a job's row (its data removed); durable when this returns."""
        self._write("DELETE FROM jobs WHERE id = ?", (job_id,))

    def get(self, job_id: str) -> JobRecord | None:
        """One job, or None."""
        rows = self._select("WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def all(self) -> list[JobRecord]:
        """Every job: the past ones, the default job, then the created ones oldest first."""
        return self._select("", ())

    def _select(self, where: str, args: tuple[Any, ...]) -> list[JobRecord]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY seq, created_at", args).fetchall()
        return [JobRecord(r[0], int(r[1]), json.loads(r[2]), JobState(r[3]), r[4], r[5], r[6], r[7],
                          r[8], json.loads(r[9])) for r in rows]

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()
