"""The store's one writer: a thread that commits whatever is queued in a single transaction
(group commit), so many concurrent writes share one fsync.

A write is a list of operations (``(sql, args)``) that commits or fails as a unit. A
transaction that fails (a lock held past the busy timeout, a full disk, an I/O error) is
rolled back and reported to each waiting caller as :class:`WriteError`; where one write's
data is at fault, the others of its batch still commit. The writer survives any failed
transaction and keeps serving, and an idle heartbeat transaction keeps
:meth:`GroupCommitWriter.writable` (readiness) current.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from operator import itemgetter
from typing import Any, NamedTuple

log = logging.getLogger("rpsagg.server")

#: one operation of a write: its SQL and its arguments
Op = tuple[str, tuple[Any, ...]]


class _Queued(NamedTuple):
    """One item of the writer's queue: ``writes`` (each a list of operations that commits or
    fails as a unit) and the future of their outcome. ``many``: the future resolves with one
    outcome per write (None or a :class:`WriteError`) and never raises; else it resolves
    with None or raises the one write's :class:`WriteError`."""

    writes: list[list[Op]]
    loop: Any
    fut: Any
    many: bool


_STOP = object()
_PROBE = object()
#: the reason a write queued after :meth:`GroupCommitWriter.stop` is refused
STOPPED = "the store takes no more writes: its job has ended"
# errors that belong to one write's data: isolate it and commit the rest of its batch. Any
# other error (busy/locked past the timeout, disk full, I/O) fails the whole batch at once.
_PER_WRITE = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError,
              sqlite3.InterfaceError)


