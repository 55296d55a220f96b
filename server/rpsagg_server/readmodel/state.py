"""The read model of a running server, for the dashboard and the metrics layer.

:class:`ServerState` is built from the domain events (:mod:`rpsagg_server.readmodel.events`): the
server subscribes :meth:`ServerState.apply` to the engine's event bus, and nothing else
writes it. It lives in the same process and event loop as the ``grpc.aio`` server (the
intended deployment serves the FastAPI dashboard with uvicorn on that loop:
``rpsagg_server.process.serving.serve(config, http_app_factory=create_app)`` calls
``http_app_factory(state)`` and serves the returned ASGI app on ``--http-port``).

Read API (all methods are cheap, synchronous, and return frozen snapshots, the dataclasses
of :mod:`rpsagg_server.readmodel.views`):

- :meth:`ServerState.config` -- the server's
  :class:`~rpsagg_server.settings.serverconfig.ServerConfig`
  as a plain dict, without file paths (booleans tls, mtls, tokens, persistent_db instead).
- :meth:`ServerState.uptime_seconds`, :attr:`ServerState.started_at` (unix seconds).
- :meth:`ServerState.current_round` -- :class:`RoundView` of the open/collecting/decoding
  round, or None (before the first round and after the job is done).
- :meth:`ServerState.rounds` -- :class:`RoundView` list, newest first (``limit``/``offset``).
- :meth:`ServerState.round_detail` -- one :class:`RoundView` by id (None if unknown).
- :meth:`ServerState.estimate` -- :class:`EstimateView` of a done round: its decoded mean
  and what it came from (n', scheme, k, d, bytes). The values come from the engine's
  archive (:mod:`rpsagg_server.rounds.archive`): an evicted round's are read from the store, so
  this one may block for that read (call it off the event loop) and raises
  :class:`~rpsagg_server.store.database.ReadError` when the read fails.
- :meth:`ServerState.clients` -- :class:`ClientView` list ordered by client index.
- :meth:`ServerState.client_stats` -- :class:`ClientStats` per joined client: last seen,
  rounds contributed and missed, bytes sent, straggler flag (derived from the rounds).
- :meth:`ServerState.task_metrics` -- :class:`TaskMetrics` of the task's state after a
  round (evaluation mode, where the server can load the task's data), and
  :meth:`ServerState.task_metrics_note`, why there are none otherwise.
- :meth:`ServerState.job` -- :class:`JobView`: task, steps done, rounds planned, done flag,
  smoothed R_hat, and why the job failed (``--max-failed-rounds``), if it did.
- :meth:`ServerState.beta` -- :class:`BetaView`: the start-up computation of beta for n
  (``computing``, ``ready``, ``failed`` or ``not needed``), with its timing.
- :meth:`ServerState.counters` -- the cumulative counters of the server's one metrics
  ledger (:class:`~rpsagg_server.readmodel.ledger.MetricsLedger`; its docstring lists the keys).
- :meth:`ServerState.readiness` -- readiness checks by name (``database``, ``grpc``,
  ``beta``) and whether each passes now (registered by the server with
  :meth:`ServerState.add_check`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rpsagg_server.readmodel.activity import ClientStats, client_stats
from rpsagg_server.readmodel.events import (
    ROUND_EVENTS,
    BetaUpdated,
    ClientJoined,
    Event,
    JobUpdated,
    RoundDecoded,
    RoundRecovered,
    TaskMeasured,
    TaskNoteChanged,
)
from rpsagg_server.readmodel.ledger import MetricsLedger
from rpsagg_server.readmodel.views import (
    BETA_STATES,
    Arrival,
    BetaView,
    ClientView,
    EstimateInfo,
    EstimateView,
    EvalErrors,
    JobView,
    RoundView,
    TaskMetrics,
)
from rpsagg_wire.v1.messages import LIVE, ROUND_STATES

__all__ = ["BETA_STATES", "ROUND_STATES", "Arrival", "BetaView", "ClientView", "EstimateView",
           "EvalErrors", "JobView", "RoundView", "ServerState", "TaskMetrics"]
_LIVE = LIVE


@dataclass
class ServerState:
    """Snapshots of a server's configuration, rounds, clients and counters.

    Written only by :meth:`apply` (the domain events); read by anyone.
    """

    config_dict: dict[str, Any]
    started_at: float = field(default_factory=time.time)
    ledger: MetricsLedger = field(default_factory=MetricsLedger)
    _rounds: dict[int, RoundView] = field(default_factory=dict)
    _current: int | None = None
    _clients: dict[str, ClientView] = field(default_factory=dict)
    _job: JobView | None = None
    _beta: BetaView | None = None
    _checks: dict[str, Callable[[], bool]] = field(default_factory=dict)
    _task_metrics: dict[int, TaskMetrics] = field(default_factory=dict)
    _estimates: dict[int, EstimateInfo] = field(default_factory=dict)
    #: a done round's estimate by id (the engine's archive; set by the server): blocks
    #: while it reads an evicted round back, raises ``ReadError`` when that read fails
    read_estimate: Callable[[int], NDArray[np.float64] | None] | None = None
    _task_note: str = "evaluation mode is off: the server measures the task only with --eval"
    #: finished jobs moved aside by earlier starts (``--on-finished-job new``), newest first,
    #: as :meth:`rpsagg_server.jobs.PastJob.as_dict` gives them; set once at start-up
    past_jobs: list[dict[str, Any]] = field(default_factory=list)

    # -- read API --------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The server configuration as a dict."""
        return dict(self.config_dict)

    def uptime_seconds(self) -> float:
        """Seconds since this process started serving."""
        return time.time() - self.started_at

    def current_round(self) -> RoundView | None:
        """The round that is open, collecting or decoding, if any."""
        return None if self._current is None else self._rounds.get(self._current)

    def rounds(self, limit: int | None = None, offset: int = 0) -> list[RoundView]:
        """Rounds, newest first."""
        ids = sorted(self._rounds, reverse=True)[offset:]
        if limit is not None:
            ids = ids[:limit]
        return [self._rounds[i] for i in ids]

    def round_detail(self, round_id: int) -> RoundView | None:
        """One round by id, or None."""
        return self._rounds.get(round_id)

    def estimate_info(self, round_id: int) -> EstimateInfo | None:
        """A done round's provenance without its values (never blocks), or None."""
        if self.read_estimate is None:
            return None
        return self._estimates.get(round_id)

    def estimate(self, round_id: int) -> EstimateView | None:
        """A done round's estimate and its provenance (None otherwise, and without an
        archive to read it from). The values are the engine's own or read back from the
        store (read-only): read them, never write. May block on that read: call it off the
        event loop; raises :class:`~rpsagg_server.store.database.ReadError` when the read fails."""
        info = self._estimates.get(round_id)
        if info is None or self.read_estimate is None:
            return None
        values = self.read_estimate(round_id)
        return None if values is None else EstimateView.of(info, values)

    def clients(self) -> list[ClientView]:
        """Joined clients, ordered by index."""
        return sorted(self._clients.values(), key=lambda c: c.index)

    def client_stats(self) -> list[ClientStats]:
        """Per-client activity, ordered by index (see :class:`ClientStats`)."""
        return client_stats(self.clients(), list(self._rounds.values()))

    def task_metrics(self, round_id: int) -> TaskMetrics | None:
        """The task's metrics after round ``round_id`` (None while unknown); round 0 is the
        task's starting state."""
        return self._task_metrics.get(round_id)

    def task_metrics_note(self) -> str:
        """Why rounds have no task metrics ("" when the server measures the task)."""
        return self._task_note

    def job(self) -> JobView | None:
        """Task progress (None before the engine started)."""
        return self._job

    def beta(self) -> BetaView | None:
        """The start-up computation of beta (None before the engine started)."""
        return self._beta

    def counters(self) -> dict[str, float]:
        """Cumulative counters since this process started (the metrics ledger's)."""
        return self.ledger.counters()

    def readiness(self) -> dict[str, bool]:
        """Readiness checks by name (``database``, ``grpc``, ``beta``); a check that raises
        fails."""
        out = {}
        for name, check in self._checks.items():
            try:
                out[name] = bool(check())
            except Exception:
                out[name] = False
        return out

    # -- written by the events -------------------------------------------------------------
    def add_check(self, name: str, check: Callable[[], bool]) -> None:
        """Register a readiness check (``check()`` true when it passes)."""
        self._checks[name] = check

    def apply(self, event: Event) -> None:
        """Update the snapshots from one domain event (subscribed to the engine's bus)."""
        if isinstance(event, ROUND_EVENTS):
            view = event.view
            self._rounds[view.round_id] = view
            current = (event.current if isinstance(event, RoundRecovered)
                       else view.state in _LIVE)
            if current:
                self._current = view.round_id
            elif self._current == view.round_id:
                self._current = None
            if isinstance(event, RoundDecoded | RoundRecovered) and event.estimate is not None:
                self._estimates[view.round_id] = event.estimate
        elif isinstance(event, ClientJoined):
            self._clients[event.client.client_id] = event.client
        elif isinstance(event, JobUpdated):
            self._job = event.job
        elif isinstance(event, BetaUpdated):
            self._beta = event.beta
        elif isinstance(event, TaskMeasured):
            self._task_metrics[event.round_id] = event.metrics
        elif isinstance(event, TaskNoteChanged):
            self._task_note = event.note
