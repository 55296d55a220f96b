"""Per-client activity (``rpsagg_server.readmodel.activity.client_stats``) on hand-built rounds:
a round counts as missed only if it closed after the client joined; the straggler flag
follows the latest such round; bytes and last_seen come from the client's own arrivals."""

from __future__ import annotations

import pytest

from rpsagg_server.readmodel.activity import client_stats
from rpsagg_server.readmodel.state import Arrival, ClientView, RoundView

pytestmark = pytest.mark.unit


def round_view(rid: int, state: str, closed: float | None,
               arrivals: list[tuple[str, float, int]]) -> RoundView:
    return RoundView(
        round_id=rid, state=state, reason="", nonce=0, scheme="rand-k", transform="none",
        task_step=0, opened_at=0.0, first_submission_at=None, deadline_at=None,
        closed_at=closed, finished_at=closed, clients_expected=3,
        clients_arrived=tuple(c for c, _, _ in arrivals), clients_missing=(),
        payload_bytes=0, wire_bytes=0, raw_float32_bytes=0, decode_seconds=None, c=None,
        beta=None, r_hat=None, r_prior=None, eval_errors=None,
        arrivals=tuple(Arrival(c, t, w, w - 10) for c, t, w in arrivals))


def test_misses_count_only_rounds_closed_after_the_join() -> None:
    clients = [ClientView("b", 1, 15.0), ClientView("a", 0, 0.0)]
    rounds = [
        round_view(1, "done", 10.0, [("a", 5.0, 100)]),             # before b joined
        round_view(2, "failed", 20.0, [("a", 18.0, 100)]),          # b joined, missed it
        round_view(3, "done", 30.0, [("a", 25.0, 100), ("b", 26.0, 70)]),
        round_view(4, "done", 40.0, [("b", 35.0, 70)]),             # a misses the latest
        round_view(5, "collecting", None, [("a", 41.0, 100)]),      # open: not a miss yet
    ]
    got = {s.client_id: s for s in client_stats(clients, rounds)}
    assert [s.client_id for s in client_stats(clients, rounds)] == ["a", "b"]
    a, b = got["a"], got["b"]
    assert (a.rounds_contributed, a.rounds_missed, a.straggler) == (4, 1, True)
    assert (a.wire_bytes_sent, a.payload_bytes_sent, a.last_seen) == (400, 360, 41.0)
    assert (b.rounds_contributed, b.rounds_missed, b.straggler) == (2, 1, False)
    assert (b.wire_bytes_sent, b.payload_bytes_sent, b.last_seen) == (140, 120, 35.0)


def test_a_client_without_rounds_was_last_seen_at_its_join() -> None:
    (c,) = client_stats([ClientView("x", 0, 7.0)], [])
    assert (c.last_seen, c.rounds_contributed, c.rounds_missed, c.straggler) == (7.0, 0, 0,
                                                                                  False)
