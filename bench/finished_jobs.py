"""Many finished jobs without running each: copies of one real finished job (its catalog row
and its database, copied), for the restart benchmark and the restart test.

A copy is what a server that ran the job that many times would hold: a row of the catalog
(``<db>.d/catalog.db``) per copy, its id the original's with ``-NNNNN``, in the original's
state with its summary, each ended a millisecond after the one before, and the database
file ``<db>.d/<id>.db`` (a copy of the original's: the same bytes; not a hard link, as
SQLite tells files apart by inode). Run it on a stopped server's files.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

#: the catalog's columns a copy takes from the original (its id, seq and times are its own)
_COPIED = "settings, state, failure, kind, summary"


def clone_finished_job(folder: Path, job_id: str, count: int) -> list[str]:
    """Add ``count`` copies of finished job ``job_id`` to the catalog in ``folder``
    (``<db>.d``), in one transaction; returns their ids, the first ended first."""
    src = folder / f"{job_id}.db"
    for suffix in ("-wal", "-shm"):  # a cleanly stopped server left none
        if Path(str(src) + suffix).exists():
            raise SystemExit(f"{src}{suffix} exists: stop the server cleanly first")
    ids = [f"{job_id}-{i:05d}" for i in range(count)]
    conn = sqlite3.connect(folder / "catalog.db", isolation_level=None)
    try:
        row = conn.execute("SELECT seq, created_at, started_at, finished_at, state FROM jobs "
                           "WHERE id = ?", (job_id,)).fetchone()
        if row is None or row[4] not in ("done", "failed", "cancelled"):
            raise SystemExit(f"job {job_id} is not a finished job of {folder}: {row}")
        top = conn.execute("SELECT MAX(seq) FROM jobs").fetchone()[0]
        conn.execute("BEGIN IMMEDIATE")
        for i, new in enumerate(ids):
            shift = (i + 1) * 1e-3
            conn.execute(
                f"INSERT INTO jobs (id, seq, created_at, started_at, finished_at, {_COPIED}) "
                f"SELECT ?, ?, created_at + ?, started_at + ?, finished_at + ?, {_COPIED} "
                "FROM jobs WHERE id = ?", (new, top + i + 1, shift, shift, shift, job_id))
        conn.execute("COMMIT")
    finally:
        conn.close()
    for new in ids:
        shutil.copyfile(src, folder / f"{new}.db")
    return ids
