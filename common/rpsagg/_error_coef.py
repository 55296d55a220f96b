"""The coefficients of the MSE's form ``a * sum_i ||x_i||^2 + b * sum_{i != l} <x_i, x_l>``.

Every decode of the sketch families is linear, ``x_hat = sum_i A_i x_i``, so
``E||x_hat - x_bar||^2 = sum_{i,l} x_i^T M_il x_l`` with ``M_il = E[(A_i - I/n)^T (A_l - I/n)]``.
Where the joint law of the transforms is invariant under a group acting transitively on
signed coordinates, ``M_il`` is a multiple of I and, clients being exchangeable,
``M_ii = a I`` and ``M_il = b I`` (``docs/error-estimate.md`` has the argument):

* Rand-k (coordinate sampling, invariant under all coordinate permutations):
  ``a = (d/k - 1) / n^2``, ``b = 0``, exact.
* Rand-k-Spatial: per coordinate, with ``p = k/d``, ``B_m ~ Binomial(m, p)`` and
  ``beta`` the scheme's, ``a = beta^2 p E[1/T(1 + B_{n-1})^2] - 1/n^2`` and
  ``b = beta^2 p^2 E[1/T(2 + B_{n-2})^2] - 1/n^2``, exact from the binomial pmf.
* Rand-Proj-Spatial with the SRHT (d a power of two; signed XOR shifts): with the
  eigenvalues ``l`` of ``S = sum_i G_i^T G_i`` and the sums ``s1 = sum l/T(l)``,
  ``s2 = sum l/T(l)^2``, ``s3 = sum (l/T(l))^2`` over the non-zero ones (D = d'),

      a = beta^2 E[s2] / (n D) - 2 beta E[s1] / (n^2 D) + 1/n^2
      n a + n (n - 1) b = beta^2 E[s3] / D - 2 beta E[s1] / D + 1

  (the second is the MSE of identical unit vectors, ``E tr((beta T(S)^+ S - I)^2) / D``).
  Two paths, like beta's: the free-probability limit of the spectral law of S (closed
  form, microseconds; :func:`free_coefficients`) for large problems, and a Monte Carlo
  over the exact spectrum of ``K = A A^T`` for small ones (:func:`mc_coefficients`,
  cached on disk beside beta's values). hblocks and the randomized DCT use the same
  formulas with their own spectra: their laws are not exactly invariant, so the form is an
  approximation there (measured in ``docs/error-estimate.md``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

log = logging.getLogger("rpsagg")

COEF_VERSION = "errcoef-v1"
# The Monte Carlo stops at this relative standard error of both coefficients' leading sum
# or at the time budget, whichever comes first.
MC_TARGET_REL_SE = 5e-3
MC_TIME_BUDGET = 1.5
MC_MIN_SAMPLES = 8
MC_MAX_SAMPLES = 4000
# Largest nk whose spectrum the Monte Carlo computes (an eigendecomposition of nk x nk).
MC_MAX_NK = 2048
# The free limit's relative error in the predicted MSE, stated: measured at most 1.0 % against
# the Monte Carlo (D from 256 to 4096, n from 2 to 50, c from 0.5 to 1; docs/error-estimate.md),
# except at the hard edge nk = D with c close to 1, where the limit diverges while the
# finite-D MSE is finite (and huge): there the Monte Carlo runs.
FREE_REL_ERROR = 0.03
EDGE_C = 0.95
EDGE_RATIO = 1.25


@dataclass(frozen=True)
class ErrorCoefficients:
    """``a`` and ``b`` of ``MSE = a sum_i ||x_i||^2 + b sum_{i != l} <x_i, x_l>``.

    Attributes
    ----------
    a, b : float
        The coefficients for ``n`` decoded messages.
    n : int
        Messages decoded together.
    rel_se : float
        Relative standard error of the MSE they predict (Monte Carlo), the stated relative
        error of the free limit, or 0 for exact values.
    samples : int
        Monte Carlo samples (0 otherwise).
    method : str
        ``"exact"``, ``"free"`` or ``"mc"``.
    key : str
        Cache key.
    """

    a: float
    b: float
    n: int
    rel_se: float
    samples: int
    method: str
    key: str

    def squared_error(self, norms: float, cross: float) -> float:
        """``a * norms + b * cross``."""
        return self.a * norms + self.b * cross

    def relative_error(self, r: float) -> float:
        """``n^2 (a + b R) / (1 + R)``: the relative error at correlation R."""
        if r <= -1.0:
            return math.inf
        return self.n * self.n * (self.a + self.b * r) / (1.0 + r)

    def value_gain(self, dim: int, k: int) -> float:
        """``E||B_i e_j||^2``: the squared error one unit of noise on one sent value adds
        (``D (a + 1/n^2) / k``, see :mod:`rpsagg._error`)."""
        return dim * (self.a + 1.0 / (self.n * self.n)) / k


def randk_coefficients(n: int, k: int, d: int) -> ErrorCoefficients:
    """Rand-k's exact coefficients (also Rand-Proj-Spatial with ``T = one``, D for d)."""
    return ErrorCoefficients((d / k - 1.0) / (n * n), 0.0, n, 0.0, 0, "exact",
                             f"rand-k|n={n}|k={k}|d={d}")


