"""The job catalog of a standing service: which jobs were created over the API, with what
settings, and where each one stands.

One SQLite file, ``<db>.d/catalog.db`` beside the default job's ``--db`` (in memory when
``--db :memory:``), one row per created job; each job's rounds live in its own database,
``<db>.d/<id>.db`` (the default job keeps ``--db``). Every change is one transaction with
``synchronous=FULL``, committed before the HTTP answer: a ``201`` means the job survives a
crash, a ``200`` to a cancel means it stays cancelled.

The crash story, per state (what a restart does with each row):

- ``queued``: started when a slot is free (``--max-jobs``), as if just created;
- ``running``: resumed from its database (a job that crashed before its first round was
  written starts fresh: nothing of it was acknowledged);
- ``done`` / ``failed``: served again read-only (results stay queryable);
- ``cancelled``: served read-only; a job whose cancel was acknowledged but not yet written to
  its own database (a crash in between) is cancelled again at start.

The catalog row is written first and the job's database second, so the catalog is the
authority on a job's state.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
ENDED = ("done", "failed", "cancelled")
#: the states a job may still leave
OPEN_STATES = tuple(s for s in JOB_STATES if s not in ENDED)
#: the catalog's own file in ``<db>.d/``, beside the jobs' ``<id>.db``
CATALOG_FILE = "catalog.db"
#: job ids whose database would be one of the store's own files, compared without case (a
#: case-insensitive file system maps ``Catalog`` there too)
RESERVED_IDS = frozenset({Path(CATALOG_FILE).stem})


@dataclass(frozen=True)
class JobRecord:
    """A catalog row."""

    id: str
    seq: int
    settings: dict[str, Any]
    state: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    failure: str


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
                seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs") \
                    .fetchone()[0]
                self._conn.execute(
                    "INSERT INTO jobs (id, seq, settings, state, created_at) "
                    "VALUES (?, ?, ?, 'queued', ?)",
                    (job_id, seq, json.dumps(settings, sort_keys=True), now))
            except sqlite3.Error as exc:
                raise CatalogError(str(exc)) from exc
        return JobRecord(job_id, int(seq), dict(settings), "queued", now, None, None, "")

    def set_state(self, job_id: str, state: str, failure: str = "",
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
        if state == "running":
            sql = "UPDATE jobs SET state = ?, started_at = COALESCE(started_at, ?) "
            args: tuple[Any, ...] = (state, now)
        elif state in ENDED:
            sql = "UPDATE jobs SET state = ?, finished_at = COALESCE(finished_at, ?), failure = ? "
            args = (state, now, failure)
        else:
            sql, args = "UPDATE jobs SET state = ? ", (state,)
        return self._write(sql + where, (*args, job_id, *only_from)) == 1

    def get(self, job_id: str) -> JobRecord | None:
        """One job, or None."""
        rows = self._select("WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def all(self) -> list[JobRecord]:
        """Every job, oldest first."""
        return self._select("", ())

    def _select(self, where: str, args: tuple[Any, ...]) -> list[JobRecord]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, seq, settings, state, created_at, started_at, finished_at, "
                f"failure FROM jobs {where} ORDER BY seq", args).fetchall()
        return [JobRecord(r[0], int(r[1]), json.loads(r[2]), r[3], r[4], r[5], r[6], r[7])
                for r in rows]

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()
