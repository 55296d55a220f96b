"""R_hat from the sketches: both of its terms are unbiased.

Tolerance: over T independent trials the empirical mean of each term is within
4 standard errors (sample std / sqrt(T)) of the truth (CLT, two-sided tail 6e-5); the test
also requires that standard error to be below 5% of the truth, so a wrong constant such as a
missing d'/k factor (off by 8x or more here) cannot hide in the noise.
"""

from __future__ import annotations

import numpy as np
import pytest

import rpsagg
from rpsagg.synthetic import correlated_vectors


@pytest.mark.parametrize("scheme", ["rand-proj-spatial", "rand-k", "rand-k-spatial"])
def test_correlation_terms_are_unbiased(scheme: str) -> None:
    n, k, d, trials = 8, 8, 60, 3000
    xs = correlated_vectors(n, d, 3.0, seed=4) * (1.0 + np.arange(n) / 4)[:, None]
    true_norms = float(np.sum(xs**2))
    true_cross = float(np.sum(xs.sum(axis=0) ** 2)) - true_norms
    est = rpsagg.make_estimator(scheme, n=n, k=k, d=d)
    samples = np.empty((trials, 2))
    for t in range(trials):
        msgs = [est.encode(x, 77_000 + t * n + i) for i, x in enumerate(xs)]
        samples[t] = rpsagg.correlation_terms(msgs)
    for col, truth in ((0, true_cross), (1, true_norms)):
        se = samples[:, col].std(ddof=1) / np.sqrt(trials)
        assert se < 0.05 * abs(truth)
        assert abs(samples[:, col].mean() - truth) <= 4 * se, (col, samples[:, col].mean(), truth)


def test_estimate_correlation_is_the_ratio_and_tracks_r() -> None:
    n, k, d = 10, 64, 256
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d)
    for r in (0.0, 4.5, 9.0):
        xs = correlated_vectors(n, d, r, seed=1)
        values = []
        for t in range(40):
            msgs = [est.encode(x, 5_000 + t * n + i) for i, x in enumerate(xs)]
            cross, norms = rpsagg.correlation_terms(msgs)
            values.append(rpsagg.estimate_correlation(msgs))
            assert values[-1] == pytest.approx(cross / norms)
        # R_hat is a ratio estimator; its bias is second order. Mean within 0.5 of R.
        assert abs(np.mean(values) - r) < 0.5


def test_tracker_smooths_fraction_and_converts_to_prior() -> None:
    n, k, d = 6, 32, 128
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d)
    tracker = rpsagg.CorrelationTracker(alpha=0.5)
    assert tracker.prior(n) is None
    xs = correlated_vectors(n, d, 5.0, seed=2)
    msgs = [est.encode(x, 10 + i) for i, x in enumerate(xs)]
    r1 = tracker.update(msgs)
    assert tracker.fraction == pytest.approx(min(1.0, max(0.0, r1 / (n - 1))))
    msgs2 = [est.encode(x, 100 + i) for i, x in enumerate(xs)]
    r2 = tracker.update(msgs2)
    f1, f2 = (min(1.0, max(0.0, r / (n - 1))) for r in (r1, r2))
    assert tracker.fraction == pytest.approx(0.5 * f1 + 0.5 * f2)
    assert tracker.prior(n) == pytest.approx(tracker.fraction * (n - 1))
    with pytest.raises(ValueError, match="alpha"):
        rpsagg.CorrelationTracker(alpha=0.0)


def test_estimate_correlation_rejects_bad_batches() -> None:
    est = rpsagg.make_estimator("rand-proj-spatial", n=4, k=4, d=32)
    x = np.ones(32)
    with pytest.raises(ValueError, match="at least one"):
        rpsagg.estimate_correlation([])
    with pytest.raises(ValueError, match="same seed"):
        rpsagg.estimate_correlation([est.encode(x, 1), est.encode(x, 1)])
    wangni = rpsagg.make_estimator("rand-k-wangni", n=4, k=4, d=32)
    with pytest.raises(ValueError, match="supports"):
        rpsagg.estimate_correlation([wangni.encode(x, 1)])
