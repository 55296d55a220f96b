"""The unbiasing scalars beta: exact where a formula exists, free probability or Monte Carlo.

Rand-Proj-Spatial needs ``beta = d' / E[sum_j l_j / T(l_j)]`` over the non-zero
eigenvalues ``l_j`` of ``S`` (equivalently of ``K = A A^T``). For ``c = 0`` the sum is the
trace ``nk`` exactly. Otherwise one of two paths, chosen by :func:`beta_path`:

- ``"free"``: the closed-form limit of the sum (free additive convolution of n Bernoulli
  laws, :mod:`rpsagg._beta_free`), in microseconds, where its stated error bound
  ``FREE_ABS_ERROR / E`` is at most ``FREE_MAX_REL_ERROR``: the sum E is large, i.e.
  ``min(nk, d')`` is large;
- ``"mc"``: Monte Carlo over client seeds, where the sum is small (and so the problem is;
  the free limit's O(1) absolute error would be too large a relative error). Each sample is
  exact: the singular values of the explicit ``nk x d'`` matrix A while it is small, else
  the spectrum of K, and Hutchinson's trace estimator on
  ``tr(K M^-1) = (nk - (1 - c) tr(M^-1)) / c`` with matrix-free solves beyond that. Samples
  are drawn until the relative standard error of the mean is at most ``1e-3``, and the value
  is cached on disk per ``(scheme, n, k, d', c, spec version)`` with that standard error.

:func:`rps_beta_mc` forces the Monte Carlo; it is the reference the free path is measured
against (``bench/beta_paths.py``).
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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rpsagg._beta_free import free_error_bound, free_is_accurate, free_spectral_sum
from rpsagg._decode import EXACT_LIMIT, eig_tolerance, one_blas_thread, solve_krylov, solve_lsqr
from rpsagg._fwht import fwht
from rpsagg._srht import JointSRHT
from rpsagg.spec import (
    FEATURE_SPEC,
    TAG_MCBETA,
    TAG_MCPROBE,
    stream_key,
    stream_words,
    uniforms,
)

log = logging.getLogger("rpsagg")

MC_VERSION = "mc-v2"
TARGET_REL_SE = 1e-3
MIN_SAMPLES = 10  # with the exact spectral sum
MIN_SAMPLES_HUTCHINSON = 6  # each sample is a full solve; its variance is small
HUTCHINSON_RTOL = 1e-6
MAX_SAMPLES = 20000
# A Monte Carlo sample takes the singular values of the explicit nk x d' matrix A while
# nk * d' * min(nk, d') (the SVD's cost) is at most this; K's Gram path beyond.
SVD_LIMIT = 2**28
DEFAULT_TIME_BUDGET = 900.0


@dataclass(frozen=True)
class BetaEstimate:
    """A cached value of ``E[sum_j l_j / T(l_j)]`` and the resulting beta.

    Attributes
    ----------
    beta : float
        ``d' / mean``.
    mean : float
        Estimated expectation of the spectral sum.
    rel_se : float
        Relative standard error of ``mean`` (and so of beta, to first order) for Monte
        Carlo; the stated relative error bound for ``"free"``; 0 for ``"exact"``.
    samples : int
        Monte Carlo samples used (0 for exact and free values).
    method : str
        ``"exact"``, ``"free"``, ``"mc-svd"``, ``"mc-eig"`` or ``"mc-hutchinson"``.
    key : str
        Cache key.
    """

    beta: float
    mean: float
    rel_se: float
    samples: int
    method: str
    key: str


def spatial_beta(n: int, k: int, d: int, c: float) -> float:
    """Exact beta of Rand-k-Spatial: ``d / (n k E[1 / T(1 + B)])``, ``B ~ Bin(n-1, k/d)``."""
    from scipy.stats import binom

    b = np.arange(n)
    pmf = binom.pmf(b, n - 1, k / d)
    expect = float(np.sum(pmf / ((1.0 - c) + c * (1.0 + b))))
    return d / (n * k * expect)


def cache_dir() -> Path:
    """Directory of the on-disk beta cache.

    ``$RPSAGG_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/rpsagg``, else ``~/.cache/rpsagg``.
    """
    env = os.environ.get("RPSAGG_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "rpsagg"


_memory: dict[str, BetaEstimate] = {}
_lock = threading.Lock()


def _rps_key(n: int, k: int, d_pad: int, c: float, projection: str = "srht") -> str:
    """The cache key of a Rand-Proj-Spatial beta (the disk cache's namespace is the scheme)."""
    return _key("rand-proj-spatial", n, k, d_pad, c, projection)


def _key(scheme: str, n: int, k: int, d_pad: int, c: float, projection: str = "srht") -> str:
    # A projection's numbers are the same in every spec version from the one that defines
    # it (rpsagg.spec.FEATURE_SPEC): its keys (and caches) name that version (SRHT v1, DCT
    # v2, hblocks v4).
    proj = "" if projection == "srht" else f"|proj={projection}"
    spec = FEATURE_SPEC[projection]
    return f"{scheme}|n={n}|k={k}|dpad={d_pad}|c={c!r}{proj}|{spec}|{MC_VERSION}"


def _load(key: str) -> BetaEstimate | None:
    path = cache_dir() / f"beta-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    try:
        data = json.loads(path.read_text())
        est = BetaEstimate(**data)
    except (OSError, ValueError, TypeError):
        return None
    if est.key != key or not math.isfinite(est.beta) or est.beta <= 0:
        return None
    return est


def _store(est: BetaEstimate) -> None:
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"beta-{hashlib.sha256(est.key.encode()).hexdigest()[:24]}.json"
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".beta-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(est), fh, indent=1)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home must not break decoding
        log.warning("could not write beta cache in %s: %s", directory, exc)


def mc_seeds(sample: int, n: int) -> list[int]:
    """Client seeds of Monte Carlo sample ``sample`` (deterministic)."""
    words = stream_words(stream_key(0, TAG_MCBETA), sample * n, n)
    return [int(w) for w in words]


def explicit_rows(op: JointSRHT) -> np.ndarray:
    """The ``nk x d'`` matrix A of ``op`` (row ``(i, p)`` is ``(1/sqrt(d')) (H e_r) * s_i``).

    For the Monte Carlo of small problems only (the caller bounds ``nk * d'``).
    """
    n, k, d_pad = op.n, op.k, op.d_pad
    rows = np.zeros((n * k, d_pad))
    rows[np.arange(n * k), op.rows.reshape(-1)] = 1.0
    fwht(rows, inplace=True)
    rows *= np.repeat(op.signs, k, axis=0)
    rows *= 1.0 / math.sqrt(d_pad)
    return rows


def _svd_sum(op: JointSRHT, c: float) -> float:
    import scipy.linalg

    sv = scipy.linalg.svdvals(explicit_rows(op), check_finite=False)
    w = sv * sv
    nk = op.n * op.k
    w = w[w > eig_tolerance(float(w.max()), nk, op.d_pad)]
    return float(np.sum(w / ((1.0 - c) + c * w)))


def spectral_sample(
    n: int, k: int, d_pad: int, c: float, sample: int, projection: str = "srht", *,
    svd: bool | None = None,
) -> tuple[float, str]:
    """One unbiased sample of ``sum_j l_j / T(l_j)`` for the clients of sample ``sample``.

    ``d_pad`` is the dimension the projection acts in (``d`` for ``"dct"`` and ``"hblocks"``).
    ``svd`` forces (True) or forbids (False) the explicit-A path (SRHT only); by default it
    is taken while ``nk * d' * min(nk, d') <= SVD_LIMIT``.
    """
    import scipy.linalg

    from rpsagg._projection import joint_operator

    nk = n * k
    if projection != "srht":
        if svd:
            raise ValueError("the explicit-A (svd) path is the SRHT's only")
        svd = False
    elif svd is None:
        svd = nk * d_pad * min(nk, d_pad) <= SVD_LIMIT
    if svd:
        return _svd_sum(JointSRHT.from_seeds(mc_seeds(sample, n), k, d_pad), c), "mc-svd"
    op = joint_operator(projection, mc_seeds(sample, n), k, d_pad)
    # The DCT's and hblocks' Gram matrices cost (nk)^2 d; where that is too much, Hutchinson.
    if nk <= EXACT_LIMIT and getattr(op, "exact_affordable", lambda: True)():
        gram = op.gram()
        if c == 1.0 and nk <= d_pad:
            # full rank iff the Cholesky factorization succeeds and is well conditioned
            try:
                factor = scipy.linalg.cholesky(gram, lower=True, check_finite=False)
                anorm = float(np.abs(gram).sum(axis=0).max())
                rcond, info = scipy.linalg.lapack.dpocon(factor, anorm, uplo="L")
                if info == 0 and rcond > 1e-12:
                    return float(nk), "mc-eig"
            except np.linalg.LinAlgError:
                pass
        if c < 1.0:
            # M = (1-c) I + c K is positive definite: tr(K M^-1) = (nk - (1-c) tr(M^-1)) / c
            # with tr(M^-1) = ||L^-1||_F^2 from its Cholesky factor L (exact, and about ten
            # times cheaper than an eigendecomposition).
            m = c * gram
            m[np.diag_indices(nk)] += 1.0 - c
            try:
                factor = scipy.linalg.cholesky(m, lower=True, check_finite=False)
                inv, info = scipy.linalg.lapack.dtrtri(factor, lower=1)
                if info == 0:
                    return (nk - (1.0 - c) * float(np.sum(inv * inv))) / c, "mc-eig"
            except np.linalg.LinAlgError:
                pass
        w = scipy.linalg.eigvalsh(gram, check_finite=False)
        tol = eig_tolerance(float(np.max(w)), nk, d_pad)
        w = w[w > tol]
        return float(np.sum(w / ((1.0 - c) + c * w))), "mc-eig"
    z = np.where(uniforms(sample, TAG_MCPROBE, nk) < 0.5, -1.0, 1.0)
    if c == 1.0:
        # rank(K) = tr(P) with P = A A^+ the projection onto range(A): E[z^T P z] = rank,
        # and z^T P z = ||A A^+ z||^2 with A^+ z from LSQR.
        x, _, _, _ = solve_lsqr(op, z, rtol=HUTCHINSON_RTOL)
        projected = op.forward(x).reshape(-1)
        return float(projected @ projected), "mc-hutchinson"
    # Hutchinson with a Rademacher probe z: E[z^T M^-1 z] = tr(M^-1), and
    # tr(K M^-1) = (nk - (1 - c) tr(M^-1)) / c. The solve's relative error rtol moves the
    # sample by at most cond(M) * rtol relative, far below the 1e-3 target.
    sol, _, _ = solve_krylov(op, z, c, rtol=HUTCHINSON_RTOL)
    return (nk - (1.0 - c) * float(z @ sol)) / c, "mc-hutchinson"


def beta_path(n: int, k: int, d_pad: int, c: float) -> str:
    """Which path :func:`rps_beta` takes: ``"exact"``, ``"free"`` or ``"mc"``.

    exact for ``c = 0`` or one client; free where the free limit's stated error bound
    (``FREE_ABS_ERROR`` over the spectral sum) is at most ``FREE_MAX_REL_ERROR``; else mc.
    """
    if c == 0.0 or n == 1:
        return "exact"
    return "free" if free_is_accurate(n, k, d_pad, c) else "mc"


def rps_beta(
    n: int,
    k: int,
    d_pad: int,
    c: float,
    projection: str = "srht",
    *,
    target_rel_se: float = TARGET_REL_SE,
    time_budget: float = DEFAULT_TIME_BUDGET,
) -> BetaEstimate:
    """beta of Rand-Proj-Spatial with ``T(l) = (1 - c) + c l`` for ``n`` clients.

    Parameters
    ----------
    n, k, d_pad : int
        Clients decoded together, rows per client, and the dimension the projection acts in:
        ``d'`` for the SRHT, ``d`` for the randomized DCT and hblocks, whose beta is
        ``d / E[...]`` by the same argument and whose spectra have the same free-probability
        limit (checked in ``tests/unit/test_beta_free.py``).
    c : float
        Transform coefficient in ``[0, 1]``.
    projection : {"srht", "dct", "hblocks"}
        The seeded projection (see :func:`rpsagg._projection.resolve_projection`).
    target_rel_se, time_budget : float
        Monte Carlo stopping rule (relative standard error; seconds), where it runs.

    Returns
    -------
    BetaEstimate
    """
    path = beta_path(n, k, d_pad, c)
    if path == "mc":
        return rps_beta_mc(n, k, d_pad, c, projection, target_rel_se=target_rel_se,
                           time_budget=time_budget)
    key = _rps_key(n, k, d_pad, c, projection)
    if path == "exact":
        return BetaEstimate(d_pad / (n * k), float(n * k), 0.0, 0, "exact", key)
    mean = free_spectral_sum(n, k, d_pad, c)
    return BetaEstimate(d_pad / mean, mean, free_error_bound(n, k, d_pad, c), 0, "free", key)


def rps_beta_mc(
    n: int,
    k: int,
    d_pad: int,
    c: float,
    projection: str = "srht",
    *,
    target_rel_se: float = TARGET_REL_SE,
    time_budget: float = DEFAULT_TIME_BUDGET,
) -> BetaEstimate:
    """beta by Monte Carlo (cached), whatever :func:`beta_path` says: the reference path."""
    key = _rps_key(n, k, d_pad, c, projection)
    with _lock:
        if key in _memory:
            return _memory[key]
    if c == 0.0 or n == 1:
        est = BetaEstimate(d_pad / (n * k), float(n * k), 0.0, 0, "exact", key)
        with _lock:
            _memory[key] = est
        return est
    cached = _load(key)
    if cached is not None and cached.rel_se <= target_rel_se:
        with _lock:
            _memory[key] = cached
        return cached
    est = _monte_carlo(n, k, d_pad, c, key, target_rel_se, time_budget, projection)
    _store(est)
    with _lock:
        _memory[key] = est
    return est


def _monte_carlo(
    n: int, k: int, d_pad: int, c: float, key: str, target: float, budget: float,
    projection: str = "srht",
) -> BetaEstimate:
    with one_blas_thread():
        return _monte_carlo_loop(n, k, d_pad, c, key, target, budget, projection)


def _monte_carlo_loop(
    n: int, k: int, d_pad: int, c: float, key: str, target: float, budget: float,
    projection: str = "srht",
) -> BetaEstimate:
    start = time.monotonic()
    last_report = start
    values: list[float] = []
    method = "mc-eig"
    rel_se = math.inf
    while len(values) < MAX_SAMPLES:
        value, method = spectral_sample(n, k, d_pad, c, len(values), projection)
        values.append(value)
        count = len(values)
        minimum = MIN_SAMPLES_HUTCHINSON if method == "mc-hutchinson" else MIN_SAMPLES
        if count >= minimum:
            arr = np.asarray(values)
            mean = float(arr.mean())
            rel_se = float(arr.std(ddof=1) / math.sqrt(count) / abs(mean))
            if rel_se <= target:
                break
        now = time.monotonic()
        if now - last_report > 5.0:
            log.info("beta Monte Carlo %s: %d samples, rel. s.e. %.2e", key, count, rel_se)
            last_report = now
        if now - start > budget and count >= minimum:
            log.warning(
                "beta Monte Carlo %s stopped by its time budget at rel. s.e. %.2e", key, rel_se
            )
            break
    arr = np.asarray(values)
    mean = float(arr.mean())
    return BetaEstimate(d_pad / mean, mean, rel_se, len(values), method, key)
