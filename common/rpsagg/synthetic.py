"""Synthetic client vectors with a controllable correlation R (demos and tests)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def correlated_vectors(n: int, d: int, r: float, seed: int = 0) -> NDArray[np.float64]:
    """``n`` unit vectors in R^d whose correlation is exactly ``r``.

    ``x_i = a u + b v_i`` with orthonormal ``u, v_1, ..., v_n`` (random), ``a^2 = r/(n-1)``
    and ``b^2 = 1 - a^2``, so ``<x_i, x_l> = a^2`` for ``i != l`` and
    ``R = sum_{i != l} <x_i, x_l> / sum_i ||x_i||^2 = (n - 1) a^2 = r``. A negative ``r``
    (vectors that disagree) takes the Gram matrix ``(1 - rho) I + rho 1 1^T``, ``rho =
    r/(n-1)``, to its square root: ``x = G^(1/2) V`` with ``V``'s rows ``v_i``.

    Parameters
    ----------
    n : int
        Number of vectors, ``n >= 1`` and ``n + 1 <= d``.
    d : int
        Dimension.
    r : float
        Target correlation in ``[-1, n - 1]`` (-1: the vectors sum to zero).
    seed : int
        Seed of the data (numpy Generator; the data need not be reproducible across numpy
        versions, the transforms are).
    """
    if n < 1 or d < n + 1:
        raise ValueError(f"need n >= 1 and d >= n + 1; got n={n}, d={d}")
    low = -1.0 if n > 1 else 0.0
    if not low <= r <= max(0, n - 1):
        raise ValueError(f"r must be in [{low:g}, n-1] = [{low:g}, {n - 1}]; got {r}")
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, n + 1)))
    u, v = q[:, 0], q[:, 1:].T
    if r < 0:  # G^(1/2): sqrt(1 - rho) off the all-ones direction, sqrt(1 + r) along it
        rho, ones = r / (n - 1), np.full((n, n), 1.0 / n)
        root = np.sqrt(1.0 - rho) * (np.eye(n) - ones) + np.sqrt(1.0 + r) * ones
        return np.asarray(root @ v)
    a2 = 0.0 if n == 1 else r / (n - 1)
    return np.asarray(np.sqrt(a2) * u[None, :] + np.sqrt(1.0 - a2) * v)
