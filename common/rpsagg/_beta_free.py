"""beta's spectral sum from free probability: no Monte Carlo for large problems.

``S = sum_i G_i^T G_i`` is a sum of ``n`` independent rank-k orthogonal projections in
``R^{d'}``. As ``d' -> infinity`` with ``p = k/d'`` and ``n`` fixed, projections that are
Haar-distributed (and subsampled randomized Hadamard ones, which share the Haar limits:
Anderson and Farrell 2014, Tropp 2011) are asymptotically free, so the empirical spectral
law of S tends to ``mu = nu^{boxplus n}``, the free additive convolution of ``n`` copies
of ``nu = (1 - p) delta_0 + p delta_1``.

The functional beta needs is one point of mu's Cauchy transform
``G(z) = int dmu(l) / (z - l)``. With ``T(l) = (1 - c) + c l``, ``0 < c <= 1`` and
``e = (1 - c)/c``: ``l / T(l) = (1/c) l / (e + l)``, and

    E[sum_j l_j / T(l_j)] ~ (d'/c) u,   u = int l / (e + l) dmu(l) = 1 + e G(-e)

(zero eigenvalues add nothing to either side, so the atom of mu at 0, of mass
``max(0, 1 - np)``, and the one at ``n``, of mass ``max(0, 1 - n(1 - p))``, are included).

u has a closed form. Subordination for a free convolution power: ``G(z) = G_nu(w)`` with
``w = z/n + (1 - 1/n) / G(z)``. Inserting ``G_nu(w) = (1 - p)/w + p/(w - 1)`` gives a
quadratic in G, and with ``G(-e) = (u - 1)/e`` it becomes, after the terms in ``1/e``
cancel exactly,

    (1 + e/n) u^2 - (1 + e + np) u + np = 0.

Both roots are positive (product and sum are); u is the smaller one: it is at most 1 and
``min(1, np)`` at ``c = 1`` (where the quadratic is ``(u - 1)(u - np)``: the rank of S
over d'), and ``p / (1 + e)`` for ``n = 1`` (``((1 + e) u - p)(u - 1)``). It is computed
as ``2 np / (B + sqrt(B^2 - 4 A np))``, free of cancellation for every c.

The error of the limit at finite d' was measured against long Monte Carlo runs
(``bench/beta_paths.py``; figures and the grid in ``docs/performance.md``). Its *absolute*
error in the spectral sum is O(1), not O(d'): it stayed below 0.27 on every measured case
(d' from 64 to 4096, n from 2 to 1000, c from 0.1 to 1 - 1e-6), largest where the spectrum of S
touches 0 (nk close to d', the hard edge) and c is close to 1, where ``l / T(l)`` is
steepest. Away from nk = d' it falls off: the free limit reproduces the first two moments
of S exactly at every d' (``E tr S = nk``, ``E tr S^2 = nk + n(n-1)k^2/d'``, for SRHT and
Haar projections alike), so for ``r = nk/d' -> 0`` the error starts at higher moments; for
``r -> infinity`` the spectrum concentrates around r, far from 0, where l / T(l) is nearly
linear. :func:`free_error_bound` states ``FREE_ABS_ERROR * min(1, 4r, 4/r)`` over the sum
(twice the largest measured error near r = 1; every measured case away from it is inside
the r-scaled bound), and the limit is used where that relative bound is at most
``FREE_MAX_REL_ERROR``. Where it is not, the spectral sum is below 250 times
``min(1, 4r, 4/r)``, so the problem is small and its Monte Carlo is cheap.
"""

from __future__ import annotations

import math

# About twice the largest absolute error |E_mc - E_free| of the spectral sum measured
# near nk = d' (0.26 at n = 4, k = 128, d' = 512, c = 0.999; it falls again as c -> 1).
FREE_ABS_ERROR = 0.5
# The free limit is used where its stated bound is at most this (the 2e-3); the
# measured errors there are at most half of it.
FREE_MAX_REL_ERROR = 2e-3


def free_spectral_sum(n: int, k: int, d_pad: int, c: float) -> float:
    """``d' int l / T(l) dmu(l)`` for the free convolution of ``n`` Bernoulli(k/d') laws.

    Parameters
    ----------
    n, k, d_pad : int
        Clients, rows per client, padded dimension (``1 <= k <= d_pad``).
    c : float
        Coefficient of ``T(l) = (1 - c) + c l``, in ``[0, 1]``.

    Returns
    -------
    float
        The limit of ``E[sum_j l_j / T(l_j)]`` over the eigenvalues of S.
    """
    if not 0.0 <= c <= 1.0:
        raise ValueError(f"c must be in [0, 1]; got {c}")
    if c == 0.0 or n == 1:
        return float(n * k)  # the trace of S
    if c == 1.0:
        return float(min(n * k, d_pad))  # the quadratic's root, without rounding
    p = k / d_pad
    e = (1.0 - c) / c
    qa = 1.0 + e / n
    qb = 1.0 + e + n * p
    u = 2.0 * n * p / (qb + math.sqrt(max(0.0, qb * qb - 4.0 * qa * n * p)))
    return d_pad * u / c


def free_error_bound(n: int, k: int, d_pad: int, c: float) -> float:
    """Stated relative error of :func:`free_spectral_sum` against the finite-d' expectation.

    Parameters
    ----------
    n, k, d_pad : int
        Clients, rows per client, padded dimension.
    c : float
        Transform coefficient.

    Returns
    -------
    float
        ``FREE_ABS_ERROR min(1, 4 nk/d', 4 d'/(nk))`` over the spectral sum (0 where the
        sum is exact).
    """
    if c == 0.0 or n == 1:
        return 0.0
    r = n * k / d_pad
    return FREE_ABS_ERROR * min(1.0, 4.0 * r, 4.0 / r) / free_spectral_sum(n, k, d_pad, c)


def free_is_accurate(n: int, k: int, d_pad: int, c: float) -> bool:
    """Whether the free limit's error bound is within ``FREE_MAX_REL_ERROR``."""
    return free_error_bound(n, k, d_pad, c) <= FREE_MAX_REL_ERROR
