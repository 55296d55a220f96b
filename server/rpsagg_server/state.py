"""Read-only view of a running server, for the dashboard and the metrics layer.

The round engine (:mod:`rpsagg_server.rounds`) is the only writer; everything here is
read through :class:`ServerState`, which lives in the same process and event loop as the
``grpc.aio`` server (the intended deployment serves the FastAPI dashboard with uvicorn on
that loop: ``rpsagg_server.server.serve(config, http_app_factory=create_app)`` calls
``http_app_factory(state)`` and serves the returned ASGI app on ``--http-port``).

Read API (all methods are cheap, synchronous, and return frozen snapshots):

- :meth:`ServerState.config` -- the server's :class:`~rpsagg_server.config.ServerConfig`
  as a plain dict, without file paths (booleans tls, mtls, tokens, persistent_db instead).
- :meth:`ServerState.uptime_seconds`, :attr:`ServerState.started_at` (unix seconds).
- :meth:`ServerState.current_round` -- :class:`RoundView` of the open/collecting/decoding
  round, or None (before the first round and after the job is done).
- :meth:`ServerState.rounds` -- :class:`RoundView` list, newest first (``limit``/``offset``).
- :meth:`ServerState.round_detail` -- one :class:`RoundView` by id (None if unknown).
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
- :meth:`ServerState.counters` -- cumulative metric counters (see below) as a dict.
- :meth:`ServerState.readiness` -- readiness checks by name (``database``, ``grpc``,
  ``beta``) and
  whether each passes now (registered by the server with ``_add_check``).
- :meth:`ServerState.add_listener` -- ``fn(event: MetricEvent)`` is called synchronously on
  the event loop for every metric event (keep it fast; for Prometheus, increment there).

Metric events (:class:`MetricEvent` ``kind`` values):

- ``"submission"`` with ``label`` = outcome: ``ok``, ``duplicate``, or the gRPC status name
  of a rejection (``INVALID_ARGUMENT``, ``UNAUTHENTICATED``, ``ALREADY_EXISTS``, ...).
- ``"bytes_received"`` with ``value`` = wire bytes of an accepted submission message and
  ``label`` = ``"wire"``; plus ``label="payload"`` with the encoded payload (seed, values,
  indices; reference vectors excluded).
- ``"round_state"`` with ``label`` = the state a round entered (``open``, ``collecting``,
  ``decoding``, ``done``, ``failed``).
- ``"decode_seconds"`` with ``value`` = seconds of one decode.

:meth:`ServerState.counters` keys: ``submissions_total{outcome}`` as
``"submissions_total:<outcome>"``, ``"bytes_received_total:wire"``,
``"bytes_received_total:payload"``, ``"rounds_total:<state>"``, ``"decode_seconds_sum"``,
``"decode_count"``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rpsagg_server.activity import ClientStats, client_stats

ROUND_STATES = ("open", "collecting", "decoding", "done", "failed")


@dataclass(frozen=True)
class EvalErrors:
    """Evaluation-mode squared errors of one round (summed over the m vectors).

    Attributes
    ----------
    estimate : float
        ``||x_hat - x_bar||^2`` of the round's estimator.
    rand_k : float
        What Rand-k would have had on the same vectors and seeds.
    rand_k_spatial : float
        What Rand-k-Spatial(avg) would have had.
    truth_sq_norm : float or None
        ``||x_bar||^2`` (summed over the m vectors): relative errors are the squared errors
        divided by it. None for rounds stored before it was recorded.
    """

    estimate: float
    rand_k: float
    rand_k_spatial: float
    truth_sq_norm: float | None = None

    def relative(self) -> tuple[float, float, float] | None:
        """The three squared errors divided by ``||x_bar||^2`` (None when it is unknown or 0)."""
        t = self.truth_sq_norm
        if t is None or not t > 0:
            return None
        return self.estimate / t, self.rand_k / t, self.rand_k_spatial / t


@dataclass(frozen=True)
class Arrival:
    """One accepted submission of a round: who, when (unix seconds) and how many bytes."""

    client_id: str
    received_at: float
    wire_bytes: int
    payload_bytes: int


@dataclass(frozen=True)
class RoundView:
    """Snapshot of one round.

    Attributes
    ----------
    round_id, state, reason : int, str, str
        ``state`` is one of :data:`ROUND_STATES`; ``reason`` explains ``failed``.
    nonce : int
        The round nonce mixed into every transform seed.
    scheme, transform : str
        Estimator name and the transform label used (or planned) at decode.
    task_step : int
        Completed task iterations before this round.
    opened_at, first_submission_at, deadline_at, closed_at, finished_at : float or None
        Unix seconds (``deadline_at`` is None while the deadline is not running).
    clients_expected : int
        n.
    clients_arrived, clients_missing : tuple of str
        Client ids that submitted / that joined but have not submitted.
    payload_bytes : int
        Encoded payload received: 8-byte seed + 4 bytes per value and per index.
    wire_bytes : int
        Serialized gRPC request bytes of the accepted submissions (excluding eval references).
    raw_float32_bytes : int
        What sending the vectors uncompressed would cost: ``arrived * m * d * 4``.
    decode_seconds : float or None
    c, beta : float or None
        Transform coefficient and unbiasing scalar used.
    r_hat : float or None
        This round's correlation estimate from the sketches.
    r_prior : float or None
        The prior R the transform used (``transform=auto``).
    eval_errors : EvalErrors or None
        Evaluation mode only.
    arrivals : tuple of Arrival
        Every accepted submission, in client-index order (empty for rounds finished before
        a restart by a version that did not store them).
    """

    round_id: int
    state: str
    reason: str
    nonce: int
    scheme: str
    transform: str
    task_step: int
    opened_at: float
    first_submission_at: float | None
    deadline_at: float | None
    closed_at: float | None
    finished_at: float | None
    clients_expected: int
    clients_arrived: tuple[str, ...]
    clients_missing: tuple[str, ...]
    payload_bytes: int
    wire_bytes: int
    raw_float32_bytes: int
    decode_seconds: float | None
    c: float | None
    beta: float | None
    r_hat: float | None
    r_prior: float | None
    eval_errors: EvalErrors | None
    arrivals: tuple[Arrival, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (tuples become lists, eval errors a nested dict)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["clients_arrived"] = list(self.clients_arrived)
        out["clients_missing"] = list(self.clients_missing)
        ev = self.eval_errors
        out["eval_errors"] = None if ev is None else {
            "estimate": ev.estimate, "rand_k": ev.rand_k, "rand_k_spatial": ev.rand_k_spatial,
            "truth_sq_norm": ev.truth_sq_norm,
        }
        out["arrivals"] = [vars(a).copy() for a in self.arrivals]
        return out


@dataclass(frozen=True)
class ClientView:
    """A joined client: id, index (its data shard) and when it joined (unix seconds)."""

    client_id: str
    index: int
    joined_at: float


@dataclass(frozen=True)
class TaskMetrics:
    """The task's progress measured on the global state after a round.

    Attributes
    ----------
    name : str
        What ``value`` is (e.g. ``"Rayleigh quotient"``, ``"k-means objective"``).
    value : float
        The task's own metric (``Task.metric``) averaged over the n clients' shards.
    optimum : float or None
        The best value where the server knows it (power iteration: the top eigenvalue).
    eigenvector_distance : float or None
        Power iteration: ``sin`` of the angle between the iterate and the top eigenvector
        (0 when converged, 1 when orthogonal).
    """

    name: str
    value: float
    optimum: float | None = None
    eigenvector_distance: float | None = None


@dataclass(frozen=True)
class JobView:
    """Progress of the server's task.

    Attributes
    ----------
    task : str
    steps_done : int
        Rounds that finished with an estimate (task iterations taken).
    rounds_planned : int
        ``--rounds``.
    done : bool
    r_hat_smoothed : float or None
        The smoothed correlation prior (``transform=auto``), in units of R for n clients.
    failure : str
        Why the job ended without finishing its rounds (``--max-failed-rounds``
        consecutive failed rounds); empty while it runs and when it finished.
    """

    task: str
    steps_done: int
    rounds_planned: int
    done: bool
    r_hat_smoothed: float | None
    failure: str = ""

    @property
    def state(self) -> str:
        """``running``, ``done`` or ``failed``."""
        return "failed" if self.failure else "done" if self.done else "running"


BETA_STATES = ("computing", "ready", "failed", "not needed")


@dataclass(frozen=True)
class BetaView:
    """The start-up computation of beta for n (the first decode waits for it).

    Attributes
    ----------
    state : str
        One of :data:`BETA_STATES` (``not needed`` when the job was already done).
    n : int
    started_at : float
        Unix seconds.
    seconds : float or None
        How long it took, once finished.
    value : float or None
        beta, once ready.
    error : str
        Why it failed.
    """

    state: str
    n: int
    started_at: float
    seconds: float | None = None
    value: float | None = None
    error: str = ""


@dataclass(frozen=True)
class MetricEvent:
    """One metric event; see the module docstring for the kinds and labels."""

    kind: str
    label: str = ""
    value: float = 1.0


Listener = Callable[[MetricEvent], None]


@dataclass
class ServerState:
    """Snapshots of a server's configuration, rounds, clients and counters.

    Written only by the round engine (methods starting with ``_``); read by anyone.
    """

    config_dict: dict[str, Any]
    started_at: float = field(default_factory=time.time)
    _rounds: dict[int, RoundView] = field(default_factory=dict)
    _current: int | None = None
    _clients: dict[str, ClientView] = field(default_factory=dict)
    _job: JobView | None = None
    _beta: BetaView | None = None
    _counters: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    _listeners: list[Listener] = field(default_factory=list)
    _checks: dict[str, Callable[[], bool]] = field(default_factory=dict)
    _task_metrics: dict[int, TaskMetrics] = field(default_factory=dict)
    _task_note: str = "evaluation mode is off: the server measures the task only with --eval"

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
        """Cumulative counters since this process started (see module docstring)."""
        return dict(self._counters)

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(event)`` for every future metric event."""
        self._listeners.append(fn)

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

    # -- written by the engine -------------------------------------------------------------
    def _emit(self, kind: str, label: str = "", value: float = 1.0) -> None:
        if kind == "submission":
            self._counters[f"submissions_total:{label}"] += 1
        elif kind == "bytes_received":
            self._counters[f"bytes_received_total:{label}"] += value
        elif kind == "round_state":
            self._counters[f"rounds_total:{label}"] += 1
        elif kind == "decode_seconds":
            self._counters["decode_seconds_sum"] += value
            self._counters["decode_count"] += 1
        event = MetricEvent(kind, label, value)
        for fn in list(self._listeners):
            fn(event)

    def _put_round(self, view: RoundView, *, current: bool, emit: bool = True) -> None:
        old = self._rounds.get(view.round_id)
        self._rounds[view.round_id] = view
        if current:
            self._current = view.round_id
        elif self._current == view.round_id:
            self._current = None
        if emit and (old is None or old.state != view.state):
            self._emit("round_state", view.state)

    def _update_round(self, round_id: int, **changes: Any) -> RoundView:
        view = replace(self._rounds[round_id], **changes)
        self._put_round(view, current=view.state in ("open", "collecting", "decoding"))
        return view

    def _put_client(self, client: ClientView) -> None:
        self._clients[client.client_id] = client

    def _set_task_metrics(self, round_id: int, metrics: TaskMetrics) -> None:
        self._task_metrics[round_id] = metrics

    def _set_task_note(self, note: str) -> None:
        self._task_note = note

    def _set_job(self, job: JobView) -> None:
        self._job = job

    def _set_beta(self, beta: BetaView) -> None:
        self._beta = beta

    def _add_check(self, name: str, check: Callable[[], bool]) -> None:
        self._checks[name] = check
