"""The strategy's target-mode k is the library's rule (``rpsagg.planning.BudgetPolicy``), as
the server's and the bench's are (``tests/unit/test_planning.py``). The cases are
``tests/planning_cases.py``'s; the strategy's need flwr, so they run here."""

from __future__ import annotations

import pytest
from planning_cases import CASES, policy_k, strategy_k

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("target", "r", "k_min", "k_max"), CASES)
def test_strategy_chooses_the_policys_k(target: float, r: float, k_min: int,
                                        k_max: int) -> None:
    assert strategy_k(target, r, k_min, k_max) == policy_k(target, r, k_min, k_max)


def test_strategy_plans_at_r_zero_before_any_r_hat() -> None:
    assert strategy_k(2.0, None, 1, 512) == policy_k(2.0, 0.0, 1, 512) < 512
