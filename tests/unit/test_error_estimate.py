"""The error estimate of a decode (``DecodeResult.error_estimate``) against the error measured.

Every statistical test runs T rounds of one configuration on fixed vectors, each round with
fresh seeds, and compares what the messages say (the estimate) with what happened (the squared
distance of the decode to the true mean). The tolerances are derived, not tuned:

* Over T independent rounds the differences ``D_t = estimate_t - measured_t`` are i.i.d. with
  mean ``bias`` and some sd; ``mean(D)`` has standard error ``s_D / sqrt(T)`` with ``s_D`` the
  sample sd of the T differences. The check is ``|mean(D)| <= 4 s_D / sqrt(T) + bound *
  mean(measured)``: 4 standard errors (two-sided 6e-5 by chance per check under a normal
  mean, T >= 300) plus ``bound``, the stated bias of the configuration (0 where the form and its
  coefficients are exact; see ``BIAS`` below, and ``docs/error-estimate.md`` for how each was
  measured). Seeds are fixed, so a run is reproducible.
* The form ``MSE = a A + b B`` is checked against the measured mean alone: the target is the
  number ``a A + b B`` with the true A and B, the standard error ``s_measured / sqrt(T)``.
* The standard error the estimate reports is compared with the spread of the estimate over the
  rounds: their ratio ``rms(stderr) / sd(estimate)``; the sd of T = 400 samples is itself known
  to about ``1/sqrt(2T)`` = 3.5 % (a little more for heavy tails), so the stated factor is the
  measured factor's range widened by that.

About 35 s of CPU (72 s wall on a 2-core machine loaded by other jobs; one BLAS thread;
n = 8, d = 256, k = 16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

import rpsagg
from rpsagg import _beta, _error_coef
from rpsagg._decode import one_blas_thread
from rpsagg._error_coef import (
    FREE_REL_ERROR,
    free_coefficients,
    mc_coefficients,
    rps_coefficients,
)
from rpsagg.synthetic import correlated_vectors

pytestmark = pytest.mark.unit

N, D, K = 8, 256, 16
T = 400
Z = 4.0  # standard errors allowed


def spiky_vectors(n: int, d: int, seed: int) -> NDArray[np.float64]:
    """Vectors with a few large coordinates: three shared by every client, two of its own,
    over a little Gaussian noise (worst case for coordinate sampling)."""
    rng = np.random.default_rng(seed)
    x = 0.05 * rng.standard_normal((n, d)) / math.sqrt(d)
    common = rng.choice(d, 3, replace=False)
    for i in range(n):
        x[i, common] += 1.0
        x[i, rng.choice(d, 2, replace=False)] += 2.0
    return x


def vectors(kind: str, n: int = N, d: int = D) -> NDArray[np.float64]:
    if kind == "spiky":
        return spiky_vectors(n, d, 3)
    r = {"orthogonal": 0.0, "correlated": 3.0 * (n - 1) / 7.0, "identical": n - 1.0}[kind]
    return correlated_vectors(n, d, r, seed=11)


@dataclass
class Trials:
    measured: NDArray[np.float64]
    estimated: NDArray[np.float64]
    stderr: NDArray[np.float64]
    mean_sq: NDArray[np.float64]
    methods: set[str]
    c: float | None
    beta: float

    @property
    def bias_tolerance_se(self) -> float:
        diff = self.estimated - self.measured
        return float(diff.std(ddof=1) / math.sqrt(diff.size))

    def check_unbiased(self, bound: float, label: str) -> None:
        """|mean(estimate - measured)| <= Z standard errors + bound * mean(measured)."""
        gap = float(np.mean(self.estimated - self.measured))
        mean = float(np.mean(self.measured))
        tol = Z * self.bias_tolerance_se + bound * mean
        assert abs(gap) <= tol, (
            f"{label}: mean estimate {np.mean(self.estimated):.6g} vs measured {mean:.6g} "
            f"(gap {gap:.3g}, tolerance {tol:.3g} = {Z} x {self.bias_tolerance_se:.3g} + "
            f"{bound} x mean)"
        )

    @property
    def stderr_factor(self) -> float:
        """rms of the reported standard error over the estimate's sd across rounds."""
        return float(np.sqrt(np.mean(self.stderr**2)) / self.estimated.std(ddof=1))


