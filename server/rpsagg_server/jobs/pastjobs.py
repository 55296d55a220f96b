"""Past jobs: a finished job's database moved aside so that the next job can start.

One database (``--db``) holds one job. With ``--on-finished-job new`` (what the compose file
sets), a server started on the database of a finished job (done or failed) first moves that
database into the folder ``<db>.jobs/`` beside it and then starts a new job on a new file;
an unfinished job is resumed as always. With ``keep`` (the default) the finished job is
served again (its results stay queryable; clients are told the job is done).

The move is crash-safe: the job is copied whole (``VACUUM INTO``, which includes what is
still in the write-ahead log) to a temporary file, the copy is synced, renamed to its final
name and the folder synced; only then are the database and its ``-wal`` and ``-shm`` files
removed. The final name is a function of the job (its first round's time and a digest of its
settings and rounds), so a start interrupted anywhere in between finds either the database
still in place (and moves it again, to the same name) or the copy complete.

:func:`past_jobs` reads the moved jobs back (read-only); each start adds those the catalog
lacks to it (:mod:`~rpsagg_server.jobs.catalog`, id the file's stem), and the jobs API lists
them from there (``/api/jobs``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Container
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rpsagg_server.domain.jobstate import JobState

log = logging.getLogger("rpsagg.server")

ON_FINISHED_JOB = ("keep", "new")


@dataclass(frozen=True)
class PastJob:
    """What the dashboard shows of a moved job."""

    file: str
    state: JobState  # done or failed
    failure: str
    config: dict[str, Any]
    rounds: int
    rounds_done: int
    started_at: float | None
    last_round_at: float | None
    clients: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def jobs_dir(db: str) -> Path:
    """The folder of the moved jobs of ``db``: ``<db>.jobs`` beside it."""
    p = Path(db)
    return p.with_name(p.name + ".jobs")


def _file_db(db: str) -> bool:
    return db not in ("", ":memory:") and not db.startswith("file:")


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def _summary(conn: sqlite3.Connection, file: str) -> PastJob | None:
    """The job of an open database, or None when it is not finished (or not a job yet)."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "meta" not in tables or "rounds" not in tables:
        return None
    done = _meta(conn, "job_done") == "1"
    failure = _meta(conn, "job_failure") or ""
    if not (done or failure):
        return None
    rounds, rounds_done, first, last = conn.execute(
        "SELECT COUNT(*), SUM(state = 'done'), MIN(opened_at), MAX(opened_at) FROM rounds"
    ).fetchone()
    clients = conn.execute("SELECT COUNT(*) FROM clients").fetchone()[0] \
        if "clients" in tables else 0
    return PastJob(file=file, state=JobState.FAILED if failure else JobState.DONE, failure=failure,
                   config=json.loads(_meta(conn, "config") or "{}"), rounds=int(rounds),
                   rounds_done=int(rounds_done or 0), started_at=first, last_round_at=last,
                   clients=int(clients))


def _archive_name(db: Path, conn: sqlite3.Connection, job: PastJob) -> str:
    digest = hashlib.sha256(json.dumps(job.config, sort_keys=True).encode())
    for row in conn.execute("SELECT round_id, nonce, state FROM rounds ORDER BY round_id"):
        digest.update(repr(tuple(row)).encode())
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(job.started_at or 0.0))
    return f"{db.stem}-{stamp}-{digest.hexdigest()[:10]}.db"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def archive_finished_job(db: str) -> Path | None:
    """Move the finished job in ``db`` to :func:`jobs_dir`; returns its new path.

    None (nothing moved) when ``db`` is in memory, does not exist, or holds no job or an
    unfinished one. ``OSError`` or ``sqlite3.Error`` when the copy cannot be made; the
    database is then left as it was.
    """
    if not _file_db(db) or not Path(db).is_file() or Path(db).stat().st_size == 0:
        return None
    path = Path(db)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        job = _summary(conn, path.name)
        if job is None:
            return None
        folder = jobs_dir(db)
        folder.mkdir(exist_ok=True)
        final = folder / _archive_name(path, conn, job)
        if not final.exists():  # else an interrupted start already copied it whole
            tmp = folder / (final.name + ".tmp")
            tmp.unlink(missing_ok=True)
            conn.execute("VACUUM INTO ?", (str(tmp),))
            with tmp.open("rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            _fsync_dir(folder)
    finally:
        conn.close()
    for suffix in ("-wal", "-shm", ""):  # the log first: never a log without its database
        with contextlib.suppress(FileNotFoundError):
            Path(str(path) + suffix).unlink()
    _fsync_dir(path.parent)
    log.info("[Jobs] the job in %s is %s: moved to %s; starting a new job", db, job.state,
             final)
    return final


def past_jobs(db: str, known: Container[str] = ()) -> list[PastJob]:
    """The moved jobs of ``db``, newest first (files that cannot be read are skipped, and
    those whose stem is in ``known``)."""
    if not _file_db(db):
        return []
    folder = jobs_dir(db)
    out: list[PastJob] = []
    for f in sorted(folder.glob("*.db")) if folder.is_dir() else []:
        if f.stem in known:
            continue
        try:
            conn = sqlite3.connect(f"{f.resolve().as_uri()}?mode=ro", uri=True)
            try:
                job = _summary(conn, f.name)
            finally:
                conn.close()
        except sqlite3.Error as exc:
            log.warning("[Jobs] cannot read %s: %s", f, exc)
            continue
        if job is not None:
            out.append(job)
    out.sort(key=lambda j: j.started_at or 0.0, reverse=True)
    return out
