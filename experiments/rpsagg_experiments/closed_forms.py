"""Closed-form MSEs for identical client vectors (``x_i = x`` for all i, ``||x|| = 1``).

Derivations (also in ``docs/reproduction.md``):

Rand-k
    ``x_hat = (d/(nk)) sum_i E_i^T E_i x`` so ``x_hat(j) = (d/(nk)) M_j x(j)`` with
    ``M_j ~ Bin(n, k/d)`` clients sending coordinate j. Unbiased, with variance
    ``(d/(nk))^2 n (k/d)(1 - k/d) x(j)^2``; summed over j: ``(1/n)(d/k - 1) ||x||^2``.

Rand-k-Spatial(max)
    ``T(m) = m``, so ``x_hat(j) = beta_s / M_j * M_j x(j) = beta_s 1{M_j > 0} x(j)``.
    The ``beta_s = d / (n k E[1/(1 + B)])`` of ``docs/math.md`` ("Baselines") with
    ``B ~ Bin(n - 1, p)``, ``p = k/d``;
    ``E[1/(1 + B)] = (1 - (1 - p)^n) / (n p)``, so ``beta_s = 1 / q`` with
    ``q = P(M_j > 0) = 1 - (1 - p)^n``. Then
    ``MSE = sum_j x(j)^2 E[(beta_s 1{M_j > 0} - 1)^2] = (beta_s^2 q - 2 beta_s q + 1) ||x||^2
    = (1/q - 1) ||x||^2 = (1 - p)^n / (1 - (1 - p)^n) ||x||^2``.

Rand-Proj-Spatial(max)
    ``x_hat = beta S^+ S x = beta P x`` with P the orthogonal projection on the range of S.
    When S has full rank nk, ``E[P] = (nk/d') I`` (sign flips and XOR shifts of the SRHT
    leave the law of P invariant, and ``tr P = nk``), ``beta = d'/(nk)`` and
    ``E||beta P x - x||^2 = beta^2 nk/d' - 2 beta nk/d' + 1 = d'/(nk) - 1`` (x padded with
    zeros to d'). With ``delta = P(rank S < nk)`` the paper's Theorem 4.2 bounds it by
    ``d/((1 - delta) nk + delta k) - 1``.
"""

from __future__ import annotations

import numpy as np


def rand_k_identical(n: int, k: int, d: int) -> float:
    """MSE of Rand-k for n identical unit vectors: ``(1/n)(d/k - 1)``."""
    return (d / k - 1.0) / n


def rand_k_spatial_max_identical(n: int, k: int, d: int) -> float:
    """MSE of Rand-k-Spatial(max) for n identical unit vectors: ``(1-p)^n / (1 - (1-p)^n)``,
    ``p = k/d``."""
    miss = (1.0 - k / d) ** n
    return miss / (1.0 - miss)


def rand_proj_spatial_max_identical(n: int, k: int, d: int) -> float:
    """MSE of Rand-Proj-Spatial(max) for n identical unit vectors when S has full rank nk:
    ``d/(nk) - 1`` with the default projection (the SRHT when d is a power of two, the
    randomized DCT of length d otherwise: neither pads). The SRHT padded to ``d' > d`` does
    not reach it (its truncated estimate's error lies between d/(nk) - 1 and d'/(nk) - 1)."""
    if n * k > d:
        raise ValueError(f"the closed form needs nk <= d; got nk={n * k}, d={d}")
    return d / (n * k) - 1.0


CLOSED_FORMS = {
    "rand-k": rand_k_identical,
    "rand-k-spatial(max)": rand_k_spatial_max_identical,
    "rand-proj-spatial(max)": rand_proj_spatial_max_identical,
}


def rand_k_general(n: int, k: int, d: int, sum_sq: float) -> float:
    """MSE of Rand-k for any vectors: ``(1/n^2)(d/k - 1) sum_i ||x_i||^2``."""
    return (d / k - 1.0) * sum_sq / (n * n)


def rand_k_spatial_basis(n: int, k: int, d: int, sizes: list[int], c: float) -> float:
    """Exact MSE of Rand-k-Spatial with ``T(m) = (1 - c) + c m`` when the clients hold
    canonical basis vectors: groups of ``sizes`` share one, the other clients hold distinct
    ones (singletons).

    For a coordinate held by a group of g clients the mean is ``g/n``; the members that send
    it, ``A ~ Bin(g, p)``, and the others that send it, ``B ~ Bin(n - g, p)`` (``p = k/d``),
    are independent, and ``x_hat(j) = beta_s A / T(A + B)`` (0 when nobody sends it).
    Coordinates no client holds are estimated as 0 exactly. So
    ``MSE = sum_groups E[(beta_s A / T(A + B) - g/n)^2]``, a finite sum over the pmfs.
    """
    from scipy.stats import binom

    from rpsagg import spatial_beta

    p = k / d
    beta = spatial_beta(n, k, d, c)
    singles = n - sum(sizes)
    total = 0.0
    for g, count in [*((s, 1) for s in sizes), (1, singles)]:
        if count == 0:
            continue
        a = np.arange(g + 1)[:, None]
        b = np.arange(n - g + 1)[None, :]
        pmf = binom.pmf(a, g, p) * binom.pmf(b, n - g, p)
        m = a + b
        t = (1.0 - c) + c * m
        xhat = np.where(m > 0, beta * a / np.where(m > 0, t, 1.0), 0.0)
        total += count * float(np.sum(pmf * (xhat - g / n) ** 2))
    return total
