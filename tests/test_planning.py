"""Choosing k (and value bits) for a target relative error (rpsagg.plan_budget)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rpsagg import make_estimator, plan_budget, value_bytes

pytestmark = pytest.mark.unit

N, D = 8, 1024


def _make(k: int, bits: int, transform: str = "avg"):
    return make_estimator("rand-proj-spatial", n=N, k=k, d=D, transform=transform,
                          value_bits=bits)


@pytest.mark.parametrize("target", [0.5, 2.0, 8.0])
@pytest.mark.parametrize("r", [0.0, 3.5, 7.0])
def test_smallest_k_meets_the_target(target: float, r: float) -> None:
    plan = plan_budget(_make, target, r, k_min=1, k_max=D)
    assert plan.reached and plan.value_bits == 32
    assert plan.predicted_relative_error <= target
    assert _make(plan.k, 32).predicted_relative_error(r) == plan.predicted_relative_error
    if plan.k > 1:  # one value fewer misses it: the smallest k
        assert _make(plan.k - 1, 32).predicted_relative_error(r) > target
    assert plan.value_bytes == 4 * plan.k


def test_unreachable_target_gives_the_largest_budget() -> None:
    plan = plan_budget(_make, 1e-6, 0.0, k_min=1, k_max=64)
    assert not plan.reached and plan.k == 64
    assert plan.predicted_relative_error > 1e-6


def test_bits_auto_picks_the_fewest_bytes() -> None:
    widths = (2, 4, 8, 32)
    plan = plan_budget(_make, 2.0, 3.5, k_min=1, k_max=D // N, value_bits=widths)
    assert plan.reached and plan.predicted_relative_error <= 2.0
    for bits in widths:  # every width's own smallest k costs at least as many bytes
        own = plan_budget(_make, 2.0, 3.5, k_min=1, k_max=D // N, value_bits=(bits,))
        if own.reached:
            assert plan.value_bytes <= own.value_bytes
    assert plan.value_bytes == value_bytes(plan.k, plan.value_bits)


@pytest.mark.parametrize("bad", [dict(target=0.0), dict(target=math.nan),
                                 dict(k_min=0), dict(k_min=9, k_max=8), dict(value_bits=())])
def test_bad_arguments_are_refused(bad: dict) -> None:
    args = dict(target=1.0, k_min=1, k_max=8, value_bits=(32,))
    args.update(bad)
    with pytest.raises(ValueError):
        plan_budget(_make, args["target"], 0.0, k_min=args["k_min"], k_max=args["k_max"],
                    value_bits=args["value_bits"])


def test_the_planned_k_reaches_the_target_when_decoded() -> None:
    """Vectors with a known R (shared part + independent parts: R = (n-1) s^2/(s^2 + 1)
    in expectation over the draw; the exact R of the drawn vectors is used for the plan).
    The measured relative error over T trials is a mean of T independent squared errors:
    its standard error is their sd / sqrt(T), taken from the trials themselves. The plan's
    predicted error is exact for the SRHT up to the free limit's stated 3 %, so the
    measured mean must be within 3 % + 4 standard errors of the prediction."""
    rng = np.random.default_rng(11)
    xs = 1.2 * rng.standard_normal(D) + rng.standard_normal((N, D))
    total = xs.sum(axis=0)
    norms = float(np.sum(xs * xs))
    r = (float(total @ total) - norms) / norms
    plan = plan_budget(_make, 2.0, r, k_min=1, k_max=D // N)
    assert plan.reached
    est = _make(plan.k, 32)
    mean = xs.mean(axis=0)
    trials = 300
    rel = np.empty(trials)
    for t in range(trials):
        msgs = [est.encode(x, seed=t * 100 + i) for i, x in enumerate(xs)]
        rel[t] = float(np.sum((est.decode(msgs) - mean) ** 2)) / float(mean @ mean)
    se = rel.std(ddof=1) / math.sqrt(trials)
    assert abs(rel.mean() - plan.predicted_relative_error) <= (
        0.03 * plan.predicted_relative_error + 4 * se)
