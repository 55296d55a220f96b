"""The mean update RandProjSpatialFedAvg applies is unbiased, through Flower's messages.

Each trial is one full round (``configure_train`` -> ``rpsagg_mod`` around a ClientApp ->
``aggregate_train``) with its own nonce and client seeds, on fixed, correlated client
updates ``x_i`` with FedAvg weights ``w_i`` (``num-examples``). The target is the weighted
mean ``mu = sum_i w_i x_i / sum_i w_i`` of the updates that arrived.

Tolerance. Let ``u_t`` be trial t's applied update (new minus old arrays, float64 model).
The trials are independent and, if the strategy is unbiased, ``E[u_t] = mu``. With ``T``
trials, coordinate j's sample mean ``m_j`` and sample variance ``s_j^2``, the statistic
``z_j = (m_j - mu_j) / (s_j / sqrt(T))`` is approximately standard normal (CLT: every
estimator here has finite variance; T = 300). The coordinates are correlated, so the
family-wise bound is Bonferroni's, which needs no independence. A bias along mu shows
in every coordinate a little; the pooled statistic ``r_t = <u_t, mu> / ||mu||^2`` (mean 1
when unbiased, its own sample spread) sees it at once, so it is the (d+1)-th z:
``P(max |z| > c) <= (d + 1) * 2 * (1 - Phi(c))``. With d = 60 and c = 4.5 that is
``61 * 6.8e-6 = 4.2e-4`` per test. (Scaling the update by 1.10 fails the Rand-k and
Rand-Proj-Spatial cases through the pooled z; the per-coordinate z alone misses it.)
The seeds are fixed, so the outcome is deterministic; the bound says how unlikely a false
failure was when the seeds were chosen.

What it catches: a missing or wrong beta, weights applied on one side only, the transform
or the seed derivation differing between mod and strategy (then the decode is garbage,
far off mu), an update applied to the wrong coordinates. ``s_j`` is the estimator's own
spread, so the test is as tight as T trials allow for each estimator. Coordinates that
never vary (Induced sends each client's top coordinates as they are) must equal the
weighted mean of the float32 values sent.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from rpsagg.spec import mix64
from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.payload import Layout, flatten

from .flower_util import model, run_round, seeds

pytestmark = pytest.mark.unit

SHAPES = {"w": ((6, 8), "float64"), "b": ((12,), "float64")}  # d = 60
D = 60
NODES = [11, 22, 33, 44]
WEIGHTS = {11: 1.0, 22: 2.0, 33: 3.0, 44: 6.0}
TRIALS = 300
C = 4.5


def client_updates() -> dict[int, np.ndarray]:
    """Correlated updates: a common direction plus individual parts (fixed, seed 7)."""
    rng = np.random.default_rng(7)
    common = rng.standard_normal(D)
    return {node: common + 0.6 * rng.standard_normal(D) + 0.1 * i
            for i, node in enumerate(NODES)}


def max_z(settings: dict[str, object], missing: tuple[int, ...] = (), seed: int = 0
          ) -> tuple[float, float]:
    """``max_j |z_j|`` over TRIALS rounds, and the Bonferroni probability of exceeding C."""
    updates = client_updates()
    nonces = seeds(10_000 + seed)
    strategy = RandProjSpatialFedAvg(nonces=lambda: next(nonces), **settings)  # type: ignore[arg-type]
    # client seeds by node and round: FedAvg samples the nodes in random order (Python's
    # unseeded random.sample), so a sequence of seeds would reach different nodes each run
    mod = make_rpsagg_mod(context_seeds=lambda msg, ctxt: mix64(
        20_000_000 + 1_000_000 * seed + 100 * int(msg.content["config"]["server-round"])
        + ctxt.node_id))
    arrays = model(SHAPES)
    layout = Layout.of(arrays)
    base = flatten(arrays, layout)
    arrived = [n for n in NODES if n not in missing]
    w = np.array([WEIGHTS[n] for n in arrived])
    mu = np.sum([WEIGHTS[n] * updates[n] for n in arrived], axis=0) / w.sum()
    out = np.empty((TRIALS, D))
    for t in range(TRIALS):
        rnd = run_round(strategy, arrays, updates, weights=WEIGHTS, mod=mod,
                        server_round=t + 1, missing=missing)
        assert rnd.arrays is not None and rnd.metrics is not None
        assert rnd.metrics["rpsagg.n-prime"] == len(arrived)
        out[t] = flatten(rnd.arrays, layout) - base
    m = out.mean(axis=0)
    s = out.std(axis=0, ddof=1)
    # Induced sends each client's top coordinates as they are (float32 on the wire): where
    # no trial varied, the estimate must be the weighted mean of those float32 values
    # (float64 rounding only); the z test covers the others.
    fixed = s == 0
    assert fixed.sum() < D // 2, "most coordinates never varied: not a randomized estimate"
    sent = [(WEIGHTS[n] * updates[n]).astype(np.float32).astype(np.float64) for n in arrived]
    np.testing.assert_allclose(m[fixed], (np.sum(sent, axis=0) / w.sum())[fixed], rtol=1e-12)
    z = (m[~fixed] - mu[~fixed]) / (s[~fixed] / np.sqrt(TRIALS))
    # the pooled direction: r_t = <u_t, mu> / ||mu||^2 has mean 1 when unbiased
    r = out @ mu / (mu @ mu)
    z_mu = (r.mean() - 1.0) / (r.std(ddof=1) / np.sqrt(TRIALS))
    return float(max(np.max(np.abs(z)), abs(z_mu))), (D + 1) * 2 * float(norm.sf(C))


CASES = {
    "rand-k": {"estimator": "rand-k", "k": 12},
    "rand-k-spatial(avg)": {"estimator": "rand-k-spatial", "k": 12, "transform": "avg"},
    "rand-k-spatial(max)": {"estimator": "rand-k-spatial", "k": 12, "transform": "max"},
    "rand-proj-spatial(avg), DCT": {"estimator": "rand-proj-spatial", "k": 12},
    "rand-proj-spatial(one), SRHT, 4-bit values": {
        "estimator": "rand-proj-spatial", "k": 12, "transform": "one", "projection": "srht",
        "value_bits": 4,
    },
    "rand-proj-spatial(avg), blocks of 16": {
        "estimator": "rand-proj-spatial", "k": 16, "block_size": 16,
    },
    "rand-k-wangni": {"estimator": "rand-k-wangni", "k": 12},
    "induced": {"estimator": "induced", "k": 12},
    "qsgd(2 bits)": {"estimator": "qsgd", "bits": 2},
    "rand-proj-spatial(avg), per layer": {"estimator": "rand-proj-spatial", "k": 12,
                                          "per_layer": True},
}


@pytest.mark.slow
@pytest.mark.parametrize("settings", list(CASES.values()), ids=list(CASES))
def test_mean_update_is_unbiased(settings: dict[str, object]) -> None:
    worst, p_false = max_z(settings)
    assert p_false < 1e-3
    assert worst < C, f"max |z| = {worst:.2f} over {D} coordinates (bound {C})"


@pytest.mark.slow
def test_unbiased_with_fewer_replies_than_sampled() -> None:
    """n' = 3 of n = 4: beta and the transform for n', the mean of the three that arrived."""
    worst, _ = max_z({"estimator": "rand-proj-spatial", "k": 12}, missing=(33,), seed=1)
    assert worst < C, f"max |z| = {worst:.2f} over {D} coordinates (bound {C})"