def run_trials(est: rpsagg.Estimator, x: NDArray[np.float64], trials: int = T,
               subset: list[int] | None = None, base: int = 1) -> Trials:
    n = x.shape[0]
    idx = list(range(n)) if subset is None else subset
    target = x[idx].mean(axis=0)
    out: dict[str, list[float]] = {"m": [], "e": [], "s": [], "q": []}
    methods: set[str] = set()
    c: float | None = None
    beta = math.nan
    with one_blas_thread():
        for t in range(trials):
            res = est.decode_with_info([est.encode(x[i], base + t * n + i) for i in idx])
            err = res.estimate - target
            info = res.error_estimate
            assert info is not None
            out["m"].append(float(err @ err))
            out["e"].append(info.squared_error)
            out["s"].append(info.squared_error_stderr)
            out["q"].append(info.mean_norm_squared)
            methods.add(info.method)
            c, beta = res.c, res.beta
    return Trials(np.asarray(out["m"]), np.asarray(out["e"]), np.asarray(out["s"]),
                  np.asarray(out["q"]), methods, c, beta)


# ---------------------------------------------------------------------------------------------
# The form MSE = a A + b B, exact for the SRHT (d a power of two)


@pytest.mark.parametrize("kind", ["orthogonal", "correlated", "identical", "spiky"])
@pytest.mark.parametrize("transform", ["avg", "max"])
def test_srht_mse_is_a_A_plus_b_B(kind: str, transform: str) -> None:
    # a and b from the Monte Carlo over the exact spectrum, with the decode's own beta, so the
    # only approximation is the Monte Carlo's: its relative standard error rel_se (<= 0.5 %)
    # enters as 2 rel_se of the prediction.
    x = vectors(kind)
    est = rpsagg.make_estimator("rand-proj-spatial", n=N, k=K, d=D, transform=transform)
    tr = run_trials(est, x)
    assert tr.c is not None
    coef = mc_coefficients(N, K, D, tr.c, tr.beta)
    norms = float(np.sum(x * x))
    total = x.sum(axis=0)
    cross = float(total @ total) - norms
    predicted = coef.squared_error(norms, cross)
    mean = float(tr.measured.mean())
    se = float(tr.measured.std(ddof=1) / math.sqrt(tr.measured.size))
    tol = Z * se + 2.0 * coef.rel_se * predicted
    assert abs(mean - predicted) <= tol, (kind, transform, mean, predicted, tol)


def test_rand_k_coefficients_are_the_closed_form() -> None:
    # Rand-k: a = (d/k - 1)/n^2, b = 0; RPS(one) is Rand-k in the rotated basis.
    coef = rpsagg.make_estimator("rand-proj-spatial", n=N, k=K, d=D, transform="one").coefficients()
    assert coef.method == "exact"
    assert coef.a == pytest.approx((D / K - 1.0) / N**2)
    assert coef.b == 0.0


# ---------------------------------------------------------------------------------------------
# Unbiasedness of the squared-error estimate, every estimator make_estimator knows

# The stated relative bias bound of each configuration (fraction of the measured MSE):
# * exact forms and coefficients (rand-k, rand-k-spatial, SRHT with c = 0, per-message QSGD and
#   the induced compressor's Rand-k part): 0.
# * the free limit's coefficients (SRHT, d = 2^8, n = 8, k = 16): measured against the Monte
#   Carlo within 0.1 % at these c (test_free_limit_against_monte_carlo checks <= 3 % more
#   widely): bound 1 %.
# * hblocks, DCT, blockwise, padded SRHT: the form is approximate; 1500 rounds each on
#   orthogonal, correlated, identical and spiky vectors put the mean estimate within 0.6 % of
#   the measured mean (docs/error-estimate.md): bound 1 % (plus the free limit's 1 %).
# * value_bits 8: as float32 (the rounding variance is tiny); value_bits 2 and 1: the rounding
#   variance is modelled as step^2/6 per value; measured within 1.5 % (2 bits) and 2.5 %
#   (1 bit): bounds 3 % and 4 %.
# * EDEN: the Lloyd-Max distortion of N(0, 1) stands in for that of a rotated coordinate at
#   finite d; measured +1 to +1.3 % at d = 256: bound 2.5 %.
# * Rand-k-Wangni: (m - (k - s))^2 / c^2 is exactly unbiased (m: the kept values at 1/c, a
#   sum of Bernoulli(p_j) with mean k - s known from the message): bound 0.
FREE = 0.01


