"""What the round engine shows the read model: a round's view (with the job's projection and
block size), the current round's arrivals at most every :data:`VIEW_INTERVAL` seconds, and
the job's progress."""

from __future__ import annotations

import asyncio
import math

from rpsagg import VectorCorrelationTracker
from rpsagg_server.readmodel.events import (
    ClientJoined,
    Event,
    JobUpdated,
    Publish,
    RoundProgress,
)
from rpsagg_server.readmodel.views import JobView, RoundView
from rpsagg_server.rounds.liveround import LiveRound
from rpsagg_server.rounds.results import JobProgress
from rpsagg_server.rounds.roundview import round_view
from rpsagg_server.settings.serverconfig import ServerConfig

# Arrivals reach the read model (dashboard, /metrics) at most this many seconds late.
VIEW_INTERVAL = 0.05


class ViewPublisher:
    """Builds and publishes the engine's views; every method runs on the event loop.

    Parameters
    ----------
    config : ServerConfig
    clients : dict
        The membership's client ids -> indices (read, never written, here).
    progress : JobProgress
        The job's progress (its encoding, current round, steps and end).
    tracker : VectorCorrelationTracker or None
        ``transform=auto``'s correlation priors (the job's view shows slot 0's), else None.
    publish : callable
        The engine's bus's ``publish``.
    """

    def __init__(self, config: ServerConfig, clients: dict[str, int], progress: JobProgress,
                 tracker: VectorCorrelationTracker | None, publish: Publish) -> None:
        self.cfg = config
        self.clients = clients
        self.progress = progress
        self.tracker = tracker
        self.publish = publish
        self._due = False
        self._at = -math.inf  # loop.time() of the last arrivals view

    def of(self, live: LiveRound) -> RoundView:
        """The read model's snapshot of a round (with the job's projection and block size)."""
        _, projection, block_size = self.progress.encoding
        return round_view(live, self.cfg, self.clients, projection, block_size)

    def on_event(self, event: Event) -> None:
        """A bus subscriber: a join refreshes the current round's view (its missing
        clients changed)."""
        if isinstance(event, ClientJoined) and not event.recovered:
            self.changed()

    def changed(self) -> None:
        """Publish the current round's view at most every :data:`VIEW_INTERVAL` seconds.

        A view costs O(n log n) (sorted arrivals and missing clients); rebuilt once per loop
        pass, it took a seventh of the event loop in a burst of 1,000 submissions. Arrivals
        reach the dashboard within ``VIEW_INTERVAL``; the round's state changes (opened,
        collecting, closed, finished) publish their views at once.
        """
        if self._due:
            return
        self._due = True
        loop = asyncio.get_running_loop()

        def refresh() -> None:
            self._due = False
            self._at = loop.time()
            live = self.progress.current
            if live is not None:
                self.publish(RoundProgress(self.of(live)))

        wait = self._at + VIEW_INTERVAL - loop.time()
        if wait <= 0:
            loop.call_soon(refresh)
        else:
            loop.call_later(wait, refresh)

    def job(self) -> None:
        """Publish the job's progress (steps, end, the smoothed correlation prior)."""
        p = self.progress
        prior = None if self.tracker is None else self.tracker.priors(self.cfg.n)[0]
        self.publish(JobUpdated(JobView(self.cfg.task, p.steps_done, self.cfg.rounds,
                                        p.job_done, prior, p.job_failure)))
