"""Per-client activity derived from the rounds (the dashboard's clients view).

Nothing here is stored: contributions, misses, bytes and the straggler flag follow from
each round's arrivals and timestamps, so they are the same after a restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rpsagg_wire.v1.messages import FINISHED

if TYPE_CHECKING:
    from rpsagg_server.readmodel.views import ClientView, RoundView


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
    """Each client's :class:`ClientStats`, in index order.

    One pass over the rounds: O(rounds x (arrivals + clients)).
    """
    ordered = sorted(clients, key=lambda c: c.index)
    last_seen = {c.client_id: c.joined_at for c in ordered}
    contributed = dict.fromkeys(last_seen, 0)
    missed = dict.fromkeys(last_seen, 0)
    wire = dict.fromkeys(last_seen, 0)
    payload = dict.fromkeys(last_seen, 0)
    straggler = dict.fromkeys(last_seen, False)
    for r in sorted(rounds, key=lambda r: r.round_id):
        arrived = set(r.clients_arrived)
        for cid in arrived & last_seen.keys():
            contributed[cid] += 1
        for a in r.arrivals:
            if a.client_id in last_seen:
                last_seen[a.client_id] = max(last_seen[a.client_id], a.received_at)
                wire[a.client_id] += a.wire_bytes
                payload[a.client_id] += a.payload_bytes
        closed = r.closed_at if r.closed_at is not None else r.finished_at
        if r.state in FINISHED and closed is not None:
            for c in ordered:
                if closed >= c.joined_at:  # the round was open to it
                    absent = c.client_id not in arrived
                    missed[c.client_id] += absent
                    straggler[c.client_id] = absent
    return [ClientStats(c.client_id, c.index, c.joined_at, last_seen[c.client_id],
                        contributed[c.client_id], missed[c.client_id], wire[c.client_id],
                        payload[c.client_id], straggler[c.client_id]) for c in ordered]
