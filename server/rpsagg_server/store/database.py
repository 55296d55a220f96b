"""Durable server state in SQLite (WAL): clients, rounds, submissions, results.

Opening a database creates its tables, or brings a database of an older schema version to
the current one (:mod:`rpsagg_server.store.migrations`; a newer version is refused).

An ack is sent only after the submission's transaction has committed with
``synchronous=FULL``. Writes go through one writer thread that commits whatever is queued
in a single transaction (group commit, :mod:`rpsagg_server.store.writer`), so many
concurrent submissions share one fsync. A transaction that fails (a lock held past the busy
timeout, a full disk, an I/O error) is rolled back and reported to each waiting caller as
:class:`~rpsagg_server.store.writer.WriteError`; the writer keeps serving, and an idle
heartbeat transaction keeps :meth:`Store.writable` (readiness) current.
Reads for recovery happen once at start-up, before serving, and read the rounds without
their arrays; a finished round's arrays are read back one round at a time, on demand
(:meth:`Store.round`, through a second connection: :mod:`~rpsagg_server.rounds.archive`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpsagg_server.store.migrations import CURRENT_VERSION, open_schema
from rpsagg_server.store.rowinfo import RowInfo
from rpsagg_server.store.rows import StoredRound, StoredSubmission
from rpsagg_server.store.writer import GroupCommitWriter, Op, WriteError
from rpsagg_wire.v1.messages import RoundState

__all__ = ["ReadError", "Store", "StoredRound", "StoredSubmission"]
log = logging.getLogger("rpsagg.server")


class ReadError(Exception):
    """A read of the database failed (or found no row); ``reason`` says why in words for
    the caller. Nothing was changed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Store:
    """SQLite persistence with an asynchronous group-commit writer.

    Every write is a transaction that either commits (its future resolves) or is rolled back
    (its future raises :class:`WriteError`); the writer thread survives any failed
    transaction and keeps serving. :meth:`writable` says whether the last transaction (a
    write or the writer's idle heartbeat) committed: readiness.

    Parameters
    ----------
    path : str
        Database file, or ``":memory:"`` (nothing survives the process).
    busy_timeout : float
        Seconds a transaction waits for a lock held by another connection before it fails.
    heartbeat : float
        Seconds of writer idleness after which a probe transaction checks that a write can
        still commit (so readiness notices a lock or a full disk without client traffic,
        and notices recovery).
    writing : bool
        False: a store to read an ended job from, with one connection and no writer thread
        (a write is refused with :class:`WriteError`, as after :meth:`stop_writing`; an
        older schema is still migrated on open).
    """

    def __init__(self, path: str, busy_timeout: float = 5.0, heartbeat: float = 2.0,
                 writing: bool = True) -> None:
        self.path = path
        # a reader's file must exist: opened read-write (a migration writes), never made
        target, uri = ((Path(path).absolute().as_uri() + "?mode=rw", True)
                       if not writing and path not in ("", ":memory:") else (path, False))
        self._conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None,
                                     timeout=busy_timeout, uri=uri)
        try:
            # the tables of a new database, or an older one migrated: one transaction, after
            # the journal's mode; a newer version is refused before any write
            if open_schema(self._conn, pragmas="PRAGMA journal_mode=WAL;"
                                               "PRAGMA synchronous=FULL;"):
                log.info("[Store] %s: migrated to schema version %d", path, CURRENT_VERSION)
        except BaseException:
            self._conn.close()
            raise
        self._lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        if writing and path not in ("", ":memory:"):
            self._reader = sqlite3.connect(path, check_same_thread=False,
                                           isolation_level=None, timeout=busy_timeout)
        self._ended = not writing  # its writes stopped for good, the store open
        self._writer = GroupCommitWriter(self._conn, self._lock, heartbeat,
                                         lambda: _op_meta("heartbeat", repr(time.time())),
                                         start=writing)

    # -- writes ----------------------------------------------------------------------------
    def set_busy_timeout(self, seconds: float) -> None:
        """Change how long a write waits for another connection's lock (tests, operators)."""
        with self._lock:
            self._conn.execute(f"PRAGMA busy_timeout={int(seconds * 1000)}")

    def set_max_pages(self, pages: int) -> int:
        """Cap the database at ``pages`` pages (SQLite's ``max_page_count``; a write that
        needs more fails with SQLITE_FULL, as on a full disk). Returns the cap in force.
        """
        with self._lock:
            return int(self._conn.execute(f"PRAGMA max_page_count={int(pages)}").fetchone()[0])

    def page_count(self) -> int:
        """Pages the database file uses now."""
        with self._lock:
            return int(self._conn.execute("PRAGMA page_count").fetchone()[0])

    def writable(self) -> bool:
        """Whether the writer is alive and its last transaction committed, or its writes
        were stopped cleanly and the store is open (readiness: an ended job's store)."""
        return self._writer.writable() or (self._ended and self._writer.stopped_cleanly())

    def _write_sync(self, ops: list[Op]) -> None:
        """Commit ``ops`` from a thread that is not the event loop (start-up)."""
        self._writer.write_sync(ops)

    # -- what the engine writes (queued: group-committed by the writer thread) ------------
    def add_client(self, client_id: str, index: int, joined_at: float) -> asyncio.Future[None]:
        """Queue a client's join; the future resolves once it is durable (or raises
        :class:`WriteError`). A second row for the id or the index is refused."""
        return self._writer.enqueue([_op_client(client_id, index, joined_at)])

    def commit_submissions(self, subs: Sequence[StoredSubmission],
                           ) -> asyncio.Future[list[WriteError | None]]:
        """Queue several submissions, each its own write (group-committed with whatever else
        is queued); the future resolves with one outcome per submission, in order: None once
        it is durable, or the :class:`WriteError` that kept it out (the primary key refuses
        a second one per client and round). It never raises."""
        return self._writer.enqueue_many([[_op_submission(s)] for s in subs])

    async def open_round(self, r: StoredRound) -> None:
        """Commit a new round's row (the first round of a process; later rounds open in
        :meth:`finish_round`'s transaction)."""
        await self._writer.enqueue([_op_round(r)])

    async def save_round(self, r: StoredRound) -> None:
        """Commit a round's row as it is now (its deadline started; its set was closed)."""
        await self._writer.enqueue([_op_round(r)])

    async def finish_round(self, r: StoredRound, *, next_round: StoredRound | None,
                           tracker: bool = False,
                           tracker_fraction: Sequence[float | None] | None = None,
                           job_done: bool = False, job_failure: str = "") -> None:
        """Commit a finished (done or failed) round in one transaction with what follows
        from it: the correlation tracker's state (``tracker``: the job tracks it;
        ``tracker_fraction``: the smoothed fraction of every vector slot), the job's end (and
        why it failed), or the next round's row.
        """
        ops = [_op_round(r)]
        if tracker:
            fractions = None if tracker_fraction is None else list(tracker_fraction)
            ops.append(_op_meta("tracker_fraction", json.dumps(fractions)))
        if job_done:
            ops.append(_op_meta("job_done", "1"))
        if job_failure:
            ops.append(_op_meta("job_failure", job_failure))
        if next_round is not None:
            ops.append(_op_round(next_round))
        await self._writer.enqueue(ops)

    def put_meta(self, key: str, value: str) -> None:
        """Upsert a meta value now, from a thread that is not the event loop (start-up: the
        job's settings and encoding; tests)."""
        self._write_sync([_op_meta(key, value)])

    def stop_writing(self) -> None:
        """Stop the writer after the queued writes and close the write connection: an
        ended job's store, read through the second connection from then on (a write is
        refused with :class:`WriteError`; an in-memory store keeps its one connection)."""
        self._writer.stop()
        self._ended = True
        if self._reader is not None:
            with self._lock:
                self._conn.close()
            self._conn, self._lock = self._reader, self._read_lock

    def close(self) -> None:
        """Stop the writer after the queued writes and close the database."""
        self._ended = False  # closed: not writable, whatever ended before
        self._writer.stop()
        with self._lock:
            self._conn.close()
        if self._reader is not None:
            with self._read_lock:
                self._reader.close()

    def committed(self, round_id: int, client_id: str) -> tuple[bytes | None, int]:
        """``(digest or None, submissions in the round)`` of a committed submission; reads
        through a second connection (WAL readers never wait for the writer), so it may be
        called from a worker thread while writes are queued.
        """
        sql = ("SELECT (SELECT digest FROM submissions WHERE round_id = ? AND client_id = ?),"
               " (SELECT COUNT(*) FROM submissions WHERE round_id = ?)")
        args = (round_id, client_id, round_id)
        if self._reader is None:
            row = self._rows(sql, args)[0]
        else:
            with self._read_lock:
                row = self._reader.execute(sql, args).fetchone()
        return (None if row[0] is None else bytes(row[0])), int(row[1])

    # -- reads (start-up) ------------------------------------------------------------------
    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._conn.execute(sql, args).fetchall())

    def get_meta(self, key: str) -> str | None:
        """A meta value, or None."""
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def clients(self) -> list[tuple[str, int, float]]:
        """``(client_id, index, joined_at)`` ordered by index."""
        return [(r[0], int(r[1]), float(r[2]))
                for r in self._rows("SELECT client_id, idx, joined_at FROM clients ORDER BY idx")]

    def rounds(self, arrays: bool = True) -> list[StoredRound]:
        """Every round, oldest first.

        ``arrays`` False: without the rows' arrays (global state, estimate, next state:
        what makes a round at large d large); such a row has ``arrays`` False, empty
        ``global_state``, ``next_state`` None and ``estimate`` ``b""`` where the row has
        one (else None). Recovery reads the rounds so; :meth:`round` reads one whole.
        """
        blobs = ("global_state, estimate, next_state" if arrays
                 else "x'', CASE WHEN estimate IS NULL THEN NULL ELSE x'' END, NULL")
        rows = self._rows(
            "SELECT round_id, nonce, state, reason, task_step, transform, r_prior, "
            f"global_shape, opened_at, info, {blobs} FROM rounds ORDER BY round_id"
        )
        return [_stored_round(r, arrays) for r in rows]

    def round(self, round_id: int) -> StoredRound:
        """One round's whole row (with its arrays). Reads through the second connection
        (WAL readers never wait for the writer), so any thread may call it, while writes
        are queued; raises :class:`ReadError` when the read fails or finds no row."""
        sql = ("SELECT round_id, nonce, state, reason, task_step, transform, r_prior, "
               "global_shape, opened_at, info, global_state, estimate, next_state "
               "FROM rounds WHERE round_id = ?")
        try:
            if self._reader is None:
                rows = self._rows(sql, (round_id,))
            else:
                with self._read_lock:
                    rows = self._reader.execute(sql, (round_id,)).fetchall()
        except sqlite3.Error as exc:
            raise ReadError(describe_read(exc)) from None
        if not rows:
            raise ReadError(f"round {round_id} is not in the database")
        return _stored_round(rows[0], True)

    def submissions(self, round_id: int) -> list[StoredSubmission]:
        """A round's committed submissions in arrival order."""
        rows = self._rows(
            "SELECT round_id, client_id, client_seed, digest, payload, received_at FROM "
            "submissions WHERE round_id = ? ORDER BY received_at, rowid", (round_id,)
        )
        return [StoredSubmission(round_id=int(r[0]), client_id=r[1], client_seed=int(r[2]),
                                 digest=bytes(r[3]), payload=bytes(r[4]),
                                 received_at=float(r[5])) for r in rows]


