"""The task's progress per round, for the dashboard (evaluation mode only).

Clients never send their data, so the server can measure the task (the Rayleigh quotient of
power iteration, the k-means objective, the regression loss) only where it can load the
same data itself: in evaluation mode (``--eval``, where it already sees the raw vectors)
and where the data source is present on the server (synthetic data always is). It loads
the n shards exactly as the clients do (:func:`rpsagg.tasks.load_shard` with the job's
parameters) and, after every finished round, averages ``Task.metric`` of the new global
state over them. For power iteration it also finds the top eigenvector of the clients'
mean matrix ``(1/n) sum_i X_i^T X_i / rows_i`` (Lanczos on the matrix-free product; no
d x d matrix) and reports the distance of each iterate to it.

It subscribes to the domain events (:meth:`TaskMonitor.observe`: every decoded round) and
publishes :class:`~rpsagg_server.readmodel.events.TaskMeasured`. Everything runs in one worker
thread; results are published on the event loop. A failure
(data missing, a bad file) becomes the note the dashboard shows and never touches a round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy.typing import NDArray

from rpsagg.tasks import DataUnavailable, Shard, Task, load_shard
from rpsagg_server.readmodel.events import (
    Event,
    Publish,
    RoundDecoded,
    TaskMeasured,
    TaskNoteChanged,
)
from rpsagg_server.readmodel.views import TaskMetrics
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.store.database import ReadError

log = logging.getLogger("rpsagg.server")
FloatArray = NDArray[np.float64]
#: reads a round's state back (from the store) in the monitor's thread; None: no state
StateReader = Callable[[], FloatArray | None]
METRIC_NAMES = {
    "power-iteration": "Rayleigh quotient",
    "kmeans": "k-means objective",
    "linreg": "regression loss",
}


def top_eigenpair(shards: list[Shard], d: int) -> tuple[float, FloatArray]:
    """Top eigenvalue and unit eigenvector of ``(1/n) sum_i X_i^T X_i / rows_i``.

    Matrix-free (ARPACK Lanczos on the product ``v -> mean_i X_i^T (X_i v) / rows_i``).
    """
    from scipy.sparse.linalg import LinearOperator, eigsh

    def matvec(v: FloatArray) -> FloatArray:
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        acc = np.zeros(d)
        for s in shards:
            acc += s.x.T @ (s.x @ v) / max(1, s.x.shape[0])
        return acc / len(shards)

    op = LinearOperator((d, d), matvec=matvec, dtype=np.float64)
    vals, vecs = eigsh(op, k=1, which="LA", tol=1e-10, v0=np.ones(d) / np.sqrt(d))
    u = vecs[:, 0]
    return float(vals[0]), np.asarray(u / np.linalg.norm(u))


class TaskMonitor:
    """Measures the task after every finished round and publishes it.

    Parameters
    ----------
    cfg : ServerConfig
    task : Task
        The engine's task (its ``metric`` is what is averaged over the shards).
    publish : callable
        The event bus's publish (the metrics and the note go there).
    """

    def __init__(self, cfg: ServerConfig, task: Task, publish: Publish) -> None:
        self.cfg = cfg
        self.task = task
        self.publish = publish
        self._tasks: set[asyncio.Task[None]] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpsagg-task")
        self._shards: list[Shard] | None = None
        self._top: tuple[float, FloatArray] | None = None
        self._failed = False
        self.enabled = cfg.eval and task.name in METRIC_NAMES
        if not cfg.eval:
            note = "evaluation mode is off: the server measures the task only with --eval"
        elif task.name not in METRIC_NAMES:
            note = f"task {task.name!r} has no progress metric (the errors above are its result)"
        else:
            note = ""
        publish(TaskNoteChanged(note))

    def _load(self) -> list[Shard]:
        if self._shards is None:
            c = self.cfg
            if c.data == "synthetic":
                self._shards = [load_shard(c.data, c.task, i, c.n, c.d, r=c.data_r,
                                           seed=c.seed) for i in range(c.n)]
            else:  # a real data set is read once; the clients' contiguous blocks of rows
                whole = load_shard(c.data, c.task, 0, 1, c.d)
                rows = whole.x.shape[0]
                bounds = [(i * rows // c.n, (i + 1) * rows // c.n) for i in range(c.n)]
                self._shards = [
                    Shard(whole.x[lo:hi], None if whole.y is None else whole.y[lo:hi],
                          c.data_r, c.seed, i, c.n) for i, (lo, hi) in enumerate(bounds)]
            if self.task.name == "power-iteration":
                self._top = top_eigenpair(self._shards, c.d)
        return self._shards

    def measure(self, next_state: FloatArray) -> TaskMetrics | None:
        """The metrics of a global state (runs in the worker thread)."""
        shards = self._load()
        values = [self.task.metric(next_state, s) for s in shards]
        if any(v is None for v in values):
            return None
        value = float(np.mean([float(v) for v in values if v is not None]))
        name = METRIC_NAMES[self.task.name]
        if self._top is None:
            return TaskMetrics(name, value)
        lam, u = self._top
        v = np.asarray(next_state, dtype=np.float64).reshape(-1)
        cos = abs(float(u @ v)) / max(float(np.linalg.norm(v)), 1e-300)
        return TaskMetrics(name, value, lam, float(np.sqrt(max(0.0, 1.0 - cos * cos))))

    def _measure_state(self, state: FloatArray | StateReader) -> TaskMetrics | None:
        """:meth:`measure` of a state, or of the one ``state()`` reads (None: no state)."""
        value = state() if callable(state) else state
        return None if value is None else self.measure(value)

    async def on_round(self, round_id: int, next_state: FloatArray | StateReader) -> None:
        """Measure the state after ``round_id`` (or the one a call reads back from the
        store, in the worker thread) and publish it (never raises)."""
        if not self.enabled or self._failed:
            return
        loop = asyncio.get_running_loop()
        try:
            metrics = await loop.run_in_executor(self._executor, self._measure_state,
                                                 next_state)
        except ReadError as exc:  # this round's state could not be read back: skip it
            log.warning("[TaskMonitor] round %d not measured: %s", round_id, exc.reason)
            return
        except (DataUnavailable, ValueError, OSError) as exc:
            self._failed = True
            self.publish(TaskNoteChanged(f"the server cannot load the task's data: {exc}"))
            log.warning("[TaskMonitor] no task metrics: %s", exc)
            return
        except Exception as exc:  # a metric must never take the server down
            self._failed = True
            self.publish(TaskNoteChanged(f"measuring the task failed: {exc}"))
            log.exception("[TaskMonitor] measuring round %d failed", round_id)
            return
        if metrics is not None:
            self.publish(TaskMeasured(round_id, metrics))

    def observe(self, event: Event) -> None:
        """Measure the state after every decoded round (subscribed to the event bus)."""
        if isinstance(event, RoundDecoded):
            self.measure_later(event.view.round_id, event.next_state)

    def measure_later(self, round_id: int, next_state: FloatArray | StateReader) -> None:
        """Measure in the background (:meth:`on_round`); cancelled by :meth:`close`.
        ``next_state``: the state, or a call that reads it (in the worker thread)."""
        if not self.enabled or self._failed:
            return
        task = asyncio.ensure_future(self.on_round(round_id, next_state))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the measurements queued so far."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def close(self) -> None:
        """Stop the worker thread (pending measurements are dropped)."""
        for t in list(self._tasks):
            t.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
