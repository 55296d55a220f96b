"""A round in memory: the engine's mutable record of one round, and a finished round's
arrays.

Its row in the store is :mod:`rpsagg_server.rounds.rowcodec`'s; its dashboard view is
:mod:`rpsagg_server.rounds.roundview`'s; the checks of a submission are
:mod:`rpsagg_server.rounds.requestchecks`'.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rpsagg import Estimator
from rpsagg_server.decode.decoding import DecodeOutcome
from rpsagg_server.readmodel.views import Arrival
from rpsagg_server.rounds.planner import RoundChoice
from rpsagg_server.store.rowinfo import ArchivedSummary
from rpsagg_wire.v1.messages import FINISHED, RoundState
from rpsagg_wire.v1.serde import Submission

FloatArray = NDArray[np.float64]


def transform_label(est: Estimator) -> str:
    """The label of an estimator's transform (``"none"`` for a scheme without one)."""
    tr = getattr(est, "transform", None)
    return "none" if tr is None else str(tr.label())


@dataclass(frozen=True, eq=False)
class RoundArrays:
    """A finished round's arrays: what it costs in memory at large d.

    Attributes
    ----------
    estimate : ndarray, shape (m, d), or None
        A done round's decoded mean (None for a failed round).
    state : ndarray or None
        The task's global state GetResult answers with: after a done round (None in rows
        of a version that did not store it: the ``next_state`` column is empty), or the one
        a failed round started from.
    """

    estimate: FloatArray | None
    state: FloatArray | None

    @property
    def nbytes(self) -> int:
        """Bytes of the two arrays (an array shared by both counted once)."""
        a = 0 if self.estimate is None else self.estimate.nbytes
        b = 0 if self.state is None or self.state is self.estimate else self.state.nbytes
        return a + b


@dataclass(eq=False)
class LiveRound:
    """Mutable round record owned by the engine."""

    round_id: int
    nonce: int
    task_step: int
    transform: str
    r_prior: float | None
    global_state: FloatArray
    opened_at: float
    state: RoundState = RoundState.OPEN
    reason: str = ""
    first_at: float | None = None
    deadline: float | None = None
    closed_at: float | None = None
    finished_at: float | None = None
    next_state: FloatArray | None = None
    outcome: DecodeOutcome | None = None
    estimator: Estimator | None = None
    #: transform=auto: the prior of every vector slot (vector j is decoded with
    #: ``r_priors[j]``; ``r_prior`` is vector 0's); None: every vector uses ``estimator``
    r_priors: tuple[float | None, ...] | None = None
    #: the values per client of this round (``--k``, or chosen by --target-rel-error)
    k: int = 0
    #: the bits per value of this round (``--value-bits``, or chosen with k by
    #: ``--value-bits auto``)
    value_bits: int = 0
    subs: dict[str, Submission] = field(default_factory=dict)
    #: queued writes: client id -> (digest, the write batch's future, index in the batch)
    pending: dict[str, tuple[bytes, asyncio.Future[list[Any]], int]] = field(
        default_factory=dict)
    #: a round finished before a restart: its submissions summed up (None: in memory)
    archived: ArchivedSummary | None = None
    payload_total: int = 0
    wire_total: int = 0
    _arrivals: list[Arrival] = field(default_factory=list, repr=False)
    timer: asyncio.TimerHandle | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    #: a finished round read back at a restart without its arrays (``global_state`` and
    #: the outcome's estimate are empty; :meth:`arrays` reads them from the store): it
    #: is shown and its result kept, never written back
    light: bool = False

    @classmethod
    def planned(cls, round_id: int, global_state: FloatArray, task_step: int,
                choice: RoundChoice) -> LiveRound:
        """A new round, opened now with a fresh nonce and the planner's ``choice`` (its k,
        value bits, priors and estimator), starting from ``global_state``."""
        live = cls(
            round_id=round_id, nonce=secrets.randbits(64), task_step=task_step,
            transform=transform_label(choice.estimator), r_prior=choice.r_prior,
            global_state=np.asarray(global_state, dtype=np.float64), opened_at=time.time(),
            r_priors=choice.r_priors, k=choice.k, value_bits=choice.value_bits,
        )
        live.estimator = choice.estimator
        return live

    def add(self, sub: Submission, received_at: float) -> None:
        """Record a committed submission (keeps the byte totals current)."""
        self.subs[sub.client_id] = sub
        payload = sub.payload_bytes
        self.payload_total += payload
        self.wire_total += sub.wire_bytes
        self._arrivals.append(Arrival(sub.client_id, received_at, sub.wire_bytes, payload))

    # -- summaries (live, or archived for rounds finished before a restart) ---------------
    def contributors(self) -> list[tuple[str, int]]:
        """``(client_id, client_seed)`` of every committed submission."""
        if self.subs or self.archived is None:
            return [(c, s.client_seed) for c, s in self.subs.items()]
        return list(self.archived.contributors)

    def payload_bytes(self) -> int:
        """Seeds, values and indices received."""
        if self.subs or self.archived is None:
            return self.payload_total
        return self.archived.payload_bytes

    def wire_bytes(self) -> int:
        """Serialized Submit requests received (eval references excluded)."""
        if self.subs or self.archived is None:
            return self.wire_total
        return self.archived.wire_bytes

    def arrivals(self) -> list[Arrival]:
        """Who submitted, when, and how many bytes (the dashboard's per-client figures)."""
        if self.subs or self.archived is None:
            return list(self._arrivals)  # kept by add(), in commit order
        return [Arrival(*a) for a in self.archived.arrivals]

    def m(self) -> int:
        """Vectors per submission (1 before any arrived)."""
        if self.subs:
            return len(next(iter(self.subs.values())).vectors)
        return 1 if self.archived is None else self.archived.m

    def arrays(self) -> RoundArrays | None:
        """A finished round's arrays as the engine holds them (None while it runs, and for
        a :attr:`light` round)."""
        if self.light or self.state not in FINISHED:
            return None
        o = self.outcome
        if self.state == RoundState.DONE:
            return RoundArrays(None if o is None else o.estimate, self.next_state)
        return RoundArrays(None, self.global_state)
