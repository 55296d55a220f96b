"""Prometheus metrics of a server, bound to an injected ``CollectorRegistry``.

Counters and the decode histogram are driven by the state's metric events
(:meth:`~rpsagg_server.state.ServerState.add_listener`); gauges are read from the state at
scrape time by a custom collector, so they can never go stale.

=====================================  =========  ==========================================
metric                                 type       meaning
=====================================  =========  ==========================================
``rpsagg_submissions_total{status}``   counter    submissions by outcome: ``ok``,
                                                  ``duplicate`` or the gRPC status name of a
                                                  rejection
``rpsagg_bytes_received_total``        counter    serialized gRPC bytes of accepted
                                                  submissions (eval references excluded)
``rpsagg_payload_bytes_received_total``  counter  encoded payload of accepted submissions
``rpsagg_rounds_total{state}``         counter    rounds entering each state
``rpsagg_decode_seconds``              histogram  wall-clock seconds of one round's decode
``rpsagg_round_squared_error{series}``  gauge     evaluation mode: squared error of the
                                                  latest finished round; ``series`` is
                                                  ``estimate``, ``rand_k`` or
                                                  ``rand_k_spatial``
``rpsagg_round_relative_error{series}``  gauge     evaluation mode: the same divided by
                                                  ``||x_bar||^2`` of that round
``rpsagg_task_metric``                 gauge      evaluation mode: the task's metric after
                                                  the latest measured round (Rayleigh
                                                  quotient, k-means objective, loss)
``rpsagg_task_eigenvector_distance``   gauge      power iteration: sin of the angle to the
                                                  top eigenvector after that round
``rpsagg_clients_connected``           gauge      clients that joined the job
``rpsagg_current_round``               gauge      id of the newest round (0 before the first)
``rpsagg_job_state{state}``            gauge      1 for the job's state, ``running``,
                                                  ``done`` or ``failed``
                                                  (``--max-failed-rounds``), 0 for the others
=====================================  =========  ==========================================
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rpsagg_server.state import ROUND_STATES, MetricEvent, ServerState

JOB_STATES = ("running", "done", "failed")

DECODE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                  10.0, 30.0, 60.0)
SERIES = ("estimate", "rand_k", "rand_k_spatial")


class ServerMetrics:
    """The server's Prometheus metrics, registered in ``registry``.

    Parameters
    ----------
    state : ServerState
        The server to observe.
    registry : CollectorRegistry
        Where the metrics are registered (the app serves exactly this registry).

    Notes
    -----
    Nothing is counted until :meth:`attach`; it first adds whatever the state counted
    before (``state.counters()``) so the counters agree with the state whenever the app
    starts. The decode histogram cannot be back-filled bucket by bucket and starts empty.
    """

    def __init__(self, state: ServerState, registry: CollectorRegistry) -> None:
        self.state = state
        self.registry = registry
        self.submissions = Counter(
            "rpsagg_submissions", "Submissions by outcome (ok, duplicate, or the gRPC status "
            "name of a rejection).", ["status"], registry=registry)
        self.bytes_received = Counter(
            "rpsagg_bytes_received", "Serialized gRPC request bytes of accepted submissions "
            "(evaluation-mode reference vectors excluded).", registry=registry)
        self.payload_bytes_received = Counter(
            "rpsagg_payload_bytes_received", "Encoded payload bytes of accepted submissions "
            "(8-byte seed + 4 bytes per value and index).", registry=registry)
        self.rounds = Counter(
            "rpsagg_rounds", "Rounds that entered each state.", ["state"], registry=registry)
        self.decode_seconds = Histogram(
            "rpsagg_decode_seconds", "Wall-clock seconds of one round's decode.",
            buckets=DECODE_BUCKETS, registry=registry)
        for outcome in ("ok", "duplicate"):
            self.submissions.labels(status=outcome)
        for st in ROUND_STATES:
            self.rounds.labels(state=st)
        registry.register(StateCollector(state))
        self._attached = False
        self._listening = False

    def attach(self) -> None:
        """Add the state's counts so far, then follow its metric events (idempotent)."""
        if self._listening:
            self._attached = True
            return
        for key, value in self.state.counters().items():
            name, _, label = key.partition(":")
            if name == "submissions_total":
                self.submissions.labels(status=label).inc(value)
            elif key == "bytes_received_total:wire":
                self.bytes_received.inc(value)
            elif key == "bytes_received_total:payload":
                self.payload_bytes_received.inc(value)
            elif name == "rounds_total":
                self.rounds.labels(state=label).inc(value)
        self._attached = self._listening = True
        self.state.add_listener(self.observe)

    def detach(self) -> None:
        """Stop counting events (the state has no way to remove a listener)."""
        self._attached = False

    def observe(self, event: MetricEvent) -> None:
        """Apply one metric event (called synchronously on the server's event loop)."""
        if not self._attached:
            return
        if event.kind == "submission":
            self.submissions.labels(status=event.label).inc()
        elif event.kind == "bytes_received":
            if event.label == "wire":
                self.bytes_received.inc(event.value)
            elif event.label == "payload":
                self.payload_bytes_received.inc(event.value)
        elif event.kind == "round_state":
            self.rounds.labels(state=event.label).inc()
        elif event.kind == "decode_seconds":
            self.decode_seconds.observe(event.value)


