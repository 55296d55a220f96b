"""Domain events of a running server, and the one bus that fans them out.

The round engine (:mod:`rpsagg_server.rounds.engine` and its parts), the beta warm-up, the task
monitor and the gRPC edge *publish* small frozen events; the read model
(:class:`~rpsagg_server.readmodel.state.ServerState`), the WatchRounds broadcast
(:class:`~rpsagg_server.rounds.results.Watchers`), the metrics ledger
(:class:`~rpsagg_server.readmodel.ledger.MetricsLedger`) and the task monitor *subscribe*.
Subscribers are called synchronously on the event loop, in subscription order, and must be fast; an
event is published after the change it reports is durable (where it is a stored change).

Round events carry the round's :class:`~rpsagg_server.readmodel.views.RoundView` after the change,
so a subscriber never reads the engine's mutable round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rpsagg_server.readmodel.views import (
    BetaView,
    ClientView,
    EstimateInfo,
    JobView,
    RoundView,
    TaskMetrics,
)

log = logging.getLogger("rpsagg.server")


# -- membership --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientJoined:
    """A client's join committed (``recovered``: read back from the store at start-up)."""

    client: ClientView
    recovered: bool = False


# -- submissions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubmissionCommitted:
    """A submission's write committed: it is part of its round (acknowledged ``ok``)."""

    round_id: int
    client_id: str
    wire_bytes: int
    payload_bytes: int


@dataclass(frozen=True)
class SubmissionDuplicate:
    """An identical retry of a committed submission was acknowledged (``duplicate``)."""

    round_id: int
    client_id: str


@dataclass(frozen=True)
class SubmissionRefused:
    """A Submit call was refused; ``code`` is the name the gRPC edge answers the refusal with
    (:data:`rpsagg_server.rpc.refusals.GRPC_STATUS`; the metrics count refusals by it)."""

    code: str
    message: str = ""


# -- rounds ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundOpened:
    """A round's row committed and the round was installed as the current one."""

    view: RoundView


@dataclass(frozen=True)
class RoundCollecting:
    """The round's first submission committed: its deadline runs."""

    view: RoundView


@dataclass(frozen=True)
class RoundProgress:
    """The current round's arrivals or missing clients changed (at most once per loop pass)."""

    view: RoundView


@dataclass(frozen=True)
class RoundClosed:
    """No more submissions: the round decodes (``why``: all submitted, deadline, recovered)."""

    view: RoundView
    why: str


@dataclass(frozen=True, eq=False)
class RoundDecoded:
    """The round finished with an estimate (its row and the next round's are durable).

    ``next_state`` is the task's global state after the round; ``job_done`` says whether it
    was the job's last round; ``estimate`` is what the decoded mean came from (its values
    are in the store and the engine's archive).
    """

    view: RoundView
    next_state: NDArray[np.float64]
    job_done: bool
    estimate: EstimateInfo | None = None


@dataclass(frozen=True)
class RoundFailed:
    """The round failed (``view.reason`` says why); ``job_failure`` is set when this failure
    ended the job (``--max-failed-rounds``)."""

    view: RoundView
    job_done: bool
    job_failure: str = ""


@dataclass(frozen=True, eq=False)
class RoundRecovered:
    """A round read back from the store at start-up (``current``: it resumes; ``estimate``:
    what a done round's estimate came from)."""

    view: RoundView
    current: bool
    estimate: EstimateInfo | None = None


# -- the job and its side computations ---------------------------------------------------------
@dataclass(frozen=True)
class JobUpdated:
    """The job's progress changed (steps done, done, failed, smoothed prior)."""

    job: JobView


@dataclass(frozen=True)
class BetaUpdated:
    """The start-up computation of beta changed state."""

    beta: BetaView


@dataclass(frozen=True)
class TaskMeasured:
    """The task's metrics after round ``round_id`` (0: the starting state)."""

    round_id: int
    metrics: TaskMetrics


@dataclass(frozen=True)
class TaskNoteChanged:
    """Why rounds have no task metrics ("" when the server measures the task)."""

    note: str


Event = (ClientJoined | SubmissionCommitted | SubmissionDuplicate | SubmissionRefused
         | RoundOpened | RoundCollecting | RoundProgress | RoundClosed | RoundDecoded
         | RoundFailed | RoundRecovered | JobUpdated | BetaUpdated | TaskMeasured
         | TaskNoteChanged)
#: events that carry a round view (the read model stores each)
ROUND_EVENTS = (RoundOpened, RoundCollecting, RoundProgress, RoundClosed, RoundDecoded,
                RoundFailed, RoundRecovered)
Subscriber = Callable[[Event], None]
Publish = Callable[[Event], None]


class EventBus:
    """Fans each published event out to every subscriber, synchronously, in order.

    A subscriber that raises is logged and skipped: an observer never fails the change it
    observes (the change is already made, and durable where it is stored).
    """

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, fn: Subscriber) -> None:
        """Call ``fn(event)`` for every later event."""
        self._subscribers.append(fn)

    def publish(self, event: Event) -> None:
        """Deliver ``event`` to every subscriber."""
        for fn in list(self._subscribers):
            try:
                fn(event)
            except Exception:
                log.exception("[Events] subscriber %r failed on %s", fn,
                              type(event).__name__)
