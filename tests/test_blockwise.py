"""Blockwise Rand-Proj-Spatial: each block is an independent Rand-Proj-Spatial problem."""

from __future__ import annotations

import numpy as np
import pytest

import rpsagg
from rpsagg._blockwise import block_budgets, block_seed
from rpsagg.synthetic import correlated_vectors


def test_budgets_and_seeds() -> None:
    assert block_budgets(10, 4) == [3, 3, 2, 2]
    assert sum(block_budgets(1000, 7)) == 1000
    assert block_seed(5, 0) != block_seed(5, 1) != block_seed(6, 1)
    with pytest.raises(ValueError, match="block must be in"):
        block_seed(5, -1)


@pytest.mark.parametrize("transform", ["avg", "max"])
def test_blockwise_is_the_per_block_decoder(transform: str) -> None:
    n, k, d, b = 5, 10, 100, 32  # 4 blocks (the last one padded from 4 to 32 coordinates)
    xs = np.random.default_rng(0).standard_normal((n, d))
    est = rpsagg.make_estimator(
        "rand-proj-spatial", n=n, k=k, d=d, transform=transform, block_size=b
    )
    msgs = [est.encode(x, 300 + i) for i, x in enumerate(xs)]
    assert msgs[0].scheme == "rand-proj-spatial:block=32" and msgs[0].values.size == k
    expected = []
    offset = 0
    for j, kb in enumerate(block_budgets(k, 4)):
        sub = rpsagg.make_estimator("rand-proj-spatial", n=n, k=kb, d=b, transform=transform)
        block = np.zeros((n, b))
        part = xs[:, j * b : (j + 1) * b]
        block[:, : part.shape[1]] = part
        sub_msgs = [sub.encode(row, block_seed(300 + i, j)) for i, row in enumerate(block)]
        got = np.stack([m.values[offset : offset + kb] for m in msgs])
        np.testing.assert_array_equal(got, np.stack([m.values for m in sub_msgs]))
        expected.append(sub.decode(sub_msgs))
        offset += kb
    np.testing.assert_allclose(est.decode(msgs), np.concatenate(expected)[:d], rtol=1e-12)


def test_blockwise_is_unbiased() -> None:
    # Same statistic and derivation as tests/test_statistics.py::test_unbiased.
    n, k, d, b, trials = 6, 12, 100, 32, 1500
    xs = correlated_vectors(n, d, 2.0, seed=9) * np.linspace(0.5, 2.0, d)
    x_bar = xs.mean(axis=0)
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=b)
    estimates = np.empty((trials, d))
    for t in range(trials):
        estimates[t] = est.decode([est.encode(x, 9_000 + t * n + i) for i, x in enumerate(xs)])
    proj = (estimates - x_bar) @ x_bar / (x_bar @ x_bar)
    assert abs(proj.mean()) <= 4 * proj.std(ddof=1) / np.sqrt(trials)
    assert abs(proj.mean()) < 0.02
    z = (estimates.mean(axis=0) - x_bar) / (estimates.std(axis=0, ddof=1) / np.sqrt(trials))
    assert np.max(np.abs(z)) <= 5.0


def test_blockwise_validation() -> None:
    with pytest.raises(ValueError, match="power of two"):
        rpsagg.make_estimator("rand-proj-spatial", n=2, k=8, d=100, block_size=48)
    with pytest.raises(ValueError, match="number of blocks"):
        rpsagg.make_estimator("rand-proj-spatial", n=2, k=3, d=100, block_size=32)
    with pytest.raises(ValueError, match="rand-proj-spatial only"):
        rpsagg.make_estimator("rand-k", n=2, k=8, d=100, block_size=32)
    est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=8, d=100, block_size=32)
    full = rpsagg.make_estimator("rand-proj-spatial", n=2, k=8, d=100)
    with pytest.raises(ValueError, match="mixed schemes"):
        est.decode([est.encode(np.ones(100), 1), full.encode(np.ones(100), 2)])


def test_default_krylov_tolerance_error_is_within_its_documented_bound() -> None:
    # DEFAULT_RTOL = 1e-6: the matrix-free decode differs from the exact one by at most
    # about cond(M) * rtol (< 10 * 1e-6 here, nk = 96 <= d'/4).
    n, k, d = 6, 16, 512
    xs = np.random.default_rng(4).standard_normal((n, d))
    cg = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, method="cg")
    exact = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, method="exact")
    msgs = [cg.encode(x, 60 + i) for i, x in enumerate(xs)]
    a, b = cg.decode(msgs), exact.decode(msgs)
    assert np.linalg.norm(a - b) / np.linalg.norm(b) <= 1e-5


@pytest.mark.parametrize("block_size", [1, 0, 3, 48])
def test_block_size_is_a_power_of_two_of_at_least_two(block_size: int) -> None:
    # docs/wire-format.md, "Blockwise SRHT": b = 2^m with m >= 1
    with pytest.raises(ValueError, match=r"block_size must be a power of two >= 2"):
        rpsagg.make_estimator("rand-proj-spatial", n=2, k=64, d=64, block_size=block_size)
    assert rpsagg.make_estimator("rand-proj-spatial", n=2, k=32, d=64, block_size=2).blocks == 32
