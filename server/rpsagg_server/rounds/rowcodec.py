"""A round in memory and its row in the store: :class:`~rpsagg_server.rounds.liveround.LiveRound`
<-> :class:`~rpsagg_server.store.rows.StoredRound`, and a row's arrays.

The row's ``info`` is typed (:class:`~rpsagg_server.store.rowinfo.RowInfo`); rows of older schema
versions were brought to the current shape when the database was opened
(:mod:`rpsagg_server.store.migrations`), so this module reads every row one way.
"""

from __future__ import annotations

import numpy as np

from rpsagg_server.decode.decoding import DecodeOutcome
from rpsagg_server.rounds.liveround import FloatArray, LiveRound, RoundArrays
from rpsagg_server.store.rowinfo import ArchivedSummary, DecodeMetrics, RowInfo
from rpsagg_server.store.rows import StoredRound
from rpsagg_wire.v1.messages import FINISHED, RoundState

__all__ = ["arrays_of_row", "from_row", "to_row"]

#: the estimate of a round read back without its arrays (``LiveRound.light``)
_UNLOADED: FloatArray = np.empty((0, 0))
_UNLOADED.flags.writeable = False


def to_row(live: LiveRound) -> StoredRound:
    """The row to commit for ``live`` (never for a :attr:`~LiveRound.light` round)."""
    if live.light:
        raise RuntimeError(f"round {live.round_id} was read without its arrays; its "
                           "row is never written back")
    o = live.outcome
    gs = np.ascontiguousarray(live.global_state, dtype="<f8")
    return StoredRound(
        round_id=live.round_id, nonce=live.nonce, state=live.state, reason=live.reason,
        task_step=live.task_step, transform=live.transform, r_prior=live.r_prior,
        global_state=gs.tobytes(), global_shape=tuple(gs.shape), opened_at=live.opened_at,
        info=_info(live),
        estimate=(None if o is None
                  else np.ascontiguousarray(o.estimate, dtype="<f8").tobytes()),
        next_state=(None if live.next_state is None
                    else np.ascontiguousarray(live.next_state, dtype="<f8").tobytes()),
    )


def _info(live: LiveRound) -> RowInfo:
    """The typed ``info`` of ``live``'s row."""
    archived = None
    if live.state in FINISHED:
        archived = ArchivedSummary(
            contributors=tuple(live.contributors()), payload_bytes=live.payload_bytes(),
            wire_bytes=live.wire_bytes(), m=live.m(),
            arrivals=tuple((a.client_id, a.received_at, a.wire_bytes, a.payload_bytes)
                           for a in live.arrivals()))
    o = live.outcome
    decoded = None if o is None else DecodeMetrics(
        n_prime=o.n_prime, beta=o.beta, c=o.c, seconds=o.seconds, r_hat=o.r_hat,
        eval_errors=o.eval_errors, shape=tuple(o.estimate.shape),
        estimated_error=o.estimated_error)
    return RowInfo(first_at=live.first_at, deadline=live.deadline, closed_at=live.closed_at,
                   finished_at=live.finished_at, k=live.k, value_bits=live.value_bits,
                   r_priors=live.r_priors, archived=archived, decoded=decoded)


def from_row(r: StoredRound) -> LiveRound:
    """Rebuild a round from its row (submissions are loaded separately). A row read
    without its arrays (``r.arrays`` False: a finished round) gives a
    :attr:`~LiveRound.light` round."""
    light = not r.arrays
    gs = np.empty((0,)) if light else _array(r.global_state).copy().reshape(r.global_shape)
    info = r.info
    live = LiveRound(round_id=r.round_id, nonce=r.nonce, task_step=r.task_step,
                     transform=r.transform, r_prior=r.r_prior, global_state=gs,
                     opened_at=r.opened_at, state=r.state, reason=r.reason,
                     first_at=info.first_at, deadline=info.deadline,
                     closed_at=info.closed_at, finished_at=info.finished_at,
                     r_priors=info.r_priors, k=info.k, value_bits=info.value_bits,
                     archived=info.archived, light=light)
    if r.next_state is not None:
        live.next_state = _array(r.next_state).copy().reshape(gs.shape)
    d = info.decoded
    if d is not None:  # a decoded round: its row has an estimate
        est = _UNLOADED if light else _array(_estimate(r)).copy().reshape(d.shape)
        live.outcome = DecodeOutcome(est, d.n_prime, d.beta, d.c, d.seconds, d.r_hat,
                                     d.eval_errors, d.estimated_error)
    return live


def arrays_of_row(r: StoredRound) -> RoundArrays:
    """The arrays of a whole row, bit for bit as stored (read-only views of the row's
    bytes, no copy)."""
    d = r.info.decoded
    est = None if d is None else _array(_estimate(r)).reshape(d.shape)
    if r.state == RoundState.DONE:
        state = None if r.next_state is None else _array(r.next_state).reshape(
            r.global_shape)
    else:
        state = _array(r.global_state).reshape(r.global_shape)
    return RoundArrays(est, state)


def _estimate(r: StoredRound) -> bytes:
    """The estimate of a decoded round's row."""
    if r.estimate is None:
        raise ValueError(f"round {r.round_id}'s row has decode metrics but no estimate")
    return r.estimate


def _array(blob: bytes) -> FloatArray:
    """Stored little-endian float64 bytes as an array (a read-only view on this platform's
    byte order, else a copy)."""
    return np.frombuffer(blob, dtype="<f8").astype(np.float64, copy=False)