def spatial_coefficients(n: int, k: int, d: int, c: float, beta: float) -> ErrorCoefficients:
    """Rand-k-Spatial's exact coefficients from the binomial pmf (see the module text)."""
    from scipy.stats import binom

    p = k / d

    def inv_t2(count: int, base: int) -> float:
        if count < 0:
            return 0.0
        m = np.arange(count + 1)
        t = (1.0 - c) + c * (base + m)
        return float(np.sum(binom.pmf(m, count, p) / (t * t)))

    a = beta * beta * p * inv_t2(n - 1, 1) - 1.0 / (n * n)
    b = (beta * beta * p * p * inv_t2(n - 2, 2) - 1.0 / (n * n)) if n > 1 else 0.0
    return ErrorCoefficients(a, b, n, 0.0, 0, "exact",
                             f"rand-k-spatial|n={n}|k={k}|d={d}|c={c!r}")


def _free_u(n: int, p: float, e: float) -> tuple[float, float]:
    """``u(e) = int l / (e + l) dmu`` and ``du/de`` for ``mu`` the free convolution of n
    Bernoulli(p) laws (``rpsagg._beta_free``: ``(1 + e/n) u^2 - (1 + e + np) u + np = 0``)."""
    qa = 1.0 + e / n
    qb = 1.0 + e + n * p
    disc = max(0.0, qb * qb - 4.0 * qa * n * p)
    u = 2.0 * n * p / (qb + math.sqrt(disc))
    # implicit derivative of the quadratic: (u^2/n) + 2 qa u u' - u - qb u' = 0
    denom = 2.0 * qa * u - qb
    du = -math.inf if denom == 0.0 else (u - u * u / n) / denom
    return u, du


def free_coefficients(n: int, k: int, dim: int, c: float) -> ErrorCoefficients:
    """The coefficients of Rand-Proj-Spatial from the free-probability limit of S's spectrum.

    With ``e = (1 - c)/c``, ``l/T(l) = (1/c) l/(e + l)``: ``int l/T dmu = u/c``,
    ``int l/T^2 dmu = -u'/c^2`` and ``int (l/T)^2 dmu = (u + e u')/c^2``; beta is ``c/u``
    (the free limit's own), so ``a = -u'/(n u^2) - 1/n^2`` and
    ``n a + n(n-1) b = (u + e u')/u^2 - 1``.
    """
    key = f"rps-free|n={n}|k={k}|D={dim}|c={c!r}"
    if c == 0.0 or n == 1:
        return ErrorCoefficients((dim / k - 1.0) / (n * n), 0.0, n, 0.0, 0, "exact", key)
    p = k / dim
    e = (1.0 - c) / c
    u, du = _free_u(n, p, e)
    a = -du / (n * u * u) - 1.0 / (n * n)
    same = (u + e * du) / (u * u) - 1.0
    b = (same - n * a) / (n * (n - 1))
    return ErrorCoefficients(a, b, n, FREE_REL_ERROR, 0, "free", key)


def _spectral_sums(n: int, k: int, dim: int, c: float, sample: int,
                   projection: str) -> tuple[float, float, float]:
    """``(s1, s2, s3)`` over the non-zero eigenvalues of K for Monte Carlo sample ``sample``."""
    import scipy.linalg

    from rpsagg._beta import mc_seeds
    from rpsagg._decode import eig_tolerance
    from rpsagg._projection import joint_operator

    op = joint_operator(projection, mc_seeds(sample, n), k, dim)
    w = scipy.linalg.eigvalsh(op.gram(), check_finite=False)
    w = w[w > eig_tolerance(float(np.max(w)), n * k, dim)]
    f = w / ((1.0 - c) + c * w)
    return float(f.sum()), float(np.sum(f / ((1.0 - c) + c * w))), float(np.sum(f * f))