class StateCollector(Collector):
    """Gauges read from the state at scrape time."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def collect(self) -> Iterable[Metric]:
        """Yield ``rpsagg_clients_connected``, ``rpsagg_current_round``,
        ``rpsagg_job_state`` and, in evaluation mode, ``rpsagg_round_squared_error``,
        ``rpsagg_round_relative_error`` and the task gauges."""
        clients = GaugeMetricFamily("rpsagg_clients_connected",
                                    "Clients that joined the job.")
        clients.add_metric([], len(self.state.clients()))
        yield clients
        newest = self.state.rounds(limit=1)
        current = GaugeMetricFamily("rpsagg_current_round",
                                    "Id of the newest round (0 before the first).")
        current.add_metric([], newest[0].round_id if newest else 0)
        yield current
        job = self.state.job()
        job_state = GaugeMetricFamily(
            "rpsagg_job_state", "1 for the job's state (running, done, or failed after "
            "--max-failed-rounds consecutive failed rounds), 0 for the others.",
            labels=["state"])
        for name in JOB_STATES:
            job_state.add_metric([name], float(job is not None and job.state == name))
        yield job_state
        errors = GaugeMetricFamily(
            "rpsagg_round_squared_error", "Evaluation mode: squared error of the latest "
            "finished round, of the estimate and of the Rand-k / Rand-k-Spatial shadows.",
            labels=["series"])
        relative = GaugeMetricFamily(
            "rpsagg_round_relative_error", "Evaluation mode: squared error over ||x_bar||^2 "
            "of the latest finished round, of the estimate and of the Rand-k / "
            "Rand-k-Spatial shadows.", labels=["series"])
        for view in self.state.rounds():
            if view.state != "done":
                continue
            ev = view.eval_errors
            if ev is not None:
                for name, value in zip(SERIES, (ev.estimate, ev.rand_k, ev.rand_k_spatial),
                                       strict=True):
                    errors.add_metric([name], value)
                rel = ev.relative()
                for name, value in zip(SERIES, rel or (), strict=False):
                    relative.add_metric([name], value)
            break
        yield errors
        yield relative
        task = GaugeMetricFamily(
            "rpsagg_task_metric", "Evaluation mode: the task's metric (Rayleigh quotient, "
            "k-means objective, regression loss) after the latest measured round.")
        distance = GaugeMetricFamily(
            "rpsagg_task_eigenvector_distance", "Power iteration: sin of the angle between "
            "the iterate after the latest measured round and the top eigenvector.")
        for view in self.state.rounds():
            tm = self.state.task_metrics(view.round_id)
            if tm is not None:
                task.add_metric([], tm.value)
                if tm.eigenvector_distance is not None:
                    distance.add_metric([], tm.eigenvector_distance)
                break
        yield task
        yield distance
