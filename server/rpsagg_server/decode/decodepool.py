"""Decode workers shared fairly by the jobs of one server.

Each job gets a *lane* (:meth:`DecodePool.lane`), a ``concurrent.futures.Executor`` that runs
its work one item at a time, in order (as the one decode thread of a single-job server did:
beta's warm-up, then each round's decode). The pool's workers take the next item from the
lanes in turn (round robin over the lanes with work waiting), so a job with a long decode
holds at most one worker and the others keep decoding: a big job never stalls another's
rounds. Admission and the rounds' bookkeeping run on the event loop and never wait for a
worker.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


def default_workers() -> int:
    """Workers of a pool: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class DecodePool:
    """Worker threads shared by lanes, served round robin.

    Parameters
    ----------
    workers : int
        Threads (default: :func:`default_workers`).
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        self._cond = threading.Condition()
        self._ready: deque[_Lane] = deque()  # lanes with work waiting and none running
        self._threads: list[threading.Thread] = []
        self._closed = False

    def lane(self, name: str) -> Executor:
        """A new lane (its work runs in submission order, one item at a time)."""
        return _Lane(self, name)

    def _start_threads(self) -> None:
        while len(self._threads) < self.workers:
            t = threading.Thread(target=self._work, name=f"rpsagg-decode-{len(self._threads)}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def _schedule(self, lane: _Lane) -> None:
        """(Under the lock) ``lane`` has work and none running: queue it for a worker."""
        if not lane.running and lane.items and lane not in self._ready:
            self._ready.append(lane)
            self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._ready and not self._closed:
                    self._cond.wait()
                if self._closed and not self._ready:
                    return
                lane = self._ready.popleft()
                fut, fn = lane.items.popleft()
                lane.running = True
            try:
                if fut.set_running_or_notify_cancel():
                    try:
                        result = fn()
                    except BaseException as exc:
                        fut.set_exception(exc)
                    else:
                        fut.set_result(result)
            finally:
                with self._cond:
                    lane.running = False
                    self._schedule(lane)  # its next item goes to the back of the line

    def close(self) -> None:
        """Stop the workers once the queued work is done (does not wait)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Lane(Executor):
    """One job's queue in a :class:`DecodePool`."""

    def __init__(self, pool: DecodePool, name: str) -> None:
        self.pool = pool
        self.name = name
        self.items: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self.running = False
        self._shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue ``fn(*args, **kwargs)`` behind this lane's earlier work."""
        fut: Future[Any] = Future()
        with self.pool._cond:
            if self._shut or self.pool._closed:
                raise RuntimeError(f"decode lane {self.name} is shut down")
            self.pool._start_threads()
            self.items.append((fut, lambda: fn(*args, **kwargs)))
            self.pool._schedule(self)
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new work; with ``cancel_futures``, cancel what has not started. (``wait``
        is not supported: a lane's work finishes on the pool's threads.)"""
        with self.pool._cond:
            self._shut = True
            if cancel_futures:
                while self.items:
                    self.items.popleft()[0].cancel()
                if self in self.pool._ready:
                    self.pool._ready.remove(self)