def describe_read(exc: BaseException) -> str:
    """The reason a read failed, for logs and for clients (the message of the refusal)."""
    name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
    return f"database read failed ({name}: {exc})"


def _stored_round(r: Sequence[Any], arrays: bool) -> StoredRound:
    """A :class:`StoredRound` from the columns :meth:`Store.rounds` and :meth:`Store.round`
    select (the three arrays last)."""
    return StoredRound(round_id=int(r[0]), nonce=int(r[1]), state=RoundState(r[2]), reason=r[3],
                       task_step=int(r[4]), transform=r[5], r_prior=r[6],
                       global_shape=tuple(json.loads(r[7])), opened_at=float(r[8]),
                       info=RowInfo.from_json(r[9]), global_state=bytes(r[10]),
                       estimate=None if r[11] is None else bytes(r[11]),
                       next_state=None if r[12] is None else bytes(r[12]), arrays=arrays)


# -- SQL of the writes ---------------------------------------------------------
def _op_meta(key: str, value: str) -> Op:
    """Upsert a meta value."""
    return ("INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))


def _op_client(client_id: str, index: int, joined_at: float) -> Op:
    """Insert a client."""
    return ("INSERT INTO clients(client_id, idx, joined_at) VALUES (?, ?, ?)",
            (client_id, index, joined_at))


def _op_round(r: StoredRound) -> Op:
    """Insert or replace a whole round row."""
    return (
        "INSERT OR REPLACE INTO rounds(round_id, nonce, state, reason, task_step, transform, "
        "r_prior, global_state, global_shape, opened_at, info, estimate, next_state) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (r.round_id, str(r.nonce), r.state, r.reason, r.task_step, r.transform, r.r_prior,
         r.global_state, json.dumps(list(r.global_shape)), r.opened_at, r.info.to_json(),
         r.estimate, r.next_state),
    )


def _op_submission(s: StoredSubmission) -> Op:
    """Insert a submission (the primary key rejects a second one per client and round)."""
    return (
        "INSERT INTO submissions(round_id, client_id, client_seed, digest, payload, received_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (s.round_id, s.client_id, str(s.client_seed), s.digest, s.payload, s.received_at),
    )