class WriteError(Exception):
    """A transaction did not commit; ``reason`` says why in words for the caller.

    Nothing of the write is in the database (its transaction was rolled back).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def describe(exc: BaseException) -> str:
    """The reason a write failed, for logs and for clients (the message of the refusal)."""
    name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
    text = str(exc)
    if name.startswith("SQLITE_FULL") or "disk is full" in text or "No space" in text:
        return (f"database write failed: the disk holding the database is full ({name}: "
                f"{text}); the server recovers once space is freed")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return (f"database write failed: the database is locked by another connection "
                f"({name}: {text})")
    return f"database write failed ({name}: {text})"


class GroupCommitWriter:
    """The writer thread of one connection, started at once (or never: ``start=False``, a
    writer stopped from the start, which refuses every write).

    Parameters
    ----------
    conn : sqlite3.Connection
        The connection it writes through (autocommit: it runs its own transactions).
    lock : threading.Lock
        Held around every use of ``conn`` (shared with the connection's other users).
    heartbeat : float
        Seconds of idleness after which a probe transaction checks that a write can still
        commit (so readiness notices a lock or a full disk without client traffic, and
        notices recovery).
    probe : callable
        The probe's operation (a harmless upsert), made anew for each probe.
    start : bool
        Whether the thread starts (False: a reader's store, stopped cleanly from the start).
    """

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock, heartbeat: float,
                 probe: Callable[[], Op], start: bool = True) -> None:
        self._conn = conn
        self._lock = lock
        self.heartbeat = heartbeat
        self._probe = probe
        self.last_error: str | None = None
        self._ok = True
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stopping = threading.Lock()  # a write is queued before the stop, or refused
        self._stopped = not start
        self._thread = threading.Thread(target=self._loop, name="rpsagg-store", daemon=True)
        if start:
            self._thread.start()

    def writable(self) -> bool:
        """Whether the writer is alive and its last transaction committed (readiness)."""
        return self._ok and self._thread.is_alive()

    def stopped_cleanly(self) -> bool:
        """Whether the writer was stopped after a last transaction that committed."""
        return self._stopped and self._ok and not self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread after the queued writes (waiting ``timeout`` seconds at most); a
        write queued after this is refused (:data:`STOPPED`)."""
        with self._stopping:
            self._stopped = True
            self._queue.put(_STOP)
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=timeout)

    def enqueue(self, ops: list[Op]) -> asyncio.Future[None]:
        """Queue ``ops`` for one atomic transaction; the future resolves once it is durable
        or raises :class:`WriteError` (nothing written). Call from the event loop.

        The write happens whether or not anyone awaits the future: its outcome decides.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._put(_Queued([ops], loop, fut, False))
        return fut

    def _put(self, item: _Queued) -> None:
        with self._stopping:
            if not self._stopped:
                self._queue.put(item)
                return
        _resolve_all([(item, [WriteError(STOPPED)] * len(item.writes))])

    def enqueue_many(self, writes: list[list[Op]]) -> asyncio.Future[list[WriteError | None]]:
        """Queue several writes, each atomic on its own (one's bad data never fails
        another's); the future resolves with one outcome per write, in order: None once it
        is durable, or the :class:`WriteError` that says why nothing of it was written. It
        never raises. Call from the event loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[WriteError | None]] = loop.create_future()
        self._put(_Queued(writes, loop, fut, True))
        return fut

    def write_sync(self, ops: list[Op]) -> None:
        """Commit ``ops`` from a thread that is not the event loop (start-up)."""
        if self._stopped:
            raise WriteError(STOPPED)
        with self._lock:
            self._transaction(ops)

    def _transaction(self, ops: list[Op]) -> None:
        """Run ``ops`` in one transaction; on any error roll back (if one is active) and
        re-raise. Caller holds ``self._lock``.
        """
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            for sql, group in itertools.groupby(ops, key=itemgetter(0)):
                rows = [args for _, args in group]
                if len(rows) == 1:
                    self._conn.execute(sql, rows[0])
                else:  # a group commit's rows of one kind: one call, not one per row
                    self._conn.executemany(sql, rows)
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:  # SQLite already rolled back (e.g. after SQLITE_FULL)
                    log.exception("[Store] ROLLBACK failed")
            raise

    def _run(self, ops: list[Op]) -> BaseException | None:
        with self._lock:
            try:
                self._transaction(ops)
            except Exception as exc:
                return exc
            return None

    def _note(self, error: BaseException | None) -> None:
        """Record the outcome of a transaction; log each change of state or of reason."""
        reason = None if error is None else describe(error)
        if error is None and not self._ok:
            log.warning("[Store] writes commit again")
        elif reason is not None and reason != self.last_error:
            log.error("[Store] %s", reason)
        self._ok = error is None
        self.last_error = reason

    def _loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.heartbeat)
            except queue.Empty:
                item = _PROBE
            if item is _STOP:
                return
            if item is _PROBE:  # idle: prove that a write can commit
                self._note(self._run([self._probe()]))
                continue
            batch = [item]
            stop = False
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            try:
                self._commit(batch)
            except BaseException:  # never let the writer die: fail the batch, keep serving
                log.exception("[Store] writer error")
                for item in batch:
                    errors: list[WriteError | None] = [WriteError("internal error")] * len(
                        item.writes)
                    item.loop.call_soon_threadsafe(_resolve_all, [(item, errors)])
            if stop:
                return

    def _commit(self, batch: list[_Queued]) -> None:
        writes = [w for item in batch for w in item.writes]
        error = self._run([op for w in writes for op in w])
        if error is not None and len(writes) > 1 and isinstance(error, _PER_WRITE):
            # one write's data is at fault: commit each on its own so the others still land
            outcomes = [self._run(w) for w in writes]
        else:
            outcomes = [error] * len(writes)
        failed = all(e is not None for e in outcomes) and not isinstance(error, _PER_WRITE)
        self._note(error if failed else None)
        by_loop: dict[Any, list[tuple[_Queued, list[WriteError | None]]]] = {}
        start = 0
        for item in batch:
            end = start + len(item.writes)
            by_loop.setdefault(item.loop, []).append(
                (item, [None if e is None else WriteError(describe(e))
                        for e in outcomes[start:end]]))
            start = end
        for loop, results in by_loop.items():  # one wake-up of the event loop per batch
            loop.call_soon_threadsafe(_resolve_all, results)


def _resolve_all(results: list[tuple[_Queued, list[WriteError | None]]]) -> None:
    for item, errors in results:
        if item.fut.done():
            continue
        if item.many:
            item.fut.set_result(errors)
        elif errors[0] is None:
            item.fut.set_result(None)
        else:
            item.fut.set_exception(errors[0])
