"""The domain-event bus and the metrics ledger that subscribes to it (no server)."""

from __future__ import annotations

import logging

import pytest

from rpsagg_server.readmodel.events import (
    ClientJoined,
    Event,
    EventBus,
    RoundDecoded,
    SubmissionCommitted,
    SubmissionDuplicate,
    SubmissionRefused,
)
from rpsagg_server.readmodel.ledger import DECODE_BUCKETS, MetricsLedger
from rpsagg_server.readmodel.state import ServerState
from rpsagg_server.readmodel.views import ClientView, RoundView

pytestmark = pytest.mark.unit


def _view(round_id: int, state: str, seconds: float | None) -> RoundView:
    return RoundView(
        round_id=round_id, state=state, reason="", nonce=1, scheme="rand-k", transform="none",
        task_step=0, opened_at=0.0, first_submission_at=None, deadline_at=None,
        closed_at=None, finished_at=None, clients_expected=2, clients_arrived=(),
        clients_missing=(), payload_bytes=0, wire_bytes=0, raw_float32_bytes=0,
        decode_seconds=seconds, c=None, beta=None, r_hat=None, r_prior=None,
        eval_errors=None)


def test_a_failing_subscriber_does_not_keep_the_event_from_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()
    seen: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("observer bug")

    bus.subscribe(broken)
    bus.subscribe(seen.append)
    event = ClientJoined(ClientView("c0", 0, 1.0))
    with caplog.at_level(logging.ERROR, logger="rpsagg.server"):
        bus.publish(event)
    assert seen == [event]
    assert "observer bug" in caplog.text


def test_the_ledger_counts_submissions_bytes_and_decodes() -> None:
    import numpy as np

    ledger = MetricsLedger()
    bus = EventBus()
    bus.subscribe(ledger.observe)
    bus.publish(SubmissionCommitted(1, "c0", wire_bytes=100, payload_bytes=60))
    bus.publish(SubmissionCommitted(1, "c1", wire_bytes=90, payload_bytes=50))
    bus.publish(SubmissionDuplicate(1, "c0"))
    bus.publish(SubmissionRefused("INVALID_ARGUMENT", "bad"))
    # 0.001 lies on a bucket's bound (le is inclusive), 0.3 between 0.25 and 0.5, 100 > 60
    for rid, seconds in enumerate((0.001, 0.3, 100.0), start=1):
        bus.publish(RoundDecoded(_view(rid, "done", seconds), np.zeros(2), job_done=False))
    c = ledger.counters()
    assert c["submissions_total:ok"] == 2
    assert c["submissions_total:duplicate"] == 1
    assert c["submissions_total:INVALID_ARGUMENT"] == 1
    assert c["bytes_received_total:wire"] == 190
    assert c["bytes_received_total:payload"] == 110
    assert c["rounds_total:done"] == 3
    buckets, total, count = ledger.decode_histogram()
    assert count == 3 and total == pytest.approx(100.301)
    cumulative = dict(buckets)
    assert cumulative[0.001] == 1 and cumulative[0.25] == 1
    assert cumulative[0.5] == 2 and cumulative[DECODE_BUCKETS[-1]] == 2
    assert cumulative[float("inf")] == 3


def test_the_read_model_follows_round_events() -> None:
    import numpy as np

    from rpsagg_server.readmodel.events import RoundOpened

    state = ServerState({})
    state.apply(RoundOpened(_view(1, "open", None)))
    current = state.current_round()
    assert current is not None and current.round_id == 1
    state.apply(RoundDecoded(_view(1, "done", 0.5), np.zeros(2), job_done=True))
    assert state.current_round() is None
    assert [v.state for v in state.rounds()] == ["done"]
