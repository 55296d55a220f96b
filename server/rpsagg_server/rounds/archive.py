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

A failed read is the caller's error (:class:`~rpsagg_server.store.database.ReadError`: GetResult is
refused as unavailable, and so is a download) and changes nothing: the row stays in the store
and the next read tries again. Concurrent reads of one evicted round share one read, and
every read runs in one thread of the archive's own.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from numpy.typing import NDArray
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rpsagg_server.rounds.liveround import RoundArrays
from rpsagg_server.rounds.rowcodec import arrays_of_row
from rpsagg_server.store.database import ReadError, Store

__all__ = ["DEFAULT_CACHE_BYTES", "RoundArchive", "RoundArrays"]

#: ``--result-cache-bytes``' default: 8 rounds at d = 2^20, every round below d ~ 2^14
DEFAULT_CACHE_BYTES = 64 << 20


#: the reader thread every ended job's archive shares (:meth:`RoundArchive.release`)
_ENDED_READER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpsagg-archive-ended")
#: a closed archive's reader: shut down, so a read raises ``ReadError``
_CLOSED = ThreadPoolExecutor(max_workers=1)
_CLOSED.shutdown()


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
    """

    def __init__(self, store: Store, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._lru: OrderedDict[int, RoundArrays] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading: dict[int, Future[RoundArrays]] = {}
        #: every read of the store runs in this one thread, so the rows' bytes come from
        #: one malloc arena rather than one per calling thread (the dashboard's dozens);
        #: the store serializes its reads anyway
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpsagg-archive")
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

    def shrink(self, max_bytes: int) -> None:
        """Lower the bound to ``max_bytes`` now (an ended job of a standing service keeps
        little in memory), evicting the least recently used rounds beyond it."""
        with self._lock:
            self.max_bytes = min(self.max_bytes, max_bytes)
            freed = 0
            while self._bytes > self.max_bytes:
                _, evicted = self._lru.popitem(last=False)
                self._bytes -= evicted.nbytes
                freed += evicted.nbytes
        _trim(freed)

    def put(self, round_id: int, arrays: RoundArrays) -> None:
        """Cache a round's arrays (a round that just finished; its row is durable)."""
        with self._lock:
            freed = self._insert(round_id, arrays)
        _trim(freed)

    def _insert(self, round_id: int, arrays: RoundArrays) -> int:
        """Cache the arrays, evicting the least recently used beyond the bound; returns the
        bytes evicted. Caller holds the lock."""
        freed = 0
        old = self._lru.pop(round_id, None)
        if old is not None:
            self._bytes -= old.nbytes
        size = arrays.nbytes
        if size > self.max_bytes:
            return freed
        self._lru[round_id] = arrays
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, evicted = self._lru.popitem(last=False)
            self._bytes -= evicted.nbytes
            freed += evicted.nbytes
        return freed

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
        rounds being read). Raises :class:`~rpsagg_server.store.database.ReadError`."""
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
            try:
                arrays = self._reader.submit(self._read, round_id).result()
            except RuntimeError as exc:  # the reader was shut down (the server stops)
                raise ReadError(f"round {round_id} was not read back: {exc}") from None
        except BaseException as exc:
            with self._lock:
                del self._loading[round_id]
            pending.set_exception(exc)
            raise
        freed = 0
        with self._lock:
            del self._loading[round_id]
            self.reads += 1
            if keep:
                freed = self._insert(round_id, arrays)
        pending.set_result(arrays)
        _trim(freed)
        return arrays

    def _read(self, round_id: int) -> RoundArrays:
        """Read a round's row and wrap its arrays (in the reader thread)."""
        return arrays_of_row(self.store.round(round_id))

    def release(self) -> None:
        """The job ended: its reads of the store go to the one reader thread that every
        ended job's archive shares, and its own thread stops."""
        own, self._reader = self._reader, _ENDED_READER
        if own is not _ENDED_READER:
            own.shutdown(wait=False)

    def close(self) -> None:
        """Stop the reader thread (a read after this raises ``ReadError``)."""
        own, self._reader = self._reader, _CLOSED
        if own is not _ENDED_READER:  # the shared one serves the other ended jobs
            own.shutdown(wait=False, cancel_futures=True)

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


#: evictions of at least this many bytes hand freed memory back to the system
TRIM_BYTES = 1 << 20
try:  # glibc: free pages of every malloc arena go back to the system
    _malloc_trim: Callable[[int], int] | None = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # another C library: its own policy
    _malloc_trim = None


def _trim(freed: int) -> None:
    """After an eviction of ``freed`` bytes: glibc keeps freed memory of a thread's arena
    (the reader's rows, the decode's estimates) for that thread; trimming returns it, so
    what the cache evicted leaves the RSS (a restart's reads of 8 old rounds at d = 2^20
    otherwise stayed ~60 MiB after the cache had moved on)."""
    if freed >= TRIM_BYTES and _malloc_trim is not None:
        _malloc_trim(0)


class ArchiveCollector(Collector):
    """The result cache's figures for ``/metrics``.

    Parameters
    ----------
    archive : RoundArchive
        The engine's archive.
    """

    def __init__(self, archive: RoundArchive) -> None:
        self.archive = archive

    def describe(self) -> Iterable[Metric]:
        """The families (their names make a registry refuse a second copy)."""
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        """Yield ``rpsagg_result_cache_bytes``, ``rpsagg_result_cache_max_bytes``,
        ``rpsagg_result_cache_rounds`` (gauges), ``rpsagg_result_cache_hits_total`` and
        ``rpsagg_result_reads_total`` (reads of the database, counters)."""
        a = self.archive
        yield GaugeMetricFamily("rpsagg_result_cache_bytes",
                                "bytes of finished rounds' arrays held in memory",
                                value=a.cached_bytes)
        yield GaugeMetricFamily("rpsagg_result_cache_max_bytes",
                                "the bound on them (--result-cache-bytes)", value=a.max_bytes)
        yield GaugeMetricFamily("rpsagg_result_cache_rounds",
                                "finished rounds whose arrays are held in memory",
                                value=len(a.cached()))
        yield CounterMetricFamily("rpsagg_result_cache_hits",
                                  "finished rounds' arrays served from memory", value=a.hits)
        yield CounterMetricFamily("rpsagg_result_reads",
                                  "finished rounds' arrays read back from the database",
                                  value=a.reads)

