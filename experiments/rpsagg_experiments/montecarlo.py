"""Monte Carlo of the squared error of one estimator on fixed client vectors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rpsagg._estimators import Estimator
from rpsagg_experiments.runtime import seed_of


@dataclass(frozen=True)
class MSE:
    """Mean squared error over trials and its standard error.

    Attributes
    ----------
    mean : float
        Average of ``||x_hat - x_bar||^2`` over the trials.
    se : float
        Standard error of ``mean`` (sample standard deviation / sqrt(trials)).
    trials : int
        Number of trials.
    """

    mean: float
    se: float
    trials: int


def summarize(errors: NDArray[np.float64]) -> MSE:
    """:class:`MSE` of an array of squared errors."""
    t = int(errors.size)
    se = float(errors.std(ddof=1) / math.sqrt(t)) if t > 1 else math.nan
    return MSE(float(errors.mean()), se, t)


def squared_error(est: Estimator, xs: NDArray[np.float64], seeds: list[int]) -> float:
    """``||decode(encode(x_i, seed_i)) - mean(xs)||^2`` for one trial."""
    msgs = [est.encode(x, s) for x, s in zip(xs, seeds, strict=True)]
    return float(np.sum((est.decode(msgs) - xs.mean(axis=0)) ** 2))


def trial_seeds(*prefix: int, n: int) -> list[int]:
    """Distinct client seeds ``seed_of(*prefix, i)`` for ``i < n``."""
    return [seed_of(*prefix, i) for i in range(n)]


def mse(est: Estimator, xs: NDArray[np.float64], trials: int, *prefix: int) -> MSE:
    """Monte Carlo MSE of ``est`` on the vectors ``xs`` over ``trials`` independent trials.

    Trial ``t`` uses client seeds ``seed_of(*prefix, t, i)``.
    """
    n = xs.shape[0]
    errs = np.array([squared_error(est, xs, trial_seeds(*prefix, t, n=n)) for t in range(trials)])
    return summarize(errs)
