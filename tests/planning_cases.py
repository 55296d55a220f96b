"""The cases of target mode's one rule and two of its callers, shared by
``tests/unit/test_planning.py`` (the server's planner and the bench) and
``tests/flower/test_target_policy.py`` (the Flower strategy, which needs flwr)."""

from __future__ import annotations

import pytest

from rpsagg import make_estimator
from rpsagg.planning import BudgetPolicy

SAME_N, SAME_D = 10, 1024  # bench/target_mode.py's n and d


def policy_k(target: float, r: float | None, k_min: int, k_max: int) -> int:
    def make(k: int, bits: int):
        return make_estimator("rand-proj-spatial", n=SAME_N, k=k, d=SAME_D, value_bits=bits)

    return BudgetPolicy(target, k_min, k_max).plan([r], make).k


def strategy_k(target: float, r: float | None, k_min: int, k_max: int) -> int:
    """The Flower strategy's k after a round of ``SAME_N`` replies whose R_hat was ``r``
    (the strategy plans at R 0 rather than sending k_max when none is known)."""
    pytest.importorskip("flwr")
    from rpsagg_flower.settings import RoundEncoding
    from rpsagg_flower.strategy import RandProjSpatialFedAvg

    strategy = RandProjSpatialFedAvg(k=k_max, target_rel_error=target, k_min=k_min)
    strategy._last_n = SAME_N
    if r is not None:  # r / (n - 1) is exact for these r: the tracker gives back r itself
        strategy.tracker.fold(r, SAME_N)
        assert strategy.tracker.planning_prior(SAME_N) == r
    return int(strategy._target_k(RoundEncoding("rand-proj-spatial", k_max, SAME_D, 1)))


#: (target, r, k_min, k_max)
CASES = [(0.05, 4.5, 1, 1024), (0.2, 7.875, 1, 1024), (0.2, 1.125, 16, 512),
         (1e-4, 2.25, 1, 256)]