def _label(name: str, kw: dict[str, Any]) -> str:
    return name + "".join(f"-{key}={val}" for key, val in kw.items() if key != "k")


CONFIGS: list[tuple[str, dict[str, Any], float]] = [
    ("rand-k", {"k": K}, 0.0),
    ("rand-k-spatial", {"k": K}, 0.0),
    ("rand-k-spatial", {"k": K, "transform": "max"}, 0.0),
    ("rand-proj-spatial", {"k": K}, FREE),
    ("rand-proj-spatial", {"k": K, "transform": "max"}, FREE),
    ("rand-proj-spatial", {"k": K, "transform": "one"}, 0.0),
    ("rand-proj-spatial", {"k": K, "transform": "auto"}, FREE),
    ("rand-proj-spatial", {"k": K, "transform": "auto", "prior_r": 3.0}, FREE),
    ("rand-proj-spatial", {"k": K, "transform": 2.0}, FREE),
    ("rand-proj-spatial", {"k": K, "projection": "hblocks"}, 0.02),
    ("rand-proj-spatial", {"k": K, "projection": "dct"}, 0.02),
    ("rand-proj-spatial", {"k": K, "block_size": 64}, 0.02),
    ("rand-proj-spatial", {"k": K, "value_bits": 8}, FREE),
    ("rand-proj-spatial", {"k": K, "value_bits": 2}, FREE + 0.03),
    ("rand-k", {"k": K, "value_bits": 2}, 0.03),
    ("rand-k-spatial", {"k": K, "value_bits": 1}, 0.04),
    ("eden", {"bits": 1}, 0.025),
    ("eden", {"bits": 2}, 0.025),
    ("qsgd", {"bits": 2}, 0.0),
    ("rand-k-wangni", {"k": K}, 0.0),
    ("induced", {"k": K}, 0.0),
]


# Spiky vectors for the schemes whose error depends on the vectors' shape beyond A and B
# (coordinate sampling, the per-message schemes) and for the SRHT and hblocks.
# (EDEN is not: its estimate assumes Gaussian rotated coordinates, see
# test_eden_overstates_on_spiky_vectors.)
SPIKY = {"rand-k", "rand-k-spatial", "rand-proj-spatial", "rand-proj-spatial-projection=hblocks",
         "qsgd-bits=2", "rand-k-wangni", "induced"}
UNBIASED_CASES = [(name, kw, bound, kind) for name, kw, bound in CONFIGS
                  for kind in ("correlated", "spiky")
                  if kind == "correlated" or _label(name, kw) in SPIKY]


@pytest.mark.parametrize(("name", "kw", "bound", "kind"), UNBIASED_CASES,
                         ids=[f"{_label(n, kw)}-{kind}" for n, kw, _, kind in UNBIASED_CASES])
def test_squared_error_estimate_is_unbiased(name: str, kw: dict[str, Any], bound: float,
                                            kind: str) -> None:
    est = rpsagg.make_estimator(name, n=N, d=D, **kw)
    tr = run_trials(est, vectors(kind), trials=300)
    tr.check_unbiased(bound, f"{_label(name, kw)} on {kind} vectors")
    # ||x_bar||^2 = (A_hat + B_hat)/n^2, or ||x_hat||^2 - MSE_hat: unbiased where the squared
    # error's estimate is (its bias carries over, hence the same bound on the MSE's scale)
    true_sq = float(np.sum(vectors(kind).mean(axis=0) ** 2))
    q = tr.mean_sq
    tol = Z * q.std(ddof=1) / math.sqrt(q.size) + bound * tr.measured.mean() + 1e-12
    assert abs(q.mean() - true_sq) <= tol, (q.mean(), true_sq, tol)


