"""Choosing a round's budget for a target error: the smallest k (and value bits) whose
predicted relative error at a correlation R is at most the target.

The prediction is :meth:`rpsagg.Estimator.predicted_relative_error`: ``n^2 (a + b R) /
(1 + R)`` for the sketch families (plus the rounding noise of b-bit values), which falls
with k for every family, so the smallest k is found by bisection. With several value
widths allowed, each width gets its smallest k and the plan with the fewest bytes on the
wire wins (values ``ceil(k b / 8)`` bytes, plus a 4-byte scale for quantized values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
        False when even the largest budget allowed misses the target (the plan is then the
        largest budget).
    """

    k: int
    value_bits: int
    predicted_relative_error: float
    value_bytes: int
    reached: bool


def value_bytes(k: int, value_bits: int) -> int:
    """Bytes of k values on the wire: ``4 k`` for float32, else packed codes plus a scale."""
    return 4 * k if value_bits >= 32 else (k * value_bits + 7) // 8 + 4


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
        ``[0, n - 1]``.
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
    if not target > 0.0 or not math.isfinite(target):
        raise ValueError(f"target must be a positive number; got {target!r}")
    if not 1 <= k_min <= k_max:
        raise ValueError(f"need 1 <= k_min <= k_max; got k_min={k_min}, k_max={k_max}")
    if not value_bits:
        raise ValueError("value_bits needs at least one width")
    best: BudgetPlan | None = None
    fallback: BudgetPlan | None = None
    for bits in value_bits:
        n = make(k_min, bits).n
        rr = min(max(0.0, float(r)), float(n - 1))

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
