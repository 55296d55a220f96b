"""Estimate bodies in JSON and CSV, formatted once per round and format off the server's
process, kept on disk within a byte bound.

The server's event loop serves gRPC and the dashboard together. Formatting an estimate's
decimals holds the interpreter lock for ~0.4 s per 2^20 values; done in the server's
process, even in threads, it takes the loop's share of the lock, and fifty concurrent
downloads at d = 2^20 took GetRound's median from milliseconds to about a second.
:class:`BodyCache` therefore:

* **formats in a worker process** (:func:`~rpsagg_server.http.estimatebodies.write_body`, in
  a ``spawn`` process pool of :data:`WORKERS` process, started at the first JSON or CSV
  download, at a lower priority, :data:`WORKER_NICE`): the server's process only hands over
  the values and waits;
* **formats each body once**: concurrent requests for the same round and format wait for
  the same render, and later ones read the file it wrote;
* **bounds the work queued**: at most ``pending_max`` renders wait or run at once (each
  holds its values in memory until formatted); one more distinct body is refused with
  :class:`RenderBusy` (the route answers 503 with ``Retry-After``);
* **bounds the disk**: rendered bodies are files in a private directory in the system's
  temporary directory (``TMPDIR``), the least recently used removed once they add up to
  more than ``max_bytes`` (a body a request is about to open is never removed under it; an
  open file outlives its removal); the directory is removed when the app stops, and one
  left by a killed server is removed by the next server's first render (:func:`sweep`);
* **fault story**: a render whose write fails (the directory gone, a full disk) or whose
  worker dies (killed, out of memory) fails the requests waiting for it with
  :class:`RenderError` (503 with the reason), keeps nothing, and the next request renders
  again (in a new worker process, when the old one died). A request whose client goes away
  while it waits leaves the render running for the others (and the cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from numpy.typing import NDArray
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rpsagg_server.http.estimatebodies import DECIMAL_FORMATS, write_body

log = logging.getLogger("rpsagg.server")

#: worker processes formatting bodies (one: a download never takes more than one core)
WORKERS = 1
#: the worker's niceness above the server's: formatting downloads is background work, and
#: gRPC calls and decodes come first when the cores are busy
WORKER_NICE = 10
#: distinct bodies waiting for or in a render, at most (each holds its values meanwhile)
PENDING_MAX = 8
#: the default byte bound of the rendered bodies on disk
DEFAULT_MAX_BYTES = 256 << 20
#: the body directories' prefix (in the system's temporary directory, ``TMPDIR``)
DIR_PREFIX = "rpsagg-bodies-"
#: the file a living cache holds locked in its directory
LOCK_NAME = ".lock"
#: a body directory without a lock file is someone's being made for this long
UNLOCKED_GRACE_S = 60.0
#: seconds between the worker's checks that the server's process is still its parent
PARENT_POLL_S = 0.5

#: (head fields, values) of a body, read when it must be rendered
Loader = Callable[[], tuple[dict[str, Any], NDArray[np.float64]]]


def _worker_init(parent: int) -> None:
    """In the worker: yield the CPU to the server's process (:data:`WORKER_NICE`), and end
    when that process ends, however it ends (a ``kill -9`` of the server leaves no
    formatting process behind): a thread watches the parent every :data:`PARENT_POLL_S`.
    (``PR_SET_PDEATHSIG`` would follow the thread that started the worker, not the
    process.)"""
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _remove(directory: str, lock: list[Any]) -> None:
    if lock[0] is not None:
        lock[0].close()
        lock[0] = None
    shutil.rmtree(directory, ignore_errors=True)


def sweep(base: str) -> list[str]:
    """Remove the body directories in ``base`` that no living server holds.

    Each cache holds an exclusive ``flock`` on its directory's :data:`LOCK_NAME` while it
    lives, so a directory whose lock can be taken was left by a server that was killed (a
    ``kill -9`` runs no clean-up); a directory without a lock file is left alone for
    :data:`UNLOCKED_GRACE_S` (it may be being made). Returns the directories removed.
    """
    removed = []
    for d in Path(base).glob(DIR_PREFIX + "*"):
        try:
            with open(d / LOCK_NAME, "r+") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a living server's
        except FileNotFoundError:
            try:
                if time.time() - d.stat().st_mtime < UNLOCKED_GRACE_S:
                    continue
            except OSError:
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    if removed:
        log.info("[HTTP] removed %d estimate body directories of stopped servers: %s",
                 len(removed), ", ".join(removed))
    return removed


class RenderBusy(Exception):
    """Too many distinct bodies are waiting for a render; try again shortly."""


class RenderError(Exception):
    """A body could not be rendered; ``reason`` says why (one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Body:
    path: Path
    ready: asyncio.Future[int]
    size: int = 0
    waiting: int = 0


@dataclass
class RenderCounts:
    """What :class:`BodyCache` has done (the ``/metrics`` counters)."""

    renders: int = 0
    failures: int = 0
    busy: int = 0
    hits: int = 0
    evictions: int = 0
    seconds: float = 0.0


@dataclass
class BodyCache:
    """JSON and CSV bodies of estimates, rendered once each in a worker process.

    Parameters
    ----------
    max_bytes : int
        The rendered bodies kept on disk add up to at most this (the least recently used
        removed first); 0 keeps none beyond the requests that opened them.
    pending_max : int
        Distinct bodies waiting for or in a render, at most.
    directory : str, optional
        Where the private temporary directory is made (default: the system's, ``TMPDIR``).
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    pending_max: int = PENDING_MAX
    directory: str | None = None
    counts: RenderCounts = field(default_factory=RenderCounts)
    _bodies: OrderedDict[tuple[int, str, str], _Body] = field(default_factory=OrderedDict)
    _dir: Path | None = None
    _pool: ProcessPoolExecutor | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _finalizer: Any = None
    _lock: list[Any] = field(default_factory=lambda: [None])  # the lock file, once open

    @property
    def pending(self) -> int:
        """Bodies waiting for or in a render."""
        return sum(1 for b in self._bodies.values() if not b.ready.done())

    @property
    def stored_bytes(self) -> int:
        """Bytes of the rendered bodies on disk."""
        return sum(b.size for b in self._bodies.values() if b.ready.done())

    async def open(self, round_id: int, fmt: str, load: Loader, retried: bool = False,
                   job: str = "") -> tuple[BinaryIO, int]:
        """The body of round ``round_id`` (of job ``job``: one cache serves every job of a
        server) in ``fmt``, open for reading, and its size.

        Renders it (``load()`` run in a thread for the values, the formatting in the
        worker process) unless it is on disk or being rendered (a body whose file was
        removed under the server is rendered again, once: ``retried``). The caller closes
        the file.

        Raises
        ------
        RenderBusy
            ``pending_max`` other bodies are waiting for a render.
        RenderError
            The render failed (the reason in ``.reason``).
        Exception
            What ``load`` raised.
        """
        if fmt not in DECIMAL_FORMATS:
            raise ValueError(f"no rendered format {fmt!r}")
        key = (round_id, fmt, job)
        body = self._bodies.get(key)
        if body is None:
            if self.pending >= self.pending_max:
                self.counts.busy += 1
                raise RenderBusy(f"{self.pending} estimate bodies are being formatted")
            body = self._start(key, load)
        else:
            self._bodies.move_to_end(key)
            if body.ready.done():
                self.counts.hits += 1
        body.waiting += 1
        try:
            if not body.ready.done():
                await asyncio.shield(body.ready)
            body.ready.result()  # a failed render raises here
            try:
                f = open(body.path, "rb")  # noqa: SIM115 (the response closes it)
            except FileNotFoundError:  # removed under the server: render it again
                if self._bodies.get(key) is body:
                    del self._bodies[key]
                if retried:
                    raise RenderError("its file was removed as soon as it was written"
                                      ) from None
                return await self.open(round_id, fmt, load, retried=True, job=job)
        finally:
            body.waiting -= 1
            self._evict()
        return f, body.size

    def _start(self, key: tuple[int, str, str], load: Loader) -> _Body:
        loop = asyncio.get_running_loop()
        prefix = f"{key[2]}-" if key[2] else ""
        body = _Body(Path(f"{prefix}round-{key[0]}.{key[1]}"), loop.create_future())
        self._bodies[key] = body
        task = loop.create_task(self._render(key, body, load))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return body

    async def _render(self, key: tuple[int, str, str], body: _Body, load: Loader) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            head, values = await asyncio.to_thread(load)
            body.path = self._directory() / body.path.name
            pool = self._executor()
            try:
                size = await loop.run_in_executor(pool, write_body, str(body.path), key[1],
                                                  head, np.ascontiguousarray(values))
            except BrokenProcessPool:
                if self._pool is pool:
                    self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
                raise RenderError("the process formatting it exited; try again") from None
            except OSError as exc:
                raise RenderError(f"could not write it ({exc.strerror or exc})") from None
        except BaseException as exc:
            self.counts.failures += 1
            if self._bodies.get(key) is body:
                del self._bodies[key]
            if isinstance(exc, OSError):  # e.g. the directory cannot be made
                exc = RenderError(f"could not write it ({exc.strerror or exc})")
            body.ready.set_exception(exc if not isinstance(exc, asyncio.CancelledError)
                                     else RenderError("the server is stopping"))
            body.ready.exception()  # retrieved: the waiters (if any are left) see it
            log.warning("[HTTP] round %d's %s estimate body: %s", key[0], key[1], exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        body.size = size
        self.counts.renders += 1
        self.counts.seconds += loop.time() - t0
        body.ready.set_result(size)
        self._evict()

    def _evict(self) -> None:
        over = self.stored_bytes - self.max_bytes
        for key, body in list(self._bodies.items()):
            if over <= 0:
                break
            if body.waiting or not body.ready.done():
                continue
            del self._bodies[key]
            with contextlib.suppress(OSError):
                body.path.unlink()
            self.counts.evictions += 1
            over -= body.size

    def _directory(self) -> Path:
        """The private directory, made (and locked) at the first render, made again when it
        was removed under the server."""
        if self._dir is None:
            base = self.directory or tempfile.gettempdir()
            sweep(base)
            self._dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=base))
            self._finalizer = weakref.finalize(self, _remove, str(self._dir), self._lock)
        if self._lock[0] is None or not (self._dir / LOCK_NAME).exists():
            self._dir.mkdir(parents=True, exist_ok=True)
            if self._lock[0] is not None:
                self._lock[0].close()
            f = open(self._dir / LOCK_NAME, "w")  # noqa: SIM115 (held while the cache lives)
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock[0] = f
        return self._dir

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: the server's process runs gRPC's threads, which a fork copies badly
            self._pool = ProcessPoolExecutor(
                WORKERS, mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_init, initargs=(os.getpid(),))
        return self._pool

    def worker_pids(self) -> list[int]:
        """The worker processes' ids (none before the first render)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return sorted(procs)

    def close(self) -> None:
        """Stop the worker process and remove the rendered bodies."""
        for task in self._tasks:
            task.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._bodies.clear()
        if self._finalizer is not None:
            self._finalizer()
            self._dir = None


class BodyCacheCollector(Collector):
    """The body cache's figures for ``/metrics``."""

    def __init__(self, cache: BodyCache) -> None:
        self.cache = cache

    def describe(self) -> Iterable[Metric]:
        """The families (their names make a registry refuse a second copy)."""
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        """Yield ``rpsagg_http_estimate_renders_total``,
        ``rpsagg_http_estimate_render_failures_total``,
        ``rpsagg_http_estimate_renders_refused_total``,
        ``rpsagg_http_estimate_render_hits_total``,
        ``rpsagg_http_estimate_render_seconds_total`` (counters),
        ``rpsagg_http_estimate_renders_pending`` and ``rpsagg_http_estimate_bodies_bytes``
        (gauges)."""
        c = self.cache.counts
        yield CounterMetricFamily("rpsagg_http_estimate_renders",
                                  "JSON and CSV estimate bodies formatted", value=c.renders)
        yield CounterMetricFamily("rpsagg_http_estimate_render_failures",
                                  "estimate bodies whose formatting failed", value=c.failures)
        yield CounterMetricFamily("rpsagg_http_estimate_renders_refused",
                                  "downloads answered 503: too many bodies being formatted",
                                  value=c.busy)
        yield CounterMetricFamily("rpsagg_http_estimate_render_hits",
                                  "downloads served from a body already formatted",
                                  value=c.hits)
        yield CounterMetricFamily("rpsagg_http_estimate_render_seconds",
                                  "seconds from a render's start to its body on disk",
                                  value=c.seconds)
        yield GaugeMetricFamily("rpsagg_http_estimate_renders_pending",
                                "estimate bodies waiting for or in a render",
                                value=self.cache.pending)
        yield GaugeMetricFamily("rpsagg_http_estimate_bodies_bytes",
                                "bytes of formatted estimate bodies on disk",
                                value=self.cache.stored_bytes)
