"""beta: exact values where they exist, Monte Carlo with its error recorded and cached."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

import rpsagg
from rpsagg import _beta

pytestmark = pytest.mark.unit


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RPSAGG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_beta, "_memory", {})
    return tmp_path


def test_exact_betas() -> None:
    n, k, d = 10, 8, 200
    one = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="one")
    assert one.beta_bar == d / (n * k)  # the default projection for d = 200: the DCT, no pad
    one = rpsagg.make_estimator(
        "rand-proj-spatial", n=n, k=k, d=d, transform="one", projection="srht"
    )
    assert one.beta_bar == 256 / (n * k)  # d' / (nk) with d' = 256
    assert rpsagg.make_estimator("rand-k", n=n, k=k, d=d).beta_for(4) == d / (4 * k)
    spatial = rpsagg.make_estimator("rand-k-spatial", n=n, k=k, d=d, transform="max")
    # max: T(M) = M; E[1/(1+B)] with B ~ Bin(n-1, p) = (1 - (1-p)^n) / (n p)
    p = k / d
    assert spatial.beta_bar == pytest.approx(d / (n * k * (1 - (1 - p) ** n) / (n * p)), rel=1e-12)
    b = np.arange(n)
    avg = rpsagg.make_estimator("rand-k-spatial", n=n, k=k, d=d, transform="avg")
    c = n / (2 * (n - 1))
    expect = np.sum(binom.pmf(b, n - 1, p) / (1 - c + c * (1 + b)))
    assert avg.beta_bar == pytest.approx(d / (n * k * expect), rel=1e-12)


def test_max_beta_is_d_over_rank_when_full_rank(fresh_cache: Path) -> None:
    est = rpsagg.make_estimator("rand-proj-spatial", n=4, k=8, d=256, transform="max")
    details = est.beta_details()  # type: ignore[attr-defined]
    assert details.rel_se == 0.0  # rank is nk in every sample
    assert est.beta_bar == pytest.approx(256 / 32, rel=1e-12)


def test_monte_carlo_beta_is_cached_with_its_error(fresh_cache: Path) -> None:
    est = rpsagg.make_estimator("rand-proj-spatial", n=5, k=6, d=64, transform="avg")
    beta = est.beta_bar
    files = list(fresh_cache.glob("beta-*.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert record["beta"] == beta
    assert 0 < record["rel_se"] <= 1e-3
    assert record["samples"] >= _beta.MIN_SAMPLES
    # the SRHT's numbers are the same in every spec version: its key names v1
    assert "n=5|k=6|dpad=64" in record["key"] and "rpsagg-seed-v1" in record["key"]
    # a new process (empty memory) reads the file instead of recomputing
    _beta._memory.clear()
    files[0].write_text(json.dumps({**record, "beta": beta * 2, "mean": record["mean"] / 2}))
    assert est.beta_for(5) == beta * 2
    # a corrupt file is ignored and recomputed
    _beta._memory.clear()
    files[0].write_text("{not json")
    assert est.beta_for(5) == pytest.approx(beta, rel=1e-12)


def test_monte_carlo_beta_agrees_with_hutchinson(fresh_cache: Path) -> None:
    # Two independent estimators of E[sum l / T(l)]: exact spectra and Hutchinson's trace
    # estimator. Each is within 4 standard errors of the truth, so their difference is
    # within 4 * sqrt(se1^2 + se2^2).
    n, k, d_pad, c = 6, 10, 256, 0.6
    eig = np.array([_beta.spectral_sample(n, k, d_pad, c, s)[0] for s in range(40)])
    limit = _beta.EXACT_LIMIT
    try:
        _beta.EXACT_LIMIT = 0
        hutch_vals = [_beta.spectral_sample(n, k, d_pad, c, s, svd=False) for s in range(300)]
    finally:
        _beta.EXACT_LIMIT = limit
    assert {m for _, m in hutch_vals} == {"mc-hutchinson"}
    hutch = np.array([v for v, _ in hutch_vals])
    se = np.hypot(eig.std(ddof=1) / np.sqrt(eig.size), hutch.std(ddof=1) / np.sqrt(hutch.size))
    assert abs(eig.mean() - hutch.mean()) <= 4 * se
    assert se < 0.01 * eig.mean()


def test_matrix_free_rank_estimate_matches_exact_ranks(fresh_cache: Path) -> None:
    # c = 1 at large nk uses z^T P z with P = A A^+ (LSQR). For a full-rank sample P = I and
    # z^T z = nk exactly for a Rademacher z; for a deficient one it is nk - sum (v.z)^2,
    # with expectation the rank. At d' = nk = 32 some samples are deficient.
    n, k, d_pad, samples = 4, 8, 32, 300
    exact = np.array([_beta.spectral_sample(n, k, d_pad, 1.0, s)[0] for s in range(samples)])
    # K is ill-conditioned at d' = nk (condition number ~1e6), a regime where the decoder
    # never picks the matrix-free path; the production LSQR tolerance (sized for nk << d')
    # is tightened here so that the test checks the estimator, not the solver's stopping.
    limit, rtol = _beta.EXACT_LIMIT, _beta.HUTCHINSON_RTOL
    try:
        _beta.EXACT_LIMIT, _beta.HUTCHINSON_RTOL = 0, 1e-12
        hutch = np.array(
            [_beta.spectral_sample(n, k, d_pad, 1.0, s, svd=False)[0] for s in range(samples)]
        )
    finally:
        _beta.EXACT_LIMIT, _beta.HUTCHINSON_RTOL = limit, rtol
    full = exact == n * k
    assert 0 < (~full).sum() < samples
    np.testing.assert_allclose(hutch[full], n * k, rtol=1e-6)
    assert np.all(hutch[~full] <= n * k * (1 + 1e-9))  # nk - (v.z)^2, and v.z can be 0
    diff = (n * k - hutch) - (n * k - exact)
    assert abs(diff.mean()) <= 4 * diff.std(ddof=1) / np.sqrt(samples)
