"""The error of a decode, estimated from its messages, and planning for a target error.

:class:`ErrorEstimate` is what :meth:`rpsagg.Estimator.decode_with_info` returns as
``error_estimate``. The coefficients of the MSE's form ``a sum_i ||x_i||^2 + b sum_{i != l}
<x_i, x_l>`` (:class:`ErrorCoefficients`) come from :func:`randk_coefficients`,
:func:`spatial_coefficients` and, for Rand-Proj-Spatial, :func:`rps_coefficients` (the
free-probability limit :func:`free_coefficients`, or the Monte Carlo
:func:`mc_coefficients` near the hard edge). :func:`plan_budget` chooses k (and value bits)
for a target relative error. ``docs/error-estimate.md`` derives them.
"""

from __future__ import annotations

from rpsagg import _error_coef
from rpsagg._error import ErrorEstimate, quantization_variance
from rpsagg._error_coef import (
    ErrorCoefficients,
    free_coefficients,
    mc_coefficients,
    randk_coefficients,
    rps_coefficients,
    spatial_coefficients,
)
from rpsagg._planning import BudgetPlan, plan_budget, value_bytes


def clear_memory_cache() -> None:
    """Forget the coefficients kept in memory (the disk cache stays): a cold computation
    follows, as in a new process."""
    with _error_coef._lock:
        _error_coef._memory.clear()


__all__ = [
    "BudgetPlan",
    "ErrorCoefficients",
    "ErrorEstimate",
    "clear_memory_cache",
    "free_coefficients",
    "mc_coefficients",
    "plan_budget",
    "quantization_variance",
    "randk_coefficients",
    "rps_coefficients",
    "spatial_coefficients",
    "value_bytes",
]
