"""Durable server state in SQLite (WAL): clients, rounds, submissions, results.

An ack is sent only after the submission's transaction has committed with
``synchronous=FULL``. Writes go through one writer thread that commits whatever is queued
in a single transaction (group commit), so many concurrent submissions share one fsync.
Reads for recovery happen once at start-up, before serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rpsagg.server")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clients (
    client_id TEXT PRIMARY KEY, idx INTEGER NOT NULL UNIQUE, joined_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round_id INTEGER PRIMARY KEY, nonce TEXT NOT NULL, state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '', task_step INTEGER NOT NULL, transform TEXT NOT NULL,
    r_prior REAL, global_state BLOB NOT NULL, global_shape TEXT NOT NULL,
    opened_at REAL NOT NULL, info TEXT NOT NULL DEFAULT '{}',
    estimate BLOB, next_state BLOB);
CREATE TABLE IF NOT EXISTS submissions (
    round_id INTEGER NOT NULL, client_id TEXT NOT NULL, client_seed TEXT NOT NULL,
    digest BLOB NOT NULL, payload BLOB NOT NULL, received_at REAL NOT NULL,
    PRIMARY KEY (round_id, client_id));
"""


@dataclass(frozen=True)
class StoredRound:
    """A round row as stored (``info`` holds timestamps, metrics and eval errors)."""

    round_id: int
    nonce: int
    state: str
    reason: str
    task_step: int
    transform: str
    r_prior: float | None
    global_state: bytes
    global_shape: tuple[int, ...]
    opened_at: float
    info: dict[str, Any]
    estimate: bytes | None
    next_state: bytes | None


@dataclass(frozen=True)
class StoredSubmission:
    """A committed submission: the canonical request bytes and when they arrived."""

    round_id: int
    client_id: str
    client_seed: int
    digest: bytes
    payload: bytes
    received_at: float


_Op = tuple[str, tuple[Any, ...]]
_STOP = object()


class Store:
    """SQLite persistence with an asynchronous group-commit writer.

    Parameters
    ----------
    path : str
        Database file, or ``":memory:"`` (nothing survives the process).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._writer, name="rpsagg-store", daemon=True)
        self._thread.start()

    # -- writes ----------------------------------------------------------------------------
    def _writer(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._queue.put(_STOP)
                    break
                batch.append(nxt)
            error: BaseException | None = None
            with self._lock:
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                    for ops, _, _ in batch:
                        for sql, args in ops:
                            self._conn.execute(sql, args)
                    self._conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    error = exc
                    self._conn.execute("ROLLBACK")
            if error is not None and len(batch) > 1:
                for one in batch:  # isolate the failing write; commit the others
                    self._queue.put(one)
                continue
            for _, loop, fut in batch:
                loop.call_soon_threadsafe(_resolve, fut, error)

    async def write(self, ops: list[_Op]) -> None:
        """Commit ``ops`` (SQL, args) atomically; returns once durable."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put((ops, loop, fut))
        await fut

    def write_sync(self, ops: list[_Op]) -> None:
        """Commit ``ops`` from a thread that is not the event loop (start-up, tests)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in ops:
                    self._conn.execute(sql, args)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Stop the writer after the queued writes and close the database."""
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
        with self._lock:
            self._conn.close()

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

    def rounds(self) -> list[StoredRound]:
        """Every round, oldest first."""
        rows = self._rows(
            "SELECT round_id, nonce, state, reason, task_step, transform, r_prior, global_state,"
            " global_shape, opened_at, info, estimate, next_state FROM rounds ORDER BY round_id"
        )
        return [
            StoredRound(int(r[0]), int(r[1]), r[2], r[3], int(r[4]), r[5], r[6], bytes(r[7]),
                        tuple(json.loads(r[8])), float(r[9]), json.loads(r[10]),
                        None if r[11] is None else bytes(r[11]),
                        None if r[12] is None else bytes(r[12]))
            for r in rows
        ]

    def submissions(self, round_id: int) -> list[StoredSubmission]:
        """A round's committed submissions in arrival order."""
        rows = self._rows(
            "SELECT round_id, client_id, client_seed, digest, payload, received_at FROM "
            "submissions WHERE round_id = ? ORDER BY received_at, rowid", (round_id,)
        )
        return [StoredSubmission(int(r[0]), r[1], int(r[2]), bytes(r[3]), bytes(r[4]),
                                 float(r[5])) for r in rows]


def _resolve(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


# -- SQL builders used by the engine ---------------------------------------------------------
def op_meta(key: str, value: str) -> _Op:
    """Upsert a meta value."""
    return ("INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))


def op_client(client_id: str, index: int, joined_at: float) -> _Op:
    """Insert a client."""
    return ("INSERT INTO clients(client_id, idx, joined_at) VALUES (?, ?, ?)",
            (client_id, index, joined_at))


def op_round(r: StoredRound) -> _Op:
    """Insert or replace a whole round row."""
    return (
        "INSERT OR REPLACE INTO rounds(round_id, nonce, state, reason, task_step, transform, "
        "r_prior, global_state, global_shape, opened_at, info, estimate, next_state) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (r.round_id, str(r.nonce), r.state, r.reason, r.task_step, r.transform, r.r_prior,
         r.global_state, json.dumps(list(r.global_shape)), r.opened_at, json.dumps(r.info),
         r.estimate, r.next_state),
    )


def op_submission(s: StoredSubmission) -> _Op:
    """Insert a submission (the primary key rejects a second one per client and round)."""
    return (
        "INSERT INTO submissions(round_id, client_id, client_seed, digest, payload, received_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (s.round_id, s.client_id, str(s.client_seed), s.digest, s.payload, s.received_at),
    )


OpBuilder = Callable[..., _Op]