@pytest.mark.parametrize("padded", ["srht", "hblocks", "dct"])
def test_estimate_at_d_not_a_power_of_two(padded: str) -> None:
    # d = 300: the SRHT pads to 512 (the estimate keeps d/d' of the error), hblocks and the
    # DCT act on d itself; the form is approximate for all three (bound 1 % + free limit's 1 %).
    est = rpsagg.make_estimator("rand-proj-spatial", n=N, k=K, d=300, projection=padded)
    tr = run_trials(est, vectors("correlated", d=300), trials=300)
    tr.check_unbiased(0.02, f"{padded} d=300")


def test_full_has_zero_error() -> None:
    est = rpsagg.make_estimator("full", n=N, k=K, d=D)
    x = vectors("correlated")
    res = est.decode_with_info([est.encode(x[i], i + 1) for i in range(N)])
    info = res.error_estimate
    assert info is not None
    assert info.squared_error == 0.0
    assert info.squared_error_stderr == 0.0
    assert info.method == "exact"
    assert est.predicted_relative_error(3.0) == 0.0


def test_near_the_hard_edge_the_monte_carlo_runs() -> None:
    # max at nk = D, where the free limit diverges: the coefficients come from the Monte Carlo
    # over the exact spectrum. No mean comparison here: the squared error is heavy-tailed on
    # the edge (300 rounds on correlated vectors: median 330, mean 5e4, largest 5e6; the Monte
    # Carlo's own rel_se stays near 0.45 after 150 samples), so its mean does not settle.
    k = D // N
    est = rpsagg.make_estimator("rand-proj-spatial", n=N, k=k, d=D, transform="max")
    tr = run_trials(est, vectors("correlated"), trials=20)
    assert tr.methods == {"mc"}
    coef = est.coefficients()
    assert coef.method == "mc"
    assert math.isfinite(coef.a) and math.isfinite(coef.b)
    assert np.all(np.isfinite(tr.estimated))


# ---------------------------------------------------------------------------------------------
# n' < n: a subset of the messages decoded; the target is the mean of those clients' vectors

SUBSET_CONFIGS: list[tuple[str, dict[str, Any], float]] = [
    ("rand-k-spatial", {"k": K}, 0.0),
    ("rand-proj-spatial", {"k": K}, FREE),
    ("rand-proj-spatial", {"k": K, "transform": "max"}, FREE),
    ("rand-proj-spatial", {"k": K, "transform": "auto", "prior_r": 3.0}, FREE),
    ("rand-proj-spatial", {"k": K, "block_size": 64}, 0.02),
    ("eden", {"bits": 2}, 0.025),
    ("qsgd", {"bits": 2}, 0.0),
]


@pytest.mark.parametrize(("name", "kw", "bound"), SUBSET_CONFIGS,
                         ids=[_label(n, kw) for n, kw, _ in SUBSET_CONFIGS])
def test_subset_decode_estimates_its_own_error(name: str, kw: dict[str, Any],
                                                bound: float) -> None:
    est = rpsagg.make_estimator(name, n=N, d=D, **kw)
    tr = run_trials(est, vectors("correlated"), subset=[0, 2, 3, 5, 6])
    tr.check_unbiased(bound, f"{_label(name, kw)} with n' = 5 of {N}")


# ---------------------------------------------------------------------------------------------
# The reported standard error against the spread of the estimate