def mc_coefficients(n: int, k: int, dim: int, c: float, beta: float, projection: str = "srht",
                    *, time_budget: float = MC_TIME_BUDGET) -> ErrorCoefficients:
    """The coefficients by Monte Carlo over the exact spectrum of K (cached on disk).

    ``beta`` is the decode's (so the coefficients describe the estimator as decoded). The
    relative standard error reported is that of ``beta^2 E[s2]`` and ``beta^2 E[s3]``
    (whichever is larger), which carry the MSE.
    """
    key = (f"rps-mc|n={n}|k={k}|D={dim}|c={c!r}|proj={projection}|beta={beta!r}"
           f"|{COEF_VERSION}")
    cached = _load(key)
    if cached is not None:
        return cached
    from rpsagg._decode import one_blas_thread

    start = time.monotonic()
    rows: list[tuple[float, float, float]] = []
    rel_se = math.inf
    with one_blas_thread():
        while len(rows) < MC_MAX_SAMPLES:
            rows.append(_spectral_sums(n, k, dim, c, len(rows), projection))
            if len(rows) >= MC_MIN_SAMPLES:
                arr = np.asarray(rows)
                se = arr.std(axis=0, ddof=1) / math.sqrt(len(rows))
                mean = np.abs(arr.mean(axis=0))
                rel_se = float(max(se[1] / mean[1], se[2] / mean[2]))
                if rel_se <= MC_TARGET_REL_SE or time.monotonic() - start > time_budget:
                    break
    s1, s2, s3 = np.asarray(rows).mean(axis=0)
    a = beta * beta * s2 / (n * dim) - 2.0 * beta * s1 / (n * n * dim) + 1.0 / (n * n)
    same = beta * beta * s3 / dim - 2.0 * beta * s1 / dim + 1.0
    b = (same - n * a) / (n * (n - 1))
    est = ErrorCoefficients(float(a), float(b), n, rel_se, len(rows), "mc", key)
    _store(est)
    return est


_memory: dict[str, ErrorCoefficients] = {}
_lock = threading.Lock()


def rps_coefficients(n: int, k: int, dim: int, c: float, beta: float,
                     projection: str = "srht") -> ErrorCoefficients:
    """Rand-Proj-Spatial's coefficients for ``n`` messages.

    Exact for ``c = 0`` or one message; the free limit (:func:`free_coefficients`)
    elsewhere, except near the hard edge (``c >= EDGE_C`` and ``nk/D`` within
    ``EDGE_RATIO`` of 1, or a limit that is not finite), where the Monte Carlo over the exact
    spectrum runs (:func:`mc_coefficients`, time-bounded and cached) while ``nk <=
    MC_MAX_NK``.

    Parameters
    ----------
    n, k, dim : int
        Messages decoded together, values per message, the dimension the projection acts in.
    c : float
        Transform coefficient of ``T(l) = (1 - c) + c l``.
    beta : float
        The decode's beta.
    projection : {"srht", "dct", "hblocks"}
        The projection.

    Returns
    -------
    ErrorCoefficients
    """
    if c == 0.0 or n == 1:
        return randk_coefficients(n, k, dim)
    free = free_coefficients(n, k, dim, c)
    ratio = n * k / dim
    edge = c >= EDGE_C and 1.0 / EDGE_RATIO <= ratio <= EDGE_RATIO
    if not (edge or not (math.isfinite(free.a) and math.isfinite(free.b))):
        return free
    if n * k > MC_MAX_NK:
        return replace(free, rel_se=math.inf)
    mkey = f"{n}|{k}|{dim}|{c!r}|{beta!r}|{projection}"
    with _lock:
        hit = _memory.get(mkey)
    if hit is not None:
        return hit
    est = mc_coefficients(n, k, dim, c, beta, projection)
    with _lock:
        _memory[mkey] = est
    return est


def _path(key: str) -> Path:
    from rpsagg._beta import cache_dir

    return cache_dir() / f"errcoef-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _load(key: str) -> ErrorCoefficients | None:
    try:
        est = ErrorCoefficients(**json.loads(_path(key).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if est.key != key or not (math.isfinite(est.a) and math.isfinite(est.b)):
        return None
    return est


def _store(est: ErrorCoefficients) -> None:
    path = _path(est.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".errcoef-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(est), fh, indent=1)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache must not break decoding
        log.warning("could not write the error-coefficient cache in %s: %s", path.parent, exc)


def expected_max_abs_normal(k: int) -> float:
    """``E max_j |g_j|`` over k standard normals (a numerical integral; cached)."""
    if k in _max_cache:
        return _max_cache[k]
    from scipy.integrate import quad
    from scipy.stats import norm

    value = float(quad(lambda t: 1.0 - (2.0 * norm.cdf(t) - 1.0) ** k, 0.0, np.inf,
                       limit=200)[0])
    _max_cache[k] = value
    return value


_max_cache: dict[int, float] = {}


def quantized_relative_extra(coef: ErrorCoefficients, k: int, value_bits: int,
                             r: float) -> float:
    """The relative error that b-bit uniform values add, for planning.

    Values are modelled as Gaussian of variance ``A / (n D)`` per client (what the random
    rotation gives); the scale ``m`` is their expected largest magnitude ``g_k sqrt(A/(nD))``
    and each value's rounding variance is ``step^2/6``, ``step = 2m/(2^b - 1)``. With the
    noise gain ``D (a + 1/n^2) / k`` per value this is
    ``(2/3) g_k^2 n^2 (a + 1/n^2) / ((2^b - 1)^2 (1 + R))``.
    """
    if value_bits >= 32 or r <= -1.0:
        return 0.0
    levels = (1 << value_bits) - 1
    g = expected_max_abs_normal(k)
    n = coef.n
    return (2.0 / 3.0) * g * g * n * n * (coef.a + 1.0 / (n * n)) / (levels * levels * (1.0 + r))
