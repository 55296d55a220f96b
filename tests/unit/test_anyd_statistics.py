"""Statistics of the projections defined for every d (hblocks, the default for d not a
power of two, and the randomized DCT) at d = 300, where the SRHT pads to d' = 512.

The same tests, with the same seeds, run for both projections; each derivation below holds
for any G with orthonormal rows whose joint law is invariant under a common signed cyclic
shift (both projections add a random shift per client for that reason: rpsagg._dct and
rpsagg._hblocks).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import rpsagg

pytestmark = pytest.mark.unit

PROJECTIONS = ["hblocks", "dct"]


def _estimator(projection: str, **kwargs: Any) -> rpsagg.Estimator:
    """hblocks is built without naming it (it is the default for d not a power of two)."""
    if projection != "hblocks":
        kwargs["projection"] = projection
    return rpsagg.make_estimator("rand-proj-spatial", **kwargs)


def _squared_errors(est: rpsagg.Estimator, xs: np.ndarray, trials: int, salt: int) -> np.ndarray:
    out = np.empty(trials)
    n = xs.shape[1]
    for t in range(trials):
        msgs = [est.encode(xs[t, i], seed=salt + t * n + i) for i in range(n)]
        err = est.decode(msgs) - xs[t].mean(axis=0)
        out[t] = err @ err
    return out


@pytest.mark.slow
@pytest.mark.parametrize("projection", PROJECTIONS)
def test_one_has_rand_k_mse_at_d_300(projection: str) -> None:
    # n = 4 independent unit vectors, k = 100, d = 300. For any G with orthonormal rows and
    # E[G^T G] = (k/d) I, RPS(one) = (d/(nk)) sum_i G_i^T G_i x_i has
    #     E||x_hat - x_bar||^2 = (1/n^2) sum_i (d/k - 1) ||x_i||^2 = (d/k - 1)/n = 0.5,
    # Rand-k's MSE. Per trial the squared error e has a standard deviation s (estimated from
    # the trials); the mean over T trials has standard error s/sqrt(T) (about 0.002 at
    # T = 400). The test allows 4 standard errors around 0.5 (false-failure rate 6e-5).
    # The padded SRHT's mean is about 0.61 here (+21%), some 50 standard errors away.
    n, k, d, trials = 4, 100, 300, 400
    rng = np.random.default_rng(20261126)
    xs = rng.standard_normal((trials, n, d))
    xs /= np.linalg.norm(xs, axis=2, keepdims=True)
    est = _estimator(projection, n=n, k=k, d=d, transform="one")
    assert est.name == f"rand-proj-spatial:{projection}"
    errors = _squared_errors(est, xs, trials, salt=1)
    se = errors.std(ddof=1) / math.sqrt(trials)
    expected = (d / k - 1) / n
    assert abs(errors.mean() - expected) <= 4 * se, (errors.mean(), expected, se)


@pytest.mark.slow
@pytest.mark.parametrize("projection", PROJECTIONS)
def test_max_reaches_d_over_nk_minus_one_at_d_300(projection: str) -> None:
    # n = 7 identical unit vectors, k = 9, d = 300: nk = 63 < d and A has rank nk (the
    # Monte Carlo of beta checks it sample by sample: "mc-eig" returns nk only after a
    # well-conditioned Cholesky factor), T(S)^+ S = P, the projection onto range(A^T),
    # beta = d/(nk), and E[P] = (nk/d) I by the signed cyclic-shift symmetry, so
    #     E||beta P x - x||^2 = beta^2 E[x^T P x] - 2 beta E[x^T P x] + 1 = d/(nk) - 1 = 3.762.
    # The test requires the mean within 4 standard errors (about 0.08 at T = 300, from the
    # per-trial spread) of 3.762, and 4 standard errors to be under 5% of it (so the issue's
    # "within 5%" is what is checked). The padded SRHT gives 4.18 (+11%).
    n, k, d, trials = 7, 9, 300, 300
    rng = np.random.default_rng(7)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    xs = np.broadcast_to(u, (trials, n, d))
    est = _estimator(projection, n=n, k=k, d=d, transform="max")
    if projection == "hblocks":
        assert est.beta_for(n) == pytest.approx(d / (n * k), rel=1e-12)
    errors = _squared_errors(est, xs, trials, salt=10**6)
    se = errors.std(ddof=1) / math.sqrt(trials)
    expected = d / (n * k) - 1
    assert 4 * se < 0.05 * expected
    assert abs(errors.mean() - expected) <= 4 * se, (errors.mean(), expected, se)


@pytest.mark.slow
@pytest.mark.parametrize(("projection", "d"), [("hblocks", 300), ("hblocks", 1000),
                                               ("dct", 300)])
def test_avg_is_unbiased_per_coordinate(projection: str, d: int) -> None:
    # Unbiasedness needs E[T(S)^+ G_i^T G_i] = alpha I (the random cyclic shift and signs
    # give it) and beta = d / E[sum_j l_j / T(l_j)] from the projection's own spectrum
    # (Monte Carlo; a 5% error in beta fails this test). The input x = e_0 + e_{d/2} sits at
    # both ends of the DCT's structure and in both of hblocks' blocks; hblocks at d = 1000
    # (b = 512, overlap 24) is the case where its blocks barely overlap. Averaging the avg
    # estimate of n = 5 identical vectors over T trials, each coordinate's mean has standard
    # error s_j/sqrt(T) (s_j its per-trial spread); a coordinate more than 4.5 standard
    # errors off fails (d coordinates: false-failure rate at most 1000 * 7e-6 = 7e-3), and
    # the mean of the standardized biases must be within 4/sqrt(d) of 0.
    n, k, trials = 5, 12, 600
    x = np.zeros(d)
    x[0] = x[d // 2] = 1.0
    est = _estimator(projection, n=n, k=k, d=d, transform="avg")
    total = np.zeros(d)
    total_sq = np.zeros(d)
    for t in range(trials):
        msgs = [est.encode(x, seed=7 + t * n + i) for i in range(n)]
        e = est.decode(msgs)
        total += e
        total_sq += e * e
    mean = total / trials
    sd = np.sqrt((total_sq - trials * mean * mean) / (trials - 1))
    z = (mean - x) / (sd / math.sqrt(trials))
    assert np.max(np.abs(z)) <= 4.5, (int(np.argmax(np.abs(z))), float(np.max(np.abs(z))))
    assert abs(float(z.mean())) <= 4 / math.sqrt(d)


@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("c", [0.6, 1.0])
def test_beta_samples_agree_between_exact_and_hutchinson(
    projection: str, c: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # beta's Monte Carlo takes each sample from the exact spectrum of K while the Gram
    # matrix is affordable, and from Hutchinson's estimator (matrix-free) beyond. For the
    # same client seeds, Hutchinson's value is an unbiased estimate of the exact one, so the
    # differences over S samples have mean 0; the test allows 4 standard errors of their
    # mean (from their spread), and also requires them to be non-zero (two paths ran). A
    # wrong Hutchinson formula (e.g. a (1 - c) factor lost) moves the mean by far more.
    from rpsagg import _beta, _dct

    n, k, d, samples = 4, 8, 60, 40
    exact = [_beta.spectral_sample(n, k, d, c, s, projection) for s in range(samples)]
    monkeypatch.setattr(_dct, "EXACT_FLOPS_LIMIT", 0)
    hutch = [_beta.spectral_sample(n, k, d, c, s, projection) for s in range(samples)]
    assert {m for _, m in exact} == {"mc-eig"} and {m for _, m in hutch} == {"mc-hutchinson"}
    diff = np.array([h for h, _ in hutch]) - np.array([e for e, _ in exact])
    if c == 1.0:
        # max: the sample is rank(K) = nk = 32 (full rank, nk < d); Hutchinson's z^T P z
        # with P = I on R^{nk} equals it up to LSQR's relative tolerance (1e-6)
        assert all(e == n * k for e, _ in exact)
        assert np.max(np.abs(diff)) <= 1e-6 * n * k
        return
    assert np.all(diff != 0.0)
    assert abs(diff.mean()) <= 4 * diff.std(ddof=1) / math.sqrt(samples), diff.mean()