# (configuration, vectors, the stated range of rms(stderr) / sd(estimate)). Measured over 1500
# rounds (docs/error-estimate.md): SRHT/hblocks/DCT 0.84-1.03 (lowest on identical vectors),
# Rand-k 0.95-1.0, QSGD/EDEN/induced 0.9-1.1; Rand-k-Spatial on identical vectors 0.6-0.7 (the
# Wishart model misses the fourth moments of unrotated coordinates). Widened by 3 x 3.5 %.
STDERR_CONFIGS: list[tuple[str, dict[str, Any], str, float, float]] = [
    ("rand-proj-spatial", {"k": K}, "orthogonal", 0.8, 1.25),
    ("rand-proj-spatial", {"k": K}, "identical", 0.75, 1.25),
    ("rand-proj-spatial", {"k": K, "transform": "max"}, "correlated", 0.75, 1.25),
    ("rand-proj-spatial", {"k": K, "projection": "hblocks"}, "correlated", 0.75, 1.25),
    ("rand-k", {"k": K}, "correlated", 0.8, 1.25),
    ("rand-k-spatial", {"k": K}, "orthogonal", 0.8, 1.25),
    ("rand-k-spatial", {"k": K}, "identical", 0.5, 1.0),
    ("eden", {"bits": 2}, "correlated", 0.8, 1.25),
    ("qsgd", {"bits": 2}, "correlated", 0.8, 1.25),
    ("induced", {"k": K}, "correlated", 0.8, 1.25),
    # Rand-k-Wangni: 2 Var(m)^2 / c^4 with the plug-in Var(m); measured 0.98-1.24 (uneven p_j
    # highest)
    ("rand-k-wangni", {"k": K}, "correlated", 0.75, 1.35),
    # quantized values: Var(A_hat_i) is the larger of the sample's and the Gaussian model's,
    # plus the rounding's own (at 1 bit every squared value is the scale's square, so the
    # sample variance alone is 0). Measured over 300 rounds: 1.03-1.07 at 1 bit, 1.01-1.11
    # at 2 bits.
    ("rand-k-spatial", {"k": K, "value_bits": 1}, "correlated", 0.8, 1.3),
    ("rand-proj-spatial", {"k": K, "value_bits": 1}, "correlated", 0.8, 1.3),
    ("rand-proj-spatial", {"k": K, "value_bits": 2}, "correlated", 0.8, 1.3),
]


@pytest.mark.parametrize(("name", "kw", "kind", "lo", "hi"), STDERR_CONFIGS,
                         ids=[f"{_label(n, kw)}-{kind}" for n, kw, kind, _, _ in STDERR_CONFIGS])
def test_stderr_matches_the_spread_of_the_estimate(name: str, kw: dict[str, Any], kind: str,
                                                   lo: float, hi: float) -> None:
    est = rpsagg.make_estimator(name, n=N, d=D, **kw)
    tr = run_trials(est, vectors(kind))
    assert lo <= tr.stderr_factor <= hi, (name, kw, kind, tr.stderr_factor)


@pytest.mark.xfail(strict=True, reason="known limit (docs/error-estimate.md): EDEN's estimate "
                   "assumes Gaussian rotated coordinates")
def test_eden_on_spiky_vectors() -> None:
    # EDEN's term D_b ||z_hat||^2 takes the Lloyd-Max distortion of N(0, 1); one randomized
    # Hadamard of a vector with five large coordinates leaves each rotated coordinate a sum of
    # five signed spikes, far from Gaussian. Measured (1500 rounds): +17 % at 1 bit, +44 % at
    # 2 bits, +158 % at 4 bits; +0-2 % on Gaussian-like vectors.
    est = rpsagg.make_estimator("eden", n=N, d=D, bits=2)
    run_trials(est, vectors("spiky"), trials=300).check_unbiased(0.025, "eden on spiky vectors")


# ---------------------------------------------------------------------------------------------
# The coefficients: the free limit against the Monte Carlo, the cold cost at scale


@pytest.mark.parametrize(("n", "k", "dim", "c"), [
    (8, 16, 256, 8 / 14), (8, 16, 256, 1.0), (16, 8, 256, 16 / 30), (4, 60, 256, 0.9),
    (10, 50, 1024, 1.0), (20, 20, 1024, 0.6),
])
def test_free_limit_against_monte_carlo(n: int, k: int, dim: int, c: float) -> None:
    # The MSE each set of coefficients predicts for orthogonal (n a) and identical
    # (n a + n(n-1) b) unit vectors, free limit against the Monte Carlo with the Monte Carlo's
    # beta: within FREE_REL_ERROR = 3 % (the stated bound) plus 4 Monte Carlo standard errors.
    # Measured: at most 1.1 % (n = 4, k = 60, c = 0.9, identical vectors).
    beta = _beta.rps_beta_mc(n, k, dim, c).beta
    free = free_coefficients(n, k, dim, c)
    mc = mc_coefficients(n, k, dim, c, beta, time_budget=2.0)
    assert free.method == "free"
    assert mc.method == "mc"
    assert FREE_REL_ERROR <= 0.03
    for f_val, m_val in ((n * free.a, n * mc.a),
                         (n * free.a + n * (n - 1) * free.b, n * mc.a + n * (n - 1) * mc.b)):
        assert abs(f_val / m_val - 1.0) <= FREE_REL_ERROR + 4 * mc.rel_se, (f_val, m_val)


