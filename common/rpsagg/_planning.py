"""Choosing a round's budget for a target error: the smallest k (and value bits) whose
predicted relative error at a correlation R is at most the target.

The prediction is :meth:`rpsagg.Estimator.predicted_relative_error`: ``n^2 (a + b R) /
(1 + R)`` for the sketch families (plus the rounding noise of b-bit values), which falls
with k for every family, so the smallest k is found by bisection. With several value
widths allowed, each width gets its smallest k and the plan with the fewest bytes on the
wire wins (values ``ceil(k b / 8)`` bytes, plus a 4-byte scale for quantized values).

:class:`BudgetPolicy` is target mode's rule for a round (the server's, the Flower
strategy's and ``bench/target_mode.py``'s): plan at the least of the vector slots'
planning priors (:meth:`rpsagg.VectorCorrelationTracker.planning_priors`: per slot the
least of the smoothed and the newest R_hat), or send the largest budget while none is known.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rpsagg._estimator import Estimator


@dataclass(frozen=True)
class BudgetPlan:
    """A budget chosen for a target relative error.

    Attributes
    ----------
    k : int
        Values per message.
    value_bits : int
        Bits per value (32: float32).
    predicted_relative_error : float
        The prediction at the R planned for.
    value_bytes : int
        Bytes of values (and scale) per message.
    reached : bool
        False when even the largest budget allowed misses the target, or when no R was
        known to plan for (the plan is then the largest budget; with no R, its
        ``predicted_relative_error`` is NaN).
    """

    k: int
    value_bits: int
    predicted_relative_error: float
    value_bytes: int
    reached: bool


def value_bytes(k: int, value_bits: int) -> int:
    """Bytes of k values on the wire: ``4 k`` for float32, else packed codes plus a scale."""
    return 4 * k if value_bits >= 32 else (k * value_bits + 7) // 8 + 4


def _check(target: float, k_min: int, k_max: int, value_bits: Sequence[int]) -> None:
    """Refuse a target, k range or set of widths no plan can be made for."""
    if not target > 0.0 or not math.isfinite(target):
        raise ValueError(f"target must be a positive number; got {target!r}")
    if not 1 <= k_min <= k_max:
        raise ValueError(f"need 1 <= k_min <= k_max; got k_min={k_min}, k_max={k_max}")
    if not value_bits:
        raise ValueError("value_bits needs at least one width")


def plan_budget(
    make: Callable[[int, int], Estimator],
    target: float,
    r: float,
    *,
    k_min: int,
    k_max: int,
    value_bits: Sequence[int] = (32,),
) -> BudgetPlan:
    """The cheapest ``(k, value_bits)`` whose predicted relative error at ``r`` is
    ``<= target``.

    Parameters
    ----------
    make : callable
        ``make(k, value_bits)`` builds the estimator of a candidate budget.
    target : float
        Target relative error ``E||x_hat - x_bar||^2 / ||x_bar||^2`` (> 0).
    r : float
        The correlation to plan for (e.g. the smoothed R_hat of earlier rounds), clipped to
        its range ``[-1, n - 1]``. A negative R is planned as it is: the clients' vectors
        disagree, their mean is small against them (``||x_bar||^2 = (1 + R) sum_i
        ||x_i||^2 / n^2``) and the relative error grows as ``1 / (1 + R)``; at R = -1 (a
        zero mean) no budget reaches a target.
    k_min, k_max : int
        The range of k (``1 <= k_min <= k_max``).
    value_bits : sequence of int
        Widths to consider (32: float32).

    Returns
    -------
    BudgetPlan
        With ``reached=False`` (and ``k = k_max`` at the most accurate width) when no
        budget in range reaches the target.
    """
    _check(target, k_min, k_max, value_bits)
    best: BudgetPlan | None = None
    fallback: BudgetPlan | None = None
    for bits in value_bits:
        n = make(k_min, bits).n
        rr = min(max(-1.0, float(r)), float(n - 1))

        def err(k: int, bits: int = bits, rr: float = rr) -> float:
            return make(k, bits).predicted_relative_error(rr)

        top = err(k_max)
        if fallback is None or top < fallback.predicted_relative_error:
            fallback = BudgetPlan(k_max, bits, top, value_bytes(k_max, bits), False)
        if top > target:
            continue
        lo, hi = k_min, k_max  # err(hi) <= target; find the smallest such k
        if err(lo) <= target:
            hi = lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if err(mid) <= target:
                hi = mid
            else:
                lo = mid
        plan = BudgetPlan(hi, bits, err(hi), value_bytes(hi, bits), True)
        if best is None or (plan.value_bytes, -plan.value_bits) < (best.value_bytes,
                                                                    -best.value_bits):
            best = plan
    if best is not None:
        return best
    assert fallback is not None
    return fallback


def planning_r(priors: Iterable[float | None]) -> float | None:
    """The R a round plans for: the least of the vector slots' known priors.

    Parameters
    ----------
    priors : iterable of float or None
        Per vector slot, the R to plan for (None: the slot has seen no round yet), e.g.
        :meth:`rpsagg.VectorCorrelationTracker.planning_priors`.

    Returns
    -------
    float or None
        The least known prior (the cautious one), or None when no slot knows one.
    """
    known = [p for p in priors if p is not None]
    return min(known) if known else None


@dataclass(frozen=True)
class BudgetPolicy:
    """Target mode's rule: each round, the cheapest budget whose predicted relative error
    at the planned R is at most the target.

    Attributes
    ----------
    target : float
        Target relative error ``E||x_hat - x_bar||^2 / ||x_bar||^2`` (> 0).
    k_min, k_max : int
        The range of k (``1 <= k_min <= k_max``).
    value_bits : tuple of int
        The widths a round may use: one for a fixed width, several to choose the one with
        the fewest bytes (``--value-bits auto``). 32: float32.
    unknown_r : float or None
        What to do while no R is known (the first round): None sends ``k_max`` at the
        widest width; a number plans at that R (0: no correlation, the cautious R).

    Examples
    --------
    >>> from rpsagg import make_estimator
    >>> from rpsagg.planning import BudgetPolicy
    >>> policy = BudgetPolicy(target=2.0, k_min=1, k_max=128)
    >>> def make(k, bits):
    ...     return make_estimator("rand-proj-spatial", n=8, k=k, d=1024, value_bits=bits)
    >>> policy.plan([None], make).k
    128
    >>> plan = policy.plan([3.5, 5.0], make)
    >>> plan.reached and plan.predicted_relative_error <= 2.0
    True
    """

    target: float
    k_min: int
    k_max: int
    value_bits: tuple[int, ...] = (32,)
    unknown_r: float | None = None

    def __post_init__(self) -> None:
        _check(self.target, self.k_min, self.k_max, self.value_bits)

    def plan(self, priors: Iterable[float | None],
             make: Callable[[int, int], Estimator]) -> BudgetPlan:
        """The round's budget.

        Parameters
        ----------
        priors : iterable of float or None
            Per vector slot, the R to plan for
            (:meth:`rpsagg.VectorCorrelationTracker.planning_priors`, or
            ``[CorrelationTracker.planning_prior(n)]``); the least known one is planned
            for (:func:`planning_r`).
        make : callable
            ``make(k, value_bits)`` builds the estimator of a candidate budget.

        Returns
        -------
        BudgetPlan
            :func:`plan_budget`'s plan at the planned R; with no R known and
            ``unknown_r`` None, ``k_max`` at the widest width (``reached`` False,
            ``predicted_relative_error`` NaN; no estimator is built).
        """
        r = planning_r(priors)
        if r is None:
            r = self.unknown_r
        if r is None:
            bits = max(self.value_bits)
            return BudgetPlan(self.k_max, bits, math.nan, value_bytes(self.k_max, bits),
                              False)
        return plan_budget(make, self.target, r, k_min=self.k_min, k_max=self.k_max,
                           value_bits=self.value_bits)
