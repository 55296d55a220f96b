"""Choosing a round's budget for a target relative error (target mode).

:class:`BudgetPolicy` is the rule every caller uses (the server's round planner, the Flower
strategy, ``bench/target_mode.py``): plan at the least of the vector slots' planning priors
(:func:`planning_r` of :meth:`rpsagg.VectorCorrelationTracker.planning_priors`: per slot
the least of the smoothed and the newest R_hat) with :func:`plan_budget`, the cheapest
``(k, value_bits)`` whose predicted relative error is at most the target; while no R is
known, the largest budget. Pure: it builds estimators through the factory it is given and
nothing else.
"""

from rpsagg._planning import BudgetPlan, BudgetPolicy, plan_budget, planning_r, value_bytes

__all__ = ["BudgetPlan", "BudgetPolicy", "plan_budget", "planning_r", "value_bytes"]