@pytest.mark.parametrize("transform", ["avg", "max", 500.0])
def test_cold_coefficients_at_scale_take_the_free_path(transform: str | float,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # (n, k, d) = (1000, 2^14, 2^24): nk = D, so max sits on the hard edge; nk is far above
    # MC_MAX_NK, so no Monte Carlo may run (an eigendecomposition of a 2^24 x 2^24 Gram matrix
    # is out of reach): the free limit answers, in microseconds.
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Monte Carlo ran")

    monkeypatch.setattr(_error_coef, "mc_coefficients", refuse)
    monkeypatch.setattr(_error_coef, "_spectral_sums", refuse)
    monkeypatch.setattr(_error_coef, "_memory", {})
    n, k, d = 1000, 2**14, 2**24
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=transform)
    c = est._c_for(n)
    coef = rps_coefficients(n, k, d, c, 1.0)
    assert coef.method == "free"
    if transform == "max":  # on the edge: no stated accuracy
        assert coef.rel_se == math.inf
    else:
        assert coef.rel_se == FREE_REL_ERROR
        assert math.isfinite(coef.a) and math.isfinite(coef.b)


# ---------------------------------------------------------------------------------------------
# predicted_relative_error(R) against the relative error measured at a known R

PREDICT_CONFIGS: list[tuple[str, dict[str, Any], float]] = [
    ("rand-k", {"k": K}, 0.0),
    ("rand-k-spatial", {"k": K}, 0.0),
    ("rand-proj-spatial", {"k": K}, FREE),
    ("rand-proj-spatial", {"k": K, "transform": "max"}, FREE),
    ("rand-proj-spatial", {"k": K, "transform": "auto"}, FREE),
    ("rand-proj-spatial", {"k": K, "value_bits": 8}, FREE + 0.01),
    # EDEN: D_b/(1 - D_b), the Gaussian limit: measured within 2 % at d = 256.
    ("eden", {"bits": 2}, 0.03),
    # QSGD: the Gaussian model of the coordinates; correlated_vectors are random rotations,
    # Gaussian-like: measured within 2 %.
    ("qsgd", {"bits": 2}, 0.03),
]


@pytest.mark.parametrize(("name", "kw", "bound"), PREDICT_CONFIGS,
                         ids=[_label(n, kw) for n, kw, _ in PREDICT_CONFIGS])
@pytest.mark.parametrize("r", [0.0, 3.0, 7.0])
def test_predicted_relative_error_at_known_r(name: str, kw: dict[str, Any], bound: float,
                                             r: float) -> None:
    est = rpsagg.make_estimator(name, n=N, d=D, **kw)
    if kw.get("transform") == "auto":
        est = est.with_prior(r)
    x = correlated_vectors(N, D, r, seed=11)
    mean_sq = float(np.sum(x.mean(axis=0) ** 2))
    tr = run_trials(est, x, trials=300)
    measured = tr.measured.mean() / mean_sq
    se = tr.measured.std(ddof=1) / math.sqrt(tr.measured.size) / mean_sq
    predicted = est.predicted_relative_error(r)
    assert abs(measured - predicted) <= Z * se + bound * predicted, (measured, predicted, se)


@pytest.mark.parametrize("name", ["rand-k-wangni", "induced"])
def test_no_prediction_for_the_data_adaptive_schemes(name: str) -> None:
    with pytest.raises(NotImplementedError):
        rpsagg.make_estimator(name, n=N, k=K, d=D).predicted_relative_error(1.0)
