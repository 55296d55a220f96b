"""beta's free-probability path: the closed form, its agreement with Monte Carlo, the rule."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import rpsagg
from rpsagg import _beta
from rpsagg._beta_free import (
    FREE_ABS_ERROR,
    FREE_MAX_REL_ERROR,
    free_error_bound,
    free_spectral_sum,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RPSAGG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_beta, "_memory", {})
    return tmp_path


@pytest.mark.parametrize(("n", "k", "d_pad"), [(2, 8, 64), (10, 3, 256), (50, 40, 1024)])
def test_closed_form_matches_the_moment_expansion(n: int, k: int, d_pad: int) -> None:
    # Independent of the subordination algebra: mu's free cumulants are n times those of
    # Bernoulli(p), kappa_1 = p, kappa_2 = p(1-p), and its moments follow from non-crossing
    # partitions: m1 = K1, m2 = K2 + K1^2. For small c, l / (1 + c(l - 1)) = l - c l (l - 1)
    # + R with |R| <= c^2 l (l - 1)^2 / (1 - c n) on the support [0, n], so
    # |E/d' - (m1 - c (m2 - m1))| <= c^2 n (n + 1)^2 / (1 - c n).
    p = k / d_pad
    k1, k2 = n * p, n * p * (1 - p)
    m1, m2 = k1, k2 + k1**2
    for c in (1e-6, 1e-5):
        got = free_spectral_sum(n, k, d_pad, c) / d_pad
        tol = c * c * n * (n + 1) ** 2 / (1 - c * n)
        assert abs(got - (m1 - c * (m2 - m1))) <= tol
        # the first-order term is resolved: dropping it fails
        assert abs(got - m1) > tol


@pytest.mark.parametrize("c", [0.1, 0.5, 0.9, 0.999])
def test_closed_form_matches_the_arcsine_law(c: float) -> None:
    # Two free projections of trace 1/2 sum to the arcsine law on [0, 2] (density
    # 1 / (pi sqrt(l (2 - l))); with l = 1 - cos(theta), d mu = d theta / pi), so
    # E/d' = (1/pi) int_0^pi f(1 - cos theta) d theta, f(l) = l / (1 - c + c l); the
    # trapezoid rule on a periodic analytic integrand converges geometrically.
    theta = np.linspace(0.0, np.pi, 4001)
    lam = 1.0 - np.cos(theta)
    f = lam / (1.0 - c + c * lam)
    expect = float(np.sum(f[1:-1]) + 0.5 * (f[0] + f[-1])) * (theta[1] - theta[0]) / np.pi
    assert free_spectral_sum(2, 32, 64, c) / 64 == pytest.approx(expect, rel=1e-9)


def test_closed_form_limits() -> None:
    # c -> 0: the trace nk; c -> 1: the rank min(nk, d') (the atom at 0 has mass 1 - np).
    assert free_spectral_sum(7, 5, 64, 0.0) == 35.0
    assert free_spectral_sum(1, 5, 64, 0.7) == 5.0
    for n, k, d_pad in ((4, 8, 64), (16, 8, 64), (3, 32, 64)):
        assert free_spectral_sum(n, k, d_pad, 1.0) == min(n * k, d_pad)
        near = free_spectral_sum(n, k, d_pad, 1.0 - 1e-9)
        assert near == pytest.approx(min(n * k, d_pad), rel=1e-3)
    # with d' = k every projection is the identity: S = n I, sum = d' n / (1 - c + c n)
    assert free_spectral_sum(5, 64, 64, 0.3) == pytest.approx(64 * 5 / (0.7 + 0.3 * 5), rel=1e-12)
    with pytest.raises(ValueError, match="c must be in"):
        free_spectral_sum(2, 2, 8, 1.5)


@pytest.mark.parametrize(
    ("n", "k", "d_pad", "c", "samples"),
    [
        (16, 16, 256, 0.99, 150),  # nk = d', c near 1: the largest measured error (~0.2)
        (4, 32, 512, 0.5, 60),  # nk = d'/4
        (32, 16, 128, 0.9, 60),  # nk = 4 d'
    ],
)
def test_free_limit_agrees_with_monte_carlo(
    n: int, k: int, d_pad: int, c: float, samples: int
) -> None:
    # Monte Carlo over fixed seeds (exact spectra): |mean - E| <= 4 se except with
    # probability ~6e-5 (normal approximation; the samples are bounded and smooth), and
    # the free limit is within its stated absolute bound FREE_ABS_ERROR * min(1, 4r, 4/r)
    # of E. So |free - mean| <= bound * free + 4 se.
    vals = np.array([_beta.spectral_sample(n, k, d_pad, c, s)[0] for s in range(samples)])
    se = vals.std(ddof=1) / math.sqrt(samples)
    free = free_spectral_sum(n, k, d_pad, c)
    bound = free_error_bound(n, k, d_pad, c) * free
    assert abs(free - vals.mean()) <= bound + 4 * se
    # the check is sharper than the quantity itself: the bound is a small part of it
    assert bound + 4 * se < 0.01 * free


@pytest.mark.parametrize(
    ("n", "k", "d", "c", "samples"),
    [
        (8, 64, 1500, 0.5, 20),  # nk = d / 2.9
        (10, 40, 3000, 0.9, 20),  # nk = d / 7.5, c near 1
        (16, 32, 1800, 0.7, 20),  # nk = d / 3.5
    ],
)
def test_free_limit_holds_for_the_randomized_dct(
    n: int, k: int, d: int, c: float, samples: int
) -> None:
    # The randomized DCT (any d, no padding) has the same free-probability limit with d in
    # place of d': a sum of n independent rank-k projections made asymptotically free by
    # the random signs and shift. Same check as above, against the DCT's own exact spectra
    # (fixed seeds): |free - mean| <= bound * free + 4 se. These are cases where the rule
    # takes the free path, so this is the check that rps_beta(..., "dct") is right there.
    _check_free_path_projection(n, k, d, c, samples, "dct")


def _check_free_path_projection(n: int, k: int, d: int, c: float, samples: int,
                                projection: str) -> None:
    """A case the rule sends to the free path: the limit within its bound of the
    projection's exact spectra (|free - mean| <= bound * free + 4 se, as above), and
    rps_beta takes that path for the projection."""
    assert _beta.beta_path(n, k, d, c) == "free"
    vals = np.array([_beta.spectral_sample(n, k, d, c, s, projection)[0]
                     for s in range(samples)])
    se = vals.std(ddof=1) / math.sqrt(samples)
    free = free_spectral_sum(n, k, d, c)
    bound = free_error_bound(n, k, d, c) * free
    assert abs(free - vals.mean()) <= bound + 4 * se
    assert bound + 4 * se < 0.01 * free
    est = _beta.rps_beta(n, k, d, c, projection)
    assert est.method == "free" and est.beta == pytest.approx(d / free, rel=1e-15)


@pytest.mark.parametrize(
    ("n", "k", "d", "c", "samples"),
    [
        (8, 64, 1500, 0.5, 20),  # nk = d / 2.9; b = 1024, overlap 548
        (10, 40, 3000, 0.9, 20),  # nk = d / 7.5, c near 1; b = 2048, overlap 1096
        (10, 40, 2000, 0.9, 20),  # the blocks barely overlap: b = 1024, overlap 48
        (8, 64, 1025, 0.5, 20),  # the blocks nearly coincide: b = 1024, overlap 1023
    ],
)
def test_free_limit_holds_for_hblocks(n: int, k: int, d: int, c: float, samples: int) -> None:
    # hblocks (two overlapping Hadamard blocks, any d, no padding) against the same limit
    # with d in place of d': its first two moments are exact (E tr S = nk, E tr S^2 =
    # nk + n(n-1)k^2/d hold for any independent projections with E[G^T G] = (k/d) I), the
    # check is of the higher ones, on cases where the rule takes the free path, including
    # the two extremes of the blocks' overlap. Same tolerance as above:
    # |free - mean| <= bound * free + 4 se.
    _check_free_path_projection(n, k, d, c, samples, "hblocks")


def test_a_wrong_limit_fails_the_agreement_check() -> None:
    # The tolerance of the test above rejects the plain "no overlap" guess nk / T(1) = nk
    # and a limit that ignores the cross terms.
    n, k, d_pad, c, samples = 16, 16, 256, 0.99, 150
    vals = np.array([_beta.spectral_sample(n, k, d_pad, c, s)[0] for s in range(samples)])
    se = vals.std(ddof=1) / math.sqrt(samples)
    tol = free_error_bound(n, k, d_pad, c) * free_spectral_sum(n, k, d_pad, c) + 4 * se
    assert abs(n * k - vals.mean()) > tol
    assert abs(free_spectral_sum(n, k, 2 * d_pad, c) / 2 - vals.mean()) > tol


def test_svd_and_gram_samples_agree() -> None:
    # the explicit-A path (singular values) and the Gram path see the same seeds
    for n, k, d_pad, c in ((8, 8, 64, 0.9), (3, 32, 64, 0.5), (4, 8, 32, 1.0), (20, 4, 128, 0.7)):
        for s in range(3):
            a, ma = _beta.spectral_sample(n, k, d_pad, c, s, svd=True)
            b, mb = _beta.spectral_sample(n, k, d_pad, c, s, svd=False)
            assert (ma, mb) == ("mc-svd", "mc-eig")
            assert a == pytest.approx(b, rel=1e-10)


def test_rule_uses_the_free_limit_for_large_problems_without_monte_carlo(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_mc(*args: object, **kwargs: object) -> tuple[float, str]:
        raise AssertionError("Monte Carlo ran")

    monkeypatch.setattr(_beta, "spectral_sample", no_mc)
    for n, k, d in ((200, 128, 4096), (1000, 64, 4096), (1000, 131, 2**20)):
        est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="avg")
        details = est.beta_details()  # type: ignore[attr-defined]
        c = n / (2 * (n - 1))
        assert details.method == "free" and details.samples == 0
        assert details.beta == d / free_spectral_sum(n, k, d, c)
        assert 0 < details.rel_se <= FREE_MAX_REL_ERROR
    assert not list(fresh_cache.iterdir())  # nothing to cache
    # max in the free region: d' / rank with full rank
    est = rpsagg.make_estimator("rand-proj-spatial", n=100, k=64, d=4096, transform="max")
    assert est.beta_bar == 4096 / 4096
    assert est.beta_details().method == "free"  # type: ignore[attr-defined]


def test_rule_keeps_monte_carlo_where_the_bound_is_too_loose(fresh_cache: Path) -> None:
    for n, k, d_pad, c in ((8, 8, 64, 0.9), (64, 4, 256, 0.999), (5, 6, 64, 0.5)):
        assert free_error_bound(n, k, d_pad, c) > FREE_MAX_REL_ERROR
        assert _beta.beta_path(n, k, d_pad, c) == "mc"
    est = _beta.rps_beta(8, 8, 64, 0.9)
    assert est.method == "mc-svd" and 0 < est.rel_se <= _beta.TARGET_REL_SE
    # exact cases are unchanged
    assert _beta.beta_path(8, 8, 64, 0.0) == "exact"
    assert _beta.rps_beta(8, 8, 64, 0.0).beta == 64 / 64
    assert _beta.beta_path(1, 8, 64, 0.9) == "exact"
    assert FREE_ABS_ERROR > 0
