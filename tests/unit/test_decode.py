"""The structured decoders against the paper's dense formula, and Lemma 4.1.

The dense reference builds ``S = sum_i G_i^T G_i`` (d' x d', allowed in tests) from
``rpsagg.srht_matrix`` (or, for the projections without padding, ``dct_matrix`` and
``hblocks_matrix``, the default's when d is not a power of two: d x d) and applies
``beta * T(S)^+ sum_i G_i^T y_i`` through an
eigendecomposition of S, exactly as the paper's code does. Both sides use the same float32
values (cast to float64) and the same beta, so any difference is the linear algebra's.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

import rpsagg
from rpsagg._auto import auto_c
from rpsagg._beta import mc_seeds
from rpsagg._dct import dct_matrix
from rpsagg._decode import joint_solve
from rpsagg._hblocks import hblocks_matrix
from rpsagg._srht import JointSRHT
from rpsagg.spec import randk_indices
from rpsagg.synthetic import correlated_vectors

pytestmark = pytest.mark.unit


def dense_rps(est: rpsagg.Estimator, msgs: list[rpsagg.Encoded]) -> np.ndarray:
    projection = getattr(est, "projection", "srht")
    d_pad = est.d if projection != "srht" else rpsagg.padded_dim(est.d)
    make = {"dct": dct_matrix, "hblocks": hblocks_matrix}.get(projection, rpsagg.srht_matrix)
    mats = [make(m.seed, est.k, est.d) for m in msgs]
    s = sum(g.T @ g for g in mats)
    rhs = sum(g.T @ m.values.astype(np.float64) for g, m in zip(mats, msgs, strict=True))
    w, v = np.linalg.eigh(s)
    tol = max(w.max(), 1.0) * d_pad * np.finfo(float).eps
    c = est.transform.c_for(len(msgs))  # type: ignore[attr-defined]
    t = (1 - c) + c * w
    f = np.where(w > tol, 1.0 / np.where(w > tol, t, 1.0), 0.0)
    return est.beta_for(len(msgs)) * (v @ (f * (v.T @ rhs)))[: est.d]


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


CASES = [  # (n, k, d): nk < d', nk = d', nk > d', and d not a power of two (hblocks)
    (4, 8, 64),
    (8, 8, 64),
    (12, 8, 64),
    (5, 6, 50),
    (3, 20, 50),
]
TRANSFORMS: list[str | float] = ["max", "one", "avg", 2.0]


@pytest.mark.parametrize(("n", "k", "d"), CASES)
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_decode_equals_dense_formula(n: int, k: int, d: int, transform: str | float) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    xs = rng.standard_normal((n, d))
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=transform)
    msgs = [est.encode(x, 7919 * (i + 1)) for i, x in enumerate(xs)]
    assert rel_diff(est.decode(msgs), dense_rps(est, msgs)) <= 1e-9


@pytest.mark.parametrize("transform", ["avg", "max", 1.5])
def test_matrix_free_path_equals_dense_formula(transform: str | float) -> None:
    # nk = 96 < d' = 256: the Krylov solver converges to rtol; the error in z is at most
    # cond(M) * rtol with cond(M) < 10 here, so 1e-9 on the output is a safe bound.
    n, k, d = 6, 16, 256
    xs = np.random.default_rng(11).standard_normal((n, d))
    est = rpsagg.make_estimator(
        "rand-proj-spatial", n=n, k=k, d=d, transform=transform, method="cg", rtol=1e-12
    )
    msgs = [est.encode(x, 1000 + i) for i, x in enumerate(xs)]
    result = est.decode_with_info(msgs)
    assert result.solve is not None and result.solve.method in ("cg", "lsqr")
    assert result.solve.iterations > 0
    assert result.solve.residual <= 1e-10
    assert rel_diff(result.estimate, dense_rps(est, msgs)) <= 1e-9


@pytest.mark.parametrize(("n", "k", "d", "chosen"), [
    (5, 60, 20586, "cg"),  # (nk)^2 d = 1.9e9, under EXACT_FLOPS_LIMIT, yet CG is ~14x cheaper
    (5, 78, 7850, "cg"),  # the old Fashion-MNIST example at k = d/100 (exact: 36-260 ms)
    (5, 10, 20586, "exact-cholesky"),  # (nk)^2 <= 2 n log2(d) * 20: the Gram matrix
    (3, 20, 50, "exact-cholesky"),  # a trivial Gram matrix (1.8e5 multiply-adds)
    (4, 100, 4096, "exact-cholesky"),  # the SRHT's Gram costs n^2/2 FWHTs: always built
])
def test_auto_builds_the_gram_matrix_only_where_it_is_cheaper(n: int, k: int, d: int,
                                                               chosen: str) -> None:
    """``method="auto"`` on a small system (nk <= 512): the hblocks' and DCT's Gram matrix
    (from dense rows, (nk)^2 d) only when it costs less than a Krylov solve, the SRHT's
    always. The Krylov answer agrees with the exact one to cond(M) * rtol (M's eigenvalues
    lie in [1 - c, 1 - c + c lambda_max(K)] with c = 0.625 and lambda_max(K) <= n, so
    cond(M) <= 9 and 9 * 1e-6 bounds the relative difference)."""
    xs = np.random.default_rng(5).standard_normal((n, d))
    auto = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d)
    exact = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, method="exact")
    msgs = [auto.encode(x, 300 + i) for i, x in enumerate(xs)]
    result = auto.decode_with_info(msgs)
    assert result.solve is not None and result.solve.method == chosen
    assert rel_diff(result.estimate, exact.decode(msgs)) <= 9e-6


def test_rank_deficient_system_decodes_like_the_pseudo_inverse() -> None:
    # d' = nk = 32: the paper saw rank 31 in ~2% of trials. Find such a seed set among the
    # Monte Carlo samples and check that both solvers match the dense pseudo-inverse.
    n, k, d = 4, 8, 32
    for sample in range(400):
        seeds = mc_seeds(sample, n)
        op = JointSRHT.from_seeds(seeds, k, d)
        if np.linalg.matrix_rank(op.gram()) < n * k:
            break
    else:
        pytest.fail("no rank-deficient sample found in 400 (expected about 8)")
    xs = np.random.default_rng(3).standard_normal((n, d))
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="max")
    msgs = [est.encode(x, s) for x, s in zip(xs, seeds, strict=True)]
    result = est.decode_with_info(msgs)
    assert result.solve is not None and result.solve.method == "exact-eigh"
    assert rel_diff(result.estimate, dense_rps(est, msgs)) <= 1e-9
    # the matrix-free path (LSQR: the minimum-norm least-squares solution A^+ y) agrees
    y = np.stack([m.values.astype(np.float64) for m in msgs])
    xt, info = joint_solve(op, y, 1.0, method="cg", rtol=1e-14)
    dense = dense_rps(est, msgs) / est.beta_for(n)
    assert info.method == "lsqr"
    assert rel_diff(xt[:d], dense) <= 1e-9


@pytest.mark.parametrize("transform", ["max", "avg", "one", 3.0])
@pytest.mark.parametrize("n_prime", [7, 4])
def test_lemma_4_1_rand_k_spatial_is_the_general_formula_with_subsampling(
    transform: str | float, n_prime: int
) -> None:
    # G_i = E_i: S = diag(M) with M_j the number of clients that sent j. The general
    # estimator is beta_g * T(S)^+ sum_i E_i^T y_i with beta_g = d / E[sum_j M_j / T(M_j)]
    # = 1 / E[M / T(M)], M ~ Binomial(n', k/d) (computed here independently of the library's
    # Binomial(n'-1) form).
    n, k, d = 7, 9, 60
    xs = np.random.default_rng(8).standard_normal((n_prime, d))
    est = rpsagg.make_estimator("rand-k-spatial", n=n, k=k, d=d, transform=transform)
    msgs = [est.encode(x, 555 + 13 * i) for i, x in enumerate(xs)]
    c = est.transform.c_for(n_prime)  # type: ignore[attr-defined]
    mats = []
    for m in msgs:
        e = np.zeros((k, d))
        e[np.arange(k), randk_indices(m.seed, k, d)] = 1.0
        mats.append(e)
    s = sum(e.T @ e for e in mats)
    rhs = sum(e.T @ m.values.astype(np.float64) for e, m in zip(mats, msgs, strict=True))
    mvals = np.arange(n_prime + 1)
    pmf = binom.pmf(mvals, n_prime, k / d)
    t_m = (1 - c) + c * mvals
    expect = np.sum(pmf[1:] * mvals[1:] / t_m[1:])
    beta_g = 1.0 / expect
    w = np.diag(s)
    t = (1 - c) + c * w
    general = beta_g * np.where(w > 0, rhs / np.where(w > 0, t, 1.0), 0.0)
    np.testing.assert_allclose(est.beta_for(n_prime), beta_g, rtol=1e-12)
    assert rel_diff(est.decode(msgs), general) <= 1e-12


def test_auto_with_a_prior_is_corr_at_the_c_of_auto_c() -> None:
    # auto with prior R decodes with c = auto_c(n, k, d', R) (rpsagg._auto), i.e. as
    # corr(R') with R' = c (n - 1); without a prior it is avg
    n, k, d, r = 8, 6, 64, 3.0
    xs = correlated_vectors(n, d, r, seed=2)
    auto = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="auto", prior_r=r)
    c = auto_c(n, k, 64, r)
    corr = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=c * (n - 1))
    plain = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="auto")
    avg = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="avg")
    msgs = [corr.encode(x, 90 + i) for i, x in enumerate(xs)]
    result = auto.decode_with_info(msgs)
    assert result.c == c and abs(c - r / (n - 1)) > 0.01
    assert rel_diff(result.estimate, corr.decode(msgs)) <= 1e-12
    np.testing.assert_array_equal(plain.decode(msgs), avg.decode(msgs))
    assert not np.array_equal(avg.decode(msgs), result.estimate)
    with_prior = plain.with_prior(r)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(with_prior.decode(msgs), result.estimate)


def test_decode_accepts_fewer_messages_and_uses_their_beta() -> None:
    est = rpsagg.make_estimator("rand-proj-spatial", n=10, k=4, d=64, transform="avg")
    xs = np.random.default_rng(1).standard_normal((3, 64))
    msgs = [est.encode(x, 40 + i) for i, x in enumerate(xs)]
    result = est.decode_with_info(msgs)
    assert result.n_prime == 3
    assert result.beta == est.beta_for(3) != est.beta_bar
    assert result.c == pytest.approx(3 / 4)  # avg for n' = 3: n'/(2(n'-1))
    single = est.decode_with_info(msgs[:1])
    # one message: T(1) = 1, beta = d'/k, and the estimate is (d'/k) G^T y
    g = rpsagg.srht_matrix(msgs[0].seed, 4, 64)
    np.testing.assert_allclose(single.estimate, 16 * g.T @ msgs[0].values.astype(float), rtol=1e-12)
