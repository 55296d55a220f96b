"""A round's read-model snapshots: the :class:`~rpsagg_server.readmodel.views.RoundView` the
dashboard shows and the :class:`~rpsagg_server.readmodel.views.EstimateInfo` of a done round's
estimate, built
from the engine's :class:`~rpsagg_server.rounds.liveround.LiveRound`.
"""

from __future__ import annotations

import math

from rpsagg.schemes import scheme_traits
from rpsagg_server.readmodel.views import EstimateInfo, EvalErrors, RoundView
from rpsagg_server.rounds.liveround import LiveRound
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_wire.v1.messages import RoundState

__all__ = ["estimate_info", "round_view"]


def round_view(live: LiveRound, cfg: ServerConfig, clients: dict[str, int],
               projection: str = "", block_size: int = 0) -> RoundView:
    """Snapshot of ``live`` for :class:`~rpsagg_server.readmodel.state.ServerState`.

    Parameters
    ----------
    live : LiveRound
    cfg : ServerConfig
    clients : dict
        Client id -> join index (the order of the arrived and missing clients).
    projection, block_size : str, int
        The job's (the engine's encoding).
    """
    arrived = tuple(sorted((c for c, _ in live.contributors()),
                           key=lambda c: clients.get(c, 0)))
    arrived_set = set(arrived)
    missing = tuple(c for c in sorted(clients, key=clients.__getitem__)
                    if c not in arrived_set)
    o = live.outcome
    ev = None
    if o is not None and o.eval_errors is not None:
        ev = EvalErrors(*o.eval_errors)
    return RoundView(
        round_id=live.round_id, state=live.state, reason=live.reason, nonce=live.nonce,
        scheme=cfg.estimator, transform=live.transform, task_step=live.task_step,
        opened_at=live.opened_at, first_submission_at=live.first_at,
        deadline_at=live.deadline, closed_at=live.closed_at, finished_at=live.finished_at,
        clients_expected=cfg.n, clients_arrived=arrived, clients_missing=missing,
        payload_bytes=live.payload_bytes(), wire_bytes=live.wire_bytes(),
        raw_float32_bytes=len(arrived) * live.m() * cfg.d * 4,
        decode_seconds=None if o is None else o.seconds,
        c=None if o is None or math.isnan(o.c) else o.c,
        beta=None if o is None else o.beta,
        r_hat=None if o is None or math.isnan(o.r_hat) else o.r_hat,
        r_prior=live.r_prior, eval_errors=ev,
        arrivals=tuple(sorted(live.arrivals(), key=lambda a: clients.get(a.client_id, 0))),
        estimated_error=None if o is None else o.estimated_error,
        k=_shown_k(live, cfg), value_bits=live.value_bits or cfg.fixed_value_bits or 32,
        projection=projection, block_size=block_size,
    )


def estimate_info(live: LiveRound, view: RoundView, cfg: ServerConfig) -> EstimateInfo | None:
    """What ``live``'s estimate came from (None unless it is done): with the projection,
    block size and value bits of ``view``."""
    o = live.outcome
    if o is None or live.state != RoundState.DONE:
        return None
    return EstimateInfo(
        round_id=live.round_id, n_prime=o.n_prime, scheme=cfg.estimator,
        transform=live.transform, n=cfg.n, k=_shown_k(live, cfg), d=cfg.d,
        wire_bytes=view.wire_bytes,
        payload_bytes=view.payload_bytes, contributors=view.clients_arrived,
        projection=view.projection, m=cfg.mean_vectors, block_size=view.block_size,
        value_bits=view.value_bits)


def _shown_k(live: LiveRound, cfg: ServerConfig) -> int:
    """The round's k as shown: 0 for a scheme that sends every coordinate."""
    return (live.k or cfg.k) if scheme_traits(cfg.estimator).takes_k else 0
