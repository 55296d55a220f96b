"""Per-client activity derived from the rounds (the dashboard's clients view).

Nothing here is stored: contributions, misses, bytes and the straggler flag follow from
each round's arrivals and timestamps, so they are the same after a restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rpsagg_server.state import ClientView, RoundView


@dataclass(frozen=True)
class ClientStats:
    """What one client did, derived from the rounds the server knows.

    Attributes
    ----------
    client_id, index, joined_at : str, int, float
    last_seen : float
        Unix seconds of its latest accepted submission (its join when it has none).
    rounds_contributed : int
        Rounds with an accepted submission of this client.
    rounds_missed : int
        Finished rounds (done or failed) that closed after it joined without its submission.
    wire_bytes_sent, payload_bytes_sent : int
        Sum over its accepted submissions (serialized request; seed + values + indices).
    straggler : bool
        It missed the latest finished round that closed after it joined.
    """

    client_id: str
    index: int
    joined_at: float
    last_seen: float
    rounds_contributed: int
    rounds_missed: int
    wire_bytes_sent: int
    payload_bytes_sent: int
    straggler: bool


def client_stats(clients: Sequence[ClientView], rounds: Sequence[RoundView]) -> list[ClientStats]:
    """Each client's :class:`ClientStats`, in index order."""
    rounds = sorted(rounds, key=lambda r: r.round_id)
    out = []
    for c in sorted(clients, key=lambda c: c.index):
        last_seen, contributed, missed = c.joined_at, 0, 0
        wire = payload = 0
        straggler = False
        for r in rounds:
            mine = [a for a in r.arrivals if a.client_id == c.client_id]
            if c.client_id in r.clients_arrived:
                contributed += 1
                for a in mine:
                    last_seen = max(last_seen, a.received_at)
                    wire += a.wire_bytes
                    payload += a.payload_bytes
            if r.state in ("done", "failed"):
                closed = r.closed_at if r.closed_at is not None else r.finished_at
                if closed is not None and closed >= c.joined_at:
                    absent = c.client_id not in r.clients_arrived
                    missed += absent
                    straggler = absent
        out.append(ClientStats(c.client_id, c.index, c.joined_at, last_seen, contributed,
                               missed, wire, payload, straggler))
    return out
