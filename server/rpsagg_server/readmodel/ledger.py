"""The server's one metrics ledger: cumulative counters and the decode-time histogram.

:class:`MetricsLedger` subscribes to the domain events (:mod:`rpsagg_server.readmodel.events`) and
counts them since the process started. Everything that shows a count reads this ledger:
:meth:`ServerState.counters() <rpsagg_server.readmodel.state.ServerState.counters>` and the
Prometheus exposition (:mod:`rpsagg_server.http.metrics`, which renders it at scrape time), so the
two
always agree, whenever the dashboard app was started.

Counter keys (:meth:`MetricsLedger.counters`):

- ``"submissions_total:<outcome>"``: Submit calls by outcome, ``ok``, ``duplicate``, or the
  name the gRPC edge answers a refusal with (:data:`rpsagg_server.rpc.refusals.GRPC_STATUS`);
- ``"bytes_received_total:wire"``: serialized request bytes of accepted submissions (eval
  references excluded); ``"bytes_received_total:payload"``: their encoded payload (seed,
  values, indices);
- ``"rounds_total:<state>"``: rounds that entered each state (``open``, ``collecting``,
  ``decoding``, ``done``, ``failed``);
- ``"decode_seconds_sum"``, ``"decode_count"``: seconds of the decodes, and how many.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from rpsagg_server.readmodel.events import (
    Event,
    RoundClosed,
    RoundCollecting,
    RoundDecoded,
    RoundFailed,
    RoundOpened,
    SubmissionCommitted,
    SubmissionDuplicate,
    SubmissionRefused,
)
from rpsagg_wire.v1.messages import RoundState

#: upper bounds (seconds) of the decode-time histogram's buckets (``+Inf`` is implied)
DECODE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                  10.0, 30.0, 60.0)
_ROUND_STATE = {RoundOpened: RoundState.OPEN, RoundCollecting: RoundState.COLLECTING,
                RoundClosed: RoundState.DECODING, RoundDecoded: RoundState.DONE,
                RoundFailed: RoundState.FAILED}


class MetricsLedger:
    """Counts the domain events; subscribe :meth:`observe` to the event bus."""

    def __init__(self) -> None:
        self._counters: defaultdict[str, float] = defaultdict(float)
        self._buckets = [0] * (len(DECODE_BUCKETS) + 1)  # the last one is +Inf

    def observe(self, event: Event) -> None:
        """Count one event (called synchronously on the event loop)."""
        c = self._counters
        if isinstance(event, SubmissionCommitted):
            c["submissions_total:ok"] += 1
            c["bytes_received_total:wire"] += event.wire_bytes
            c["bytes_received_total:payload"] += event.payload_bytes
        elif isinstance(event, SubmissionDuplicate):
            c["submissions_total:duplicate"] += 1
        elif isinstance(event, SubmissionRefused):
            c[f"submissions_total:{event.code}"] += 1
        elif type(event) in _ROUND_STATE:
            c[f"rounds_total:{_ROUND_STATE[type(event)]}"] += 1
            if isinstance(event, RoundDecoded):
                seconds = event.view.decode_seconds or 0.0
                c["decode_seconds_sum"] += seconds
                c["decode_count"] += 1
                self._buckets[bisect.bisect_left(DECODE_BUCKETS, seconds)] += 1

    def counters(self) -> dict[str, float]:
        """The counters so far (see the module docstring for the keys)."""
        return dict(self._counters)

    def decode_histogram(self) -> tuple[list[tuple[float, int]], float, int]:
        """``(cumulative buckets as (upper bound, count) with +Inf last, sum, count)``."""
        out, total = [], 0
        for bound, n in zip((*DECODE_BUCKETS, float("inf")), self._buckets, strict=True):
            total += n
            out.append((bound, total))
        c = self._counters
        return out, c.get("decode_seconds_sum", 0.0), int(c.get("decode_count", 0))
