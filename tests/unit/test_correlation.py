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

pytestmark = pytest.mark.unit


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
    # the fraction's range: R in [-1, n-1] over n - 1
    assert tracker.fraction == pytest.approx(min(1.0, max(-1.0 / (n - 1), r1 / (n - 1))))
    msgs2 = [est.encode(x, 100 + i) for i, x in enumerate(xs)]
    r2 = tracker.update(msgs2)
    f1, f2 = (min(1.0, max(-1.0 / (n - 1), r / (n - 1))) for r in (r1, r2))
    assert tracker.fraction == pytest.approx(0.5 * f1 + 0.5 * f2)
    assert tracker.prior(n) == pytest.approx(max(0.0, tracker.fraction) * (n - 1))
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


def _round(est: rpsagg.Estimator, xs: np.ndarray, seed: int) -> list[rpsagg.Encoded]:
    return [est.encode(x, seed + i) for i, x in enumerate(xs)]


def test_vector_tracker_is_one_tracker_per_slot() -> None:
    n, k, d, m = 6, 32, 128, 3
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d)
    vt = rpsagg.VectorCorrelationTracker(m)
    singles = [rpsagg.CorrelationTracker() for _ in range(m)]
    assert vt.priors(n) == [None] * m
    for t in range(3):
        batches = [_round(est, correlated_vectors(n, d, 2.0 * j, seed=10 * t + j),
                          1000 * t + 100 * j) for j in range(m)]
        r_hats = vt.update(batches)
        assert r_hats == [s.update(b) for s, b in zip(singles, batches, strict=True)]
    # exactly the per-slot trackers, bit for bit (a server recomputes c from them)
    assert vt.fractions == [s.fraction for s in singles]
    assert vt.priors(n) == [s.prior(n) for s in singles]
    assert len(set(vt.fractions)) == m  # R = 0, 2, 4: the slots learned different values
    # all or nothing: a batch R_hat rejects (a repeated seed) leaves every slot as it was
    before = vt.fractions
    bad = [_round(est, np.ones((n, d)), 5), _round(est, np.ones((n, d)), 7),
           [est.encode(np.ones(d), 9), est.encode(np.ones(d), 9)]]
    with pytest.raises(ValueError, match="same seed"):
        vt.update(bad)
    assert vt.fractions == before
    with pytest.raises(ValueError, match="batches"):
        vt.update(bad[:2])
    # the persisted state: a list per slot, or one number from a store of before the slots
    other = rpsagg.VectorCorrelationTracker(m)
    other.restore(vt.fractions)
    assert other.fractions == vt.fractions
    other.restore(0.25)
    assert other.fractions == [0.25] * m
    other.restore(None)
    assert other.priors(n) == [None] * m
    with pytest.raises(ValueError, match="fractions"):
        other.restore([0.1, 0.2])


def test_per_vector_priors_beat_a_shared_prior_when_the_slots_differ() -> None:
    """Two slots, independent vectors (R = 0) and identical ones (R = n - 1). Decoding each
    with its own slot's prior must beat decoding both with slot 0's (the rule before issue
    12), and vice versa for slot 0 with slot 1's prior.

    Statistics: over T paired trials (same messages, two priors) the mean of the paired
    difference of squared errors has standard error sd/sqrt(T); we require it below zero by
    4 standard errors (a false failure needs a 4-sigma fluctuation, p ~ 3e-5, if the effect
    were only just there). The effect is large: for identical unit vectors the spectral
    model of ``rpsagg._auto`` gives n MSE / E = 0.60 at c near 1 against 1.50 at c = 1/n
    (d'/(nk) - 1 against d'/k - 1 over n, docs/math.md, "Sanity values"), so the test has
    ample power: with these seeds the differences are -1.54 (slot 0, z = -23) and -0.66
    (slot 1, z = -31).
    """
    n, k, d, trials = 10, 16, 256, 40
    base = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="auto")
    slots = [0.0, float(n - 1)]
    vt = rpsagg.VectorCorrelationTracker(2)
    for t in range(4):  # warm the slots' priors up
        vt.update([_round(base, correlated_vectors(n, d, r, seed=50 + 2 * t + j),
                          10_000 + 1000 * t + 100 * j) for j, r in enumerate(slots)])
    priors = vt.priors(n)
    assert priors[0] is not None and priors[1] is not None and priors[0] < priors[1]
    own = [base.with_prior(p) for p in priors]  # type: ignore[attr-defined]
    for j, r in enumerate(slots):
        wrong = own[1 - j]
        diffs = np.empty(trials)
        for t in range(trials):
            xs = correlated_vectors(n, d, r, seed=900 + t)
            truth = xs.mean(axis=0)
            msgs = _round(base, xs, 500_000 + 100 * t)
            e_own = own[j].decode(msgs) - truth
            e_wrong = wrong.decode(msgs) - truth
            diffs[t] = float(e_own @ e_own - e_wrong @ e_wrong)
        se = diffs.std(ddof=1) / np.sqrt(trials)
        assert diffs.mean() < -4 * se, (j, diffs.mean(), se)


def test_planning_prior_is_the_least_of_the_smoothed_and_the_newest() -> None:
    """A budget is planned at min(smoothed, newest) fraction: a falling R is met at once,
    a rising one waits for the smoothing; a restored tracker (no newest) plans at the
    smoothed prior; fewer than two messages fold nothing."""
    from rpsagg import CorrelationTracker, VectorCorrelationTracker

    t = CorrelationTracker(alpha=0.5)
    assert t.planning_prior(5) is None
    t.fold(4.0, 5)  # fraction 1
    assert t.prior(5) == t.planning_prior(5) == 4.0
    t.fold(0.0, 5)  # falls: newest 0, smoothed 0.5
    assert (t.prior(5), t.planning_prior(5)) == (2.0, 0.0)
    t.fold(4.0, 5)  # rises: newest 1, smoothed 0.75
    assert (t.prior(5), t.planning_prior(5)) == (3.0, 3.0)
    t.fold(9.0, 1)  # one message: nothing
    assert (t.prior(5), t.planning_prior(5)) == (3.0, 3.0)
    v = VectorCorrelationTracker(2)
    v.restore([0.5, None])
    assert v.planning_priors(3) == [1.0, None]
