"""Finished rounds' arrays: kept in the store, cached in memory up to a bound in bytes.

What a finished round costs in memory grows with d: its estimate (``m x d`` float64: 8 MiB a
round at d = 2^20) and, for tasks whose state is a vector, the task's state after it. Both
are in the round's row from the moment it finished (the row commits before the result is
published), so memory only has to hold the ones being read. :class:`RoundArchive` keeps
them in a least-recently-used cache of at most ``--result-cache-bytes``: the engine puts
each round's arrays in as it finishes (the newest round is what every client reads next),
and a read of an evicted round reads its row back (:meth:`Store.round`, through the
store's second connection, off the event loop), bit for bit what was stored. A restart
loads none eagerly: the rounds are read back without their arrays, and the newest
finished round's arrays come back with it (the next round starts from its state).

A failed read is the caller's error (:class:`~rpsagg_server.store.ReadError`: GetResult
answers ``UNAVAILABLE``, a download 503) and changes nothing: the row stays in the store
and the next read tries again. Concurrent reads of one evicted round share one read.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
from numpy.typing import NDArray

from rpsagg_server.live import RoundArrays
from rpsagg_server.store import Store

__all__ = ["DEFAULT_CACHE_BYTES", "RoundArchive", "RoundArrays"]

#: ``--result-cache-bytes``' default: 8 rounds at d = 2^20, every round below d ~ 2^14
DEFAULT_CACHE_BYTES = 64 << 20


class RoundArchive:
    """Finished rounds' arrays: an LRU cache of at most ``max_bytes`` over the store.

    Thread-safe: the event loop puts and reads (:meth:`fetch`), the dashboard's worker
    threads and the task monitor read (:meth:`get`).

    Parameters
    ----------
    store : Store
    max_bytes : int
        The cache's bound (0: nothing cached; every read reads the store). A round larger
        than the bound is never cached.
    default_shape : callable
        ``(m, d)`` of an estimate whose row predates the stored shape (d may be learned
        after start-up: ``--d 0``).
    """

    def __init__(self, store: Store, max_bytes: int,
                 default_shape: Callable[[], tuple[int, int]]) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._default_shape = default_shape
        self._lru: OrderedDict[int, RoundArrays] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading: dict[int, Future[RoundArrays]] = {}
        #: cache hits, and reads of the store (misses), since start-up
        self.hits = 0
        self.reads = 0

    @property
    def cached_bytes(self) -> int:
        """Bytes of the arrays the cache holds now."""
        return self._bytes

    def cached(self) -> list[int]:
        """Round ids in the cache, least recently used first."""
        with self._lock:
            return list(self._lru)

    def put(self, round_id: int, arrays: RoundArrays) -> None:
        """Cache a round's arrays (a round that just finished; its row is durable)."""
        with self._lock:
            self._insert(round_id, arrays)

    def _insert(self, round_id: int, arrays: RoundArrays) -> None:
        old = self._lru.pop(round_id, None)
        if old is not None:
            self._bytes -= old.nbytes
        size = arrays.nbytes
        if size > self.max_bytes:
            return
        self._lru[round_id] = arrays
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, evicted = self._lru.popitem(last=False)
            self._bytes -= evicted.nbytes

    def _hit(self, round_id: int) -> RoundArrays | None:
        """The cached arrays (now the most recently used), or None. Caller holds the lock."""
        hit = self._lru.get(round_id)
        if hit is not None:
            self._lru.move_to_end(round_id)
            self.hits += 1
        return hit

    def get(self, round_id: int, keep: bool = True) -> RoundArrays:
        """A finished round's arrays, from the cache or read from the store (blocking: call
        it off the event loop). ``keep`` False: a read of the store does not enter the
        cache (a scan, such as the task monitor's after a restart, never evicts the
        rounds being read). Raises :class:`~rpsagg_server.store.ReadError`."""
        with self._lock:
            hit = self._hit(round_id)
            if hit is not None:
                return hit
            pending = self._loading.get(round_id)
            mine = pending is None
            if pending is None:
                pending = self._loading[round_id] = Future()
        if not mine:
            return pending.result()  # another thread reads it: share its outcome
        try:
            row = self.store.round(round_id)
            arrays = RoundArrays.of_row(row, self._default_shape())
        except BaseException as exc:
            with self._lock:
                del self._loading[round_id]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._loading[round_id]
            self.reads += 1
            if keep:
                self._insert(round_id, arrays)
        pending.set_result(arrays)
        return arrays

    async def fetch(self, round_id: int) -> RoundArrays:
        """:meth:`get` from the event loop: a hit at once, a read in a worker thread."""
        with self._lock:
            hit = self._hit(round_id)
        if hit is not None:
            return hit
        return await asyncio.to_thread(self.get, round_id)

    def estimate(self, round_id: int) -> NDArray[np.float64] | None:
        """A round's estimate (None for a failed round): :meth:`get`'s, blocking."""
        return self.get(round_id).estimate

    def state_reader(self, round_id: int) -> Callable[[], NDArray[np.float64] | None]:
        """A call that reads a round's task state without entering it in the cache (for a
        worker thread: the task monitor's measurements after a restart)."""
        return lambda: self.get(round_id, keep=False).state
