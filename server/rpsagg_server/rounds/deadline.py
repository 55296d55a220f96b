"""A round's deadline: its timer, and the settling wait after a stalled process.

The deadline starts with a round's first committed submission (``--round-timeout``). If its
timer fires late, the process was stalled (SIGSTOP, swapping) and requests that reached the
server before the deadline may still wait in gRPC's queues: the round keeps admitting until
no submission has arrived for :data:`SETTLE_QUIET` seconds (at most :data:`SETTLE_MAX`),
then closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from rpsagg_server.rounds.liveround import LiveRound
from rpsagg_wire.v1.messages import RoundState

log = logging.getLogger("rpsagg.server")
#: a timer this late (seconds) means the process was stalled
STALL_SLACK = 0.2
SETTLE_QUIET = 0.5
SETTLE_MAX = 10.0


def arm(live: LiveRound, fire: Callable[[], None]) -> None:
    """Call ``fire()`` on the event loop at ``live.deadline`` (unix seconds)."""
    assert live.deadline is not None
    delay = max(0.0, live.deadline - time.time())
    live.timer = asyncio.get_running_loop().call_later(delay, fire)


async def settle(live: LiveRound, last_arrival: Callable[[], float]) -> None:
    """After the timer fired: return at once when it fired in time, else once arrivals are
    quiet. ``last_arrival()`` is the loop time of the newest Submit."""
    assert live.deadline is not None
    late = time.time() - live.deadline
    if late <= STALL_SLACK or live.state != RoundState.COLLECTING:
        return
    loop = asyncio.get_running_loop()
    fired = loop.time()
    log.warning("[Engine] round %d: deadline timer %.1fs late (stalled); admitting "
                "submissions already received", live.round_id, late)
    while loop.time() < fired + SETTLE_MAX:
        quiet = loop.time() - max(fired, last_arrival())
        if quiet >= SETTLE_QUIET:
            break
        await asyncio.sleep(SETTLE_QUIET - quiet)
