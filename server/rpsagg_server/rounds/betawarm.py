"""beta for n, computed when the server starts, visibly.

The unbiasing scalar beta of the spatial estimators comes from a Monte Carlo on a cold cache
(minutes at large n). :class:`BetaWarmup` runs it in the decode thread ahead of the first
decode, logs its start, a line every :data:`LOG_EVERY` seconds while it runs and its end with
the timing, publishes a :class:`~rpsagg_server.readmodel.views.BetaView` (``/api/status``) and sets
:attr:`BetaWarmup.ready` (the ``beta`` readiness check of ``/readyz``) once it is done.
Joins and submissions are served meanwhile; a decode queued behind it in the same thread
waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

from rpsagg_server.readmodel.events import BetaUpdated, Publish
from rpsagg_server.readmodel.views import BetaView

log = logging.getLogger("rpsagg.server")
LOG_EVERY = 5.0  # seconds between "beta: still computing" log lines


class BetaWarmup:
    """The start-up computation of beta for ``n``.

    Parameters
    ----------
    publish : callable
        The event bus's publish (:class:`~rpsagg_server.readmodel.events.BetaUpdated`).
    n : int
    """

    def __init__(self, publish: Publish, n: int) -> None:
        self.publish = publish
        self.n = n
        self.ready = asyncio.Event()

    def not_needed(self) -> None:
        """The job is already done: nothing will be decoded."""
        self.publish(BetaUpdated(BetaView("not needed", self.n, time.time())))
        self.ready.set()

    def start(self, executor: Executor, compute: Callable[[], float]) -> asyncio.Task[None]:
        """Run ``compute`` in ``executor``; returns the task that follows it."""
        started = time.time()
        self.publish(BetaUpdated(BetaView("computing", self.n, started)))
        log.info("[Engine] beta for n=%d: computing (a Monte Carlo on a cold cache can take "
                 "minutes; joins and submissions are served, the first decode waits)", self.n)
        fut = asyncio.get_running_loop().run_in_executor(executor, compute)
        return asyncio.ensure_future(self._follow(fut, started))

    async def _follow(self, fut: asyncio.Future[float], started: float) -> None:
        while not fut.done():
            await asyncio.wait({fut}, timeout=LOG_EVERY)
            if not fut.done():
                log.info("[Engine] beta for n=%d: still computing (%.0f s)", self.n,
                         time.time() - started)
        seconds = time.time() - started
        try:
            value = fut.result()
        except Exception as exc:  # every decode will fail with it too, and say so
            log.error("[Engine] beta for n=%d failed after %.1f s: %s", self.n, seconds, exc)
            self.publish(BetaUpdated(BetaView("failed", self.n, started, seconds, error=str(exc))))
            return
        log.info("[Engine] beta for n=%d: ready in %.1f s (beta = %.6g)", self.n, seconds,
                 value)
        self.publish(BetaUpdated(BetaView("ready", self.n, started, seconds, value)))
        self.ready.set()
