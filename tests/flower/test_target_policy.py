"""The strategy's target-mode k is the library's rule (``rpsagg.planning.BudgetPolicy``), as
the server's and the bench's are (``tests/unit/test_planning.py``, whose cases these are: that
file's strategy case needs flwr, so it runs here)."""

from __future__ import annotations

import pytest
from test_planning import CASES, _policy_k, _strategy_k

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("target", "r", "k_min", "k_max"), CASES)
def test_strategy_chooses_the_policys_k(target: float, r: float, k_min: int,
                                        k_max: int) -> None:
    assert _strategy_k(target, r, k_min, k_max) == _policy_k(target, r, k_min, k_max)


def test_strategy_plans_at_r_zero_before_any_r_hat() -> None:
    assert _strategy_k(2.0, None, 1, 512) == _policy_k(2.0, 0.0, 1, 512) < 512
