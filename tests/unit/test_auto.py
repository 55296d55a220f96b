"""transform="auto": the spectral MSE model, its minimizer, and the cap near nk = d'."""

from __future__ import annotations

import pytest

import rpsagg
from rpsagg._auto import AUTO_DELTA, auto_c, mse_model

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("n", "k", "d_pad"), [(10, 8, 4096), (50, 10, 512), (10, 102, 1024)])
def test_model_matches_the_closed_forms(n: int, k: int, d_pad: int) -> None:
    p = k / d_pad
    # identical unit vectors (R = n - 1, s = 1, E = n): MSE = (E/n) F = F.
    # max with nk < d': d'/(nk) - 1 (docs/math.md, "Sanity values"); one: Rand-k's (1/n)(d'/k - 1)
    if n * k < d_pad:
        assert mse_model(n, k, d_pad, n - 1, 1.0) == pytest.approx(d_pad / (n * k) - 1, rel=1e-9)
    assert mse_model(n, k, d_pad, n - 1, 0.0) == pytest.approx((1 - p) / (n * p), rel=1e-12)
    # orthogonal vectors (R = 0) and one: (1/n^2)(d'/k - 1) E up to the model's c-independent
    # constant -(1 - s)/n^2 per unit of E/n, i.e. F(0) - (1 - 1/n)/n = (d'/k - 1)/n
    f0 = mse_model(n, k, d_pad, 0.0, 0.0)
    assert f0 - (1 - 1 / n) / n == pytest.approx((d_pad / k - 1) / n, rel=1e-9)


@pytest.mark.parametrize(("n", "k", "d_pad"), [(10, 8, 4096), (50, 10, 512), (20, 64, 1024)])
def test_without_margin_the_minimizer_is_the_share_of_the_mean(n: int, k: int, d_pad: int) -> None:
    # dF/de = (s e - (1 - s)) (u''/u^2 - 2 u'^2/u^3) vanishes at c = s = (R + 1)/n for any
    # spectral law: the golden-section search must find it.
    for frac in (0.0, 0.3, 0.8, 0.97):
        r = frac * (n - 1)
        assert auto_c(n, k, d_pad, r, delta=0.0) == pytest.approx((r + 1) / n, abs=1e-6)


def test_auto_keeps_c_away_from_1_where_nk_is_close_to_d() -> None:
    # nk = 500, d' = 512: the model's MSE at c = 1 is 8.4 for a true fraction of 0.8 (one:
    # 1.0); auto with the prior 1.0 stays where the worst case over s +- AUTO_DELTA is least.
    n, k, d_pad = 50, 10, 512
    c = auto_c(n, k, d_pad, n - 1.0)
    assert 0.9 < c < 0.99
    low = (1.0 - AUTO_DELTA) * n - 1.0  # R of the lowest share in the interval
    assert mse_model(n, k, d_pad, low, c) < 0.2 * mse_model(n, k, d_pad, low, 1.0)
    # continuous: no rounding of the prior
    assert auto_c(n, k, d_pad, 30.0) != auto_c(n, k, d_pad, 30.001)


def test_estimator_uses_auto_c_and_is_a_pure_function_of_the_prior() -> None:
    n, k, d = 50, 10, 500
    base = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="auto")
    est = base.with_prior(41.3)  # type: ignore[attr-defined]
    again = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="auto",
                                  prior_r=41.3)
    # d = 500 is not a power of two: the randomized DCT acts in d itself (the padded SRHT
    # would act in d' = 512); auto_c takes the projection's dimension
    assert est.d_pad == 500
    c = auto_c(n, k, 500, 41.3)
    assert est._c_for(n) == again._c_for(n) == c
    srht = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="auto",
                                 prior_r=41.3, projection="srht")
    assert srht._c_for(n) == auto_c(n, k, 512, 41.3)
    # fewer messages keep the correlation fraction
    assert est._c_for(20) == auto_c(20, k, 500, 41.3 / 49 * 19)
    assert est.beta_details(n).key == est.beta_details(n).key
    msgs = [est.encode([float(i + j) for j in range(d)], seed=100 + i) for i in range(n)]
    res = est.decode_with_info(msgs)
    assert res.c == c
    # no prior: avg
    assert base._c_for(n) == n / (2 * (n - 1))
