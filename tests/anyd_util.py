"""Shared checks of the any-d joint operators (the randomized DCT's and hblocks')."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rpsagg.linalg import joint_solve

SEEDS, K, D = [11, 2**64 - 2, 12345, 7], 9, 300


def check_joint_operator(from_seeds: Callable[..., Any],
                         matrix: Callable[[int, int, int], np.ndarray],
                         ) -> tuple[Any, np.ndarray, np.ndarray]:
    """The operator of ``SEEDS`` (chunks of one client) against the stacked dense matrices:
    forward, adjoint, Gram, and the joint solve (exact and CG) against the dense formula
    ``A^T ((1-c) I + c K)^-1 y``. Returns ``(op, a, y)`` for further checks."""
    op = from_seeds(SEEDS, K, D, memory_budget=2 * 8 * D)  # chunks of one client
    a = np.vstack([matrix(s, K, D) for s in SEEDS])
    rng = np.random.default_rng(3)
    u, z = rng.standard_normal(D), rng.standard_normal((len(SEEDS), K))
    np.testing.assert_allclose(op.forward(u), (a @ u).reshape(len(SEEDS), K), atol=1e-12)
    np.testing.assert_allclose(op.adjoint(z), a.T @ z.reshape(-1), atol=1e-12)
    np.testing.assert_allclose(op.gram(), a @ a.T, atol=1e-12)
    c = 0.6
    y = rng.standard_normal((len(SEEDS), K))
    dense = a.T @ np.linalg.solve((1 - c) * np.eye(a.shape[0]) + c * (a @ a.T), y.reshape(-1))
    for method in ("exact", "cg"):
        xt, _ = joint_solve(op, y, c, method=method, rtol=1e-12)
        np.testing.assert_allclose(xt, dense, atol=1e-8)
    return op, a, y
