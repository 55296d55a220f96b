"""A round's budget and estimator: what the engine asks before it opens a round.

:class:`RoundPlanner` holds the job's estimator factory (the options, and the projection a
job keeps across restarts), target mode's budget rule (:class:`rpsagg.planning.BudgetPolicy`)
and the encoding choice (``--value-bits``, fixed or ``auto`` among
:data:`~rpsagg_server.settings.serverconfig.AUTO_VALUE_BITS`). It reads no store and publishes
nothing: :class:`~rpsagg_server.rounds.engine.RoundEngine` passes it the correlation tracker and
gets the
round's k, value bits, priors and estimator back.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpsagg import Estimator, VectorCorrelationTracker
from rpsagg.planning import BudgetPolicy, planning_r
from rpsagg.schemes import estimator_from_options
from rpsagg_server.settings.serverconfig import AUTO, AUTO_VALUE_BITS, ServerConfig


@dataclass(frozen=True)
class RoundChoice:
    """What a new round is opened with.

    Attributes
    ----------
    k, value_bits : int
        The round's values per message and bits per value.
    r_prior : float or None
        The prior ``transform=auto`` decodes vector slot 0 with (None: not auto, or no
        round seen yet).
    r_priors : tuple of (float or None), or None
        Every slot's decode prior (``transform=auto`` only).
    estimator : Estimator
        The round's estimator (slot 0's prior).
    """

    k: int
    value_bits: int
    r_prior: float | None
    r_priors: tuple[float | None, ...] | None
    estimator: Estimator


class RoundPlanner:
    """A job's rounds' budgets and estimators.

    Parameters
    ----------
    config : ServerConfig
        The job's options.

    Attributes
    ----------
    projection : str
        Rand-Proj-Spatial's projection: "auto" (by d) for a new job; a recovered job keeps
        the one it was started with (:meth:`keep_projection`).
    widths : tuple of int
        The value widths a round may use: ``--value-bits``, or with ``auto``
        :data:`~rpsagg_server.settings.serverconfig.AUTO_VALUE_BITS`.
    policy : BudgetPolicy or None
        Target mode's rule (None without ``--target-rel-error``, or before d is known).
    """

    def __init__(self, config: ServerConfig) -> None:
        c = self.cfg = config
        self.projection = "auto"
        self.widths = AUTO_VALUE_BITS if c.value_bits == AUTO else (c.fixed_value_bits,)
        top = c.k_max or c.k
        self.policy = (BudgetPolicy(c.target_rel_error, c.least_k, min(top, c.d), self.widths)
                       if c.target_rel_error > 0 and c.d else None)
        self.base = self._base_estimator()

    def estimator(self, prior: float | None, k: int | None = None,
                  value_bits: int | None = None) -> Estimator:
        """A round's estimator (``prior``: the correlation prior of ``transform=auto``;
        ``k`` and ``value_bits``: the round's, default ``--k`` and ``--value-bits``)."""
        c = self.cfg
        bits = value_bits or c.fixed_value_bits or 32  # 0: --value-bits auto, a round's own
        return estimator_from_options(c.estimator, n=c.n, k=k or c.k, d=c.d,
                                      transform=c.transform,
                                      prior_r=prior if c.transform == "auto" else None,
                                      projection=self.projection,
                                      block_size=c.block_size_for(c.d),
                                      value_bits=bits, bits=c.bits)

    def _base_estimator(self) -> Estimator:
        """The largest messages a round may ask for (``--k-max`` values, float32 where the
        width is chosen per round): what bounds a request's size."""
        return self.estimator(None, self.cfg.k_max or None)

    def encoding_estimator(self) -> Estimator:
        """What fixes the job's projection and block size (and the version announced while no
        round is open): with ``--value-bits auto`` rounds may send codes, so the format is
        that of quantized values. Each open round announces its own version (its estimator's
        ``wire.spec_version``: float32 rounds of the SRHT say ``rpsagg-seed-v1``)."""
        if self.cfg.value_bits == AUTO:
            return self.estimator(None, self.cfg.k_max or None, value_bits=8)
        return self.base

    def keep_projection(self, projection: str) -> None:
        """Use ``projection`` from now on (a recovered job's own)."""
        self.projection = projection
        self.base = self._base_estimator()

    def budget(self, priors: tuple[float | None, ...] | None,
               decode_prior: float | None = None) -> tuple[int, int]:
        """``(k, value_bits)`` of a new round: ``--k`` and ``--value-bits`` without
        ``--target-rel-error``; with it, :attr:`policy`'s plan
        (:meth:`rpsagg.planning.BudgetPolicy.plan`: the cheapest budget in ``[--k-min,
        --k-max]`` whose predicted relative error at the least of ``priors`` is at most the
        target; ``--k-max`` at the widest width while no R_hat is known). ``priors``: the R
        to plan for (:meth:`rpsagg.VectorCorrelationTracker.planning_priors`);
        ``decode_prior``, the prior ``transform=auto`` decodes the round with (default: the
        planned R)."""
        c = self.cfg
        if c.target_rel_error <= 0:
            return c.k, c.fixed_value_bits
        if self.policy is None:  # d not known
            return c.k_max or c.k, max(self.widths)
        known = [p for p in (priors or ()) if p is not None]
        prior = None
        if c.transform == "auto" and known:
            prior = planning_r(known) if decode_prior is None else decode_prior
        plan = self.policy.plan(known, lambda k, bits: self.estimator(prior, k, bits))
        return plan.k, plan.value_bits

    def choose(self, tracker: VectorCorrelationTracker | None) -> RoundChoice:
        """The next round's budget and estimator, from the tracker's state: the budget is
        planned at the least of the smoothed and the newest R_hat, the decode takes the
        smoothed one (``transform=auto``)."""
        n = self.cfg.n
        tracked = None if tracker is None else tuple(tracker.priors(n))
        priors = tracked if self.cfg.transform == "auto" else None  # what the decode uses
        prior = None if priors is None else priors[0]
        k, bits = self.budget(
            None if tracker is None else tuple(tracker.planning_priors(n)), prior)
        return RoundChoice(k, bits, prior, priors, self.estimator(prior, k, bits))
