"""``transform="auto"``: c from a prior R by a spectral model of the MSE, robust near nk = d'.

Model. Split the vectors into their mean and the rest, ``x_i = m + delta_i`` with
``sum_i delta_i = 0``; with ``E = sum_i ||x_i||^2`` the share of the mean is
``s = n ||m||^2 / E = (R + 1) / n`` (R the correlation of ``docs/math.md``, "Setup"). Treat
``m`` and the ``delta_i`` as isotropic and independent of the projections. With ``P_i = G_i^T G_i``,
``T = T(S)`` and ``beta = d' / E[tr(S/T)]`` the estimate is
``beta T^-1 (S m + sum_i P_i delta_i)``, and since ``P_i^2 = P_i`` and the ``P_i`` are
exchangeable (``E tr(T^-2 P_i) = E tr(T^-2 S) / n``)::

    MSE / E ~ (s/n) A + ((1 - s)/n) B - (1 - s)/n^2,
    A = beta^2 int (l/T)^2 dmu - 1,      B = beta^2 int l / T^2 dmu

(mu the spectral law of S per dimension; ``- (1-s)/n^2`` does not depend on c). A is the
error on the common part (0 for max when S has full rank), B the amplification of the
independent parts, which grows without bound as c -> 1 when S has eigenvalues near 0.

In the free limit (:mod:`rpsagg._beta_free`) all three integrals follow from
``u(e) = int l/(e + l) dmu``, ``e = (1 - c)/c``, and its derivative ``u'(e)``:
``int l/T = u/c``, ``int l^2/T^2 = (u + e u')/c^2``, ``int l/T^2 = -u'/c^2``, so

    A = (u + e u') / u^2 - 1,    B = -u' / u^2,

and c only enters through e. ``u'`` follows from the quadratic
``Q(u, e) = (1 + e/n) u^2 - (1 + e + np) u + np = 0``: ``u' = -Q_e / Q_u``
``= -(u - u^2/n) / sqrt(disc)``.

The minimizer. ``F = s A + (1 - s) B`` has ``dF/de = (s e - (1 - s)) (u''/u^2 - 2u'^2/u^3)``,
zero at ``e = (1 - s)/s``: **c = s = (R + 1)/n for every spectral law** (the paper's corr(R)
uses R/(n - 1), the same at R = n - 1 and nearly so for large n). What the spectrum decides
is the *price of a wrong s*. F is affine in s, and at nk close to d' the spectrum of S
touches 0: ``disc -> 0`` as c -> 1, B diverges, and a c above the truth costs far more than
one below it. At (n, k, d') = (50, 10, 512) with a true fraction of 0.8 the model's MSE is
0.60 for avg, 1.01 for one, 0.55 at c = s and 8.4 at c = 1 (where the old auto rounded a
prior of 0.95 or more). So auto takes the c of least worst-case regret over
``s' in [s - delta, s + delta]`` (``AUTO_DELTA`` = 0.1, the error the old rounding
accepted): the cap near nk = d' is that worst case, never c = 1 unless the prior is exact
(delta = 0).

Checks (``tests/unit/test_auto.py``): the model reproduces the closed forms for max and one of
``docs/math.md`` ("Sanity values"),
and the search finds c = s with delta = 0.

``auto_c`` is a pure function of ``(n, k, d', R)`` evaluated with the same floating-point
operations everywhere, so a server that persisted R derives the same c bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# How far the true share of the mean may be from the one the prior says: the smoothed prior
# lags a correlation that changes across rounds, and R_hat is noisy. The old rounding step of
# auto (0.1 of the correlation fraction) is the error it used to accept.
AUTO_DELTA = 0.1
# golden-section search on c in [0, 1] to this width (c's effect on the MSE is flat near
# its minimum, so 1e-9 is far below any measurable difference)
_TOL = 1e-9
_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def _u_and_slope(n: int, p: float, e: float) -> tuple[float, float]:
    qa = 1.0 + e / n
    qb = 1.0 + e + n * p
    disc = max(0.0, qb * qb - 4.0 * qa * n * p)
    root = math.sqrt(disc)
    u = 2.0 * n * p / (qb + root)
    slope = -math.inf if root == 0.0 else -(u - u * u / n) / root
    return u, slope


def mse_model(n: int, k: int, d_pad: int, r: float, c: float) -> float:
    """``n MSE / E`` of the spectral model (up to a c-independent constant).

    Parameters
    ----------
    n, k, d_pad : int
        Clients, rows per client, padded dimension.
    r : float
        Correlation R in ``[0, n - 1]``.
    c : float
        Transform coefficient in ``[0, 1]``.

    Returns
    -------
    float
        ``s A + (1 - s) B`` with ``s = (R + 1)/n`` (``inf`` where B diverges).
    """
    s = (r + 1.0) / n
    p = k / d_pad
    if c == 0.0:
        # T = 1: beta = 1/(np), A = Var(l)/(np)^2 = (1 - p)/(np), B = 1/(np)
        return s * (1.0 - p) / (n * p) + (1.0 - s) / (n * p)
    e = (1.0 - c) / c
    u, slope = _u_and_slope(n, p, e)
    if math.isinf(slope):
        return math.inf if s < 1.0 else (u + 0.0) / (u * u) - 1.0
    a = (u + e * slope) / (u * u) - 1.0
    b = -slope / (u * u)
    return s * a + (1.0 - s) * b


def _argmin(f: Callable[[float], float]) -> float:
    """Golden-section minimum of a unimodal ``f`` on ``[0, 1]``, ends included."""
    lo, hi = 0.0, 1.0
    x1 = hi - _INV_PHI * (hi - lo)
    x2 = lo + _INV_PHI * (hi - lo)
    f1, f2 = f(x1), f(x2)
    while hi - lo > _TOL:
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - _INV_PHI * (hi - lo)
            f1 = f(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + _INV_PHI * (hi - lo)
            f2 = f(x2)
    best = 0.5 * (lo + hi)
    return min((f(0.0), 0.0), (f(best), best), (f(1.0), 1.0))[1]


def auto_c(n: int, k: int, d_pad: int, r: float, delta: float = AUTO_DELTA) -> float:
    """c for the prior correlation ``r``: least worst-case regret for ``s`` within ``delta``.

    Parameters
    ----------
    n, k, d_pad : int
        Clients decoded together, rows per client, padded dimension.
    r : float
        Prior correlation R, clipped to ``[0, n - 1]``.
    delta : float
        How far the true share ``s = (R + 1)/n`` may be from the prior's.

    Returns
    -------
    float
        ``argmin_c max_{s'} [F(c; s') - F(s'; s')]`` over ``s'`` in
        ``[s - delta, s + delta]`` (within ``[1/n, 1]``), F the :func:`mse_model`; with
        ``delta = 0`` this is ``(R + 1)/n``.
    """
    if n <= 1:
        return 0.0
    r = min(float(n - 1), max(0.0, float(r)))
    s = (r + 1.0) / n
    ends = [max(1.0 / n, s - delta), min(1.0, s + delta)]
    # the regret is convex in s' (F(c; s') is affine in s', F(s'; s') = min_c F(c; s') is
    # concave), so its maximum over the interval is at an end
    floors = [mse_model(n, k, d_pad, end * n - 1.0, end) for end in ends]

    def regret(c: float) -> float:
        return max(
            mse_model(n, k, d_pad, end * n - 1.0, c) - floor
            for end, floor in zip(ends, floors, strict=True)
        )

    return _argmin(regret)
