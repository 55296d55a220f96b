"""Prometheus metrics of a server, bound to an injected ``CollectorRegistry``.

Everything is read at scrape time, so nothing can go stale or disagree with the server:
the counters and the decode histogram from the server's one metrics ledger
(:class:`~rpsagg_server.readmodel.ledger.MetricsLedger`, which counts the domain events since the
process started, whenever this app was created), the gauges from the read model.

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
``rpsagg_round_estimated_squared_error``  gauge   every mode: the squared error of the
                                                  latest finished round estimated from its
                                                  messages alone (summed over the m vectors)
``rpsagg_round_estimated_squared_error_stderr``   its standard error (gauge)
``rpsagg_round_estimated_relative_error``  gauge  every mode: the same divided by the
                                                  estimated ``||x_bar||^2``
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

Served by ``rpsagg-server`` (not by an app built alone), from
:class:`~rpsagg_server.http.connections.ConnectionsCollector`: ``rpsagg_http_connections_open``
and ``rpsagg_http_connections_max`` (gauges), ``rpsagg_http_connections_refused_total`` and
``rpsagg_http_requests_timed_out_total`` (counters).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from rpsagg_server.domain.jobstate import DEFAULT_JOB_STATES
from rpsagg_server.readmodel.ledger import DECODE_BUCKETS
from rpsagg_server.readmodel.state import ROUND_STATES, ServerState
from rpsagg_wire.v1.messages import RoundState

SERIES = ("estimate", "rand_k", "rand_k_spatial")
__all__ = ["DECODE_BUCKETS", "LedgerCollector", "ServerMetrics", "StateCollector"]


class ServerMetrics:
    """The server's Prometheus metrics, registered in ``registry``.

    Parameters
    ----------
    state : ServerState
        The server to observe (its read model and its metrics ledger).
    registry : CollectorRegistry
        Where the metrics are registered (the app serves exactly this registry); registering
        a second app's metrics in the same registry raises ``ValueError``.
    """

    def __init__(self, state: ServerState, registry: CollectorRegistry) -> None:
        self.state = state
        self.registry = registry
        registry.register(LedgerCollector(state))
        registry.register(StateCollector(state))


class LedgerCollector(Collector):
    """The counters and the decode histogram, read from the metrics ledger."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def describe(self) -> Iterable[Metric]:
        """The families (their names make a registry refuse a second copy)."""
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        """Yield ``rpsagg_submissions_total{status}``, ``rpsagg_bytes_received_total``,
        ``rpsagg_payload_bytes_received_total``, ``rpsagg_rounds_total{state}`` and
        ``rpsagg_decode_seconds``."""
        ledger = self.state.ledger
        counters = ledger.counters()
        submissions = CounterMetricFamily(
            "rpsagg_submissions", "Submissions by outcome (ok, duplicate, or the gRPC status "
            "name of a rejection).", labels=["status"])
        rounds = CounterMetricFamily(
            "rpsagg_rounds", "Rounds that entered each state.", labels=["state"])
        statuses = {"ok": 0.0, "duplicate": 0.0}
        states: dict[str, float] = dict.fromkeys(ROUND_STATES, 0.0)
        for key, value in counters.items():
            name, _, label = key.partition(":")
            if name == "submissions_total":
                statuses[label] = value
            elif name == "rounds_total":
                states[label] = value
        for status, value in statuses.items():
            submissions.add_metric([status], value)
        for st, value in states.items():
            rounds.add_metric([st], value)
        wire = CounterMetricFamily(
            "rpsagg_bytes_received", "Serialized gRPC request bytes of accepted submissions "
            "(evaluation-mode reference vectors excluded).",
            value=counters.get("bytes_received_total:wire", 0.0))
        payload = CounterMetricFamily(
            "rpsagg_payload_bytes_received", "Encoded payload bytes of accepted submissions "
            "(8-byte seed + 4 bytes per value and index).",
            value=counters.get("bytes_received_total:payload", 0.0))
        buckets, total, _ = ledger.decode_histogram()
        decode = HistogramMetricFamily(
            "rpsagg_decode_seconds", "Wall-clock seconds of one round's decode.",
            buckets=[(floatToGoString(b), n) for b, n in buckets], sum_value=total)
        return [submissions, wire, payload, rounds, decode]


class StateCollector(Collector):
    """Gauges read from the state at scrape time."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def collect(self) -> Iterable[Metric]:
        """Yield ``rpsagg_clients_connected``, ``rpsagg_current_round``,
        ``rpsagg_job_state``, the estimated errors and, in evaluation mode,
        ``rpsagg_round_squared_error``, ``rpsagg_round_relative_error`` and the task
        gauges."""
        yield from self._progress()
        yield from self._round_errors()
        yield from self._task()

    def _progress(self) -> Iterator[Metric]:
        """``rpsagg_clients_connected``, ``rpsagg_current_round`` and ``rpsagg_job_state``."""
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
        for js in DEFAULT_JOB_STATES:
            job_state.add_metric([js], float(job is not None and job.state == js))
        yield job_state

    def _round_errors(self) -> Iterator[Metric]:
        """The latest finished round's errors: measured (evaluation mode) and estimated."""
        errors = GaugeMetricFamily(
            "rpsagg_round_squared_error", "Evaluation mode: squared error of the latest "
            "finished round, of the estimate and of the Rand-k / Rand-k-Spatial shadows.",
            labels=["series"])
        relative = GaugeMetricFamily(
            "rpsagg_round_relative_error", "Evaluation mode: squared error over ||x_bar||^2 "
            "of the latest finished round, of the estimate and of the Rand-k / "
            "Rand-k-Spatial shadows.", labels=["series"])
        est_sq = GaugeMetricFamily(
            "rpsagg_round_estimated_squared_error", "Squared error of the latest finished "
            "round estimated from its messages alone (every mode; summed over the m vectors).")
        est_se = GaugeMetricFamily(
            "rpsagg_round_estimated_squared_error_stderr", "Standard error of "
            "rpsagg_round_estimated_squared_error.")
        est_rel = GaugeMetricFamily(
            "rpsagg_round_estimated_relative_error", "Estimated squared error over the "
            "estimated ||x_bar||^2 of the latest finished round (every mode).")
        for view in self.state.rounds():
            if view.state != RoundState.DONE:
                continue
            est = view.estimated_error
            if est is not None:
                est_sq.add_metric([], est.squared_error)
                est_se.add_metric([], est.squared_error_stderr)
                est_rel.add_metric([], est.relative_error)
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
        yield est_sq
        yield est_se
        yield est_rel

    def _task(self) -> Iterator[Metric]:
        """The task's gauges after the latest measured round (evaluation mode)."""
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
