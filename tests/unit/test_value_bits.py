"""``value_bits``: the k values of Rand-k, Rand-k-Spatial and Rand-Proj-Spatial as b-bit codes.

Tolerances as in test_statistics.py (Z = 4 standard errors over i.i.d. trials with fresh
seeds; per-coordinate ``max_j |z_j| <= 5``, Bonferroni over d coordinates).

The rounding adds noise of known variance: a value at position ``t`` of the grid (step
``2m/L``, ``L = 2^b - 1``) is rounded up with probability ``p = frac(t)``, so its variance is
``(2m/L)^2 p (1 - p)``. Rand-k's decode is ``beta sum_i E_i^T y_i`` with ``beta = d/(nk)``,
so with the same seeds the quantized error exceeds the float error by, in expectation,
``beta^2 sum_i sum_j (2 m_i / L)^2 p_ij (1 - p_ij)`` (the cross term has mean 0 because the
rounding is unbiased). ``test_rand_k_extra_error_is_the_rounding_variance`` checks exactly
that, trial by trial.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import rpsagg
from rpsagg._quantize import dequantize, float32_ceil, quantize_uniform
from rpsagg.synthetic import correlated_vectors

pytestmark = pytest.mark.unit

Z = 4.0
N, K, D = 10, 10, 100


def estimates(est: rpsagg.Estimator, xs: np.ndarray, count: int, offset: int) -> np.ndarray:
    out = np.empty((count, xs.shape[1]))
    for t in range(count):
        out[t] = est.decode([est.encode(x, offset + t * len(xs) + i) for i, x in enumerate(xs)])
    return out


def test_uniform_rounding_is_unbiased_per_value() -> None:
    # E[dequantize] = m (2 E[c] - L) / L with E[c] = floor(t) + frac(t) = t: check the mean
    # over 20,000 seeds of each of 5 values against v, within Z s.e.
    v = np.array([-1.0, -0.3, 0.0, 0.123, 0.77])
    for bits in (1, 2, 5):
        got = np.empty((20_000, v.size))
        for s in range(got.shape[0]):
            codes, m = quantize_uniform(v, bits, s)
            got[s] = dequantize("uniform", codes, np.array([m]), bits)
        se = got.std(axis=0, ddof=1) / math.sqrt(got.shape[0])
        assert np.all(np.abs(got.mean(axis=0) - v) <= Z * se + 1e-7), (bits, got.mean(axis=0))
        assert float32_ceil(1.0) == 1.0 and got.max() <= 1.0  # the max-abs value is on the grid


@pytest.mark.parametrize(
    ("name", "transform", "bits"),
    [
        ("rand-k", "avg", 1),
        ("rand-k-spatial", "avg", 2),
        ("rand-k-spatial", "max", 1),
        ("rand-proj-spatial", "avg", 1),
        ("rand-proj-spatial", "max", 4),
    ],
)
def test_unbiased_with_quantized_values(name: str, transform: str, bits: int) -> None:
    xs = correlated_vectors(N, D, 4.0, seed=5) * np.linspace(0.5, 2.0, D)
    x_bar = xs.mean(axis=0)
    est = rpsagg.make_estimator(name, n=N, k=K, d=D, transform=transform, value_bits=bits)
    got = estimates(est, xs, 2000, offset=80_000)
    b = (got - x_bar) @ x_bar / (x_bar @ x_bar)
    assert abs(b.mean()) <= Z * b.std(ddof=1) / math.sqrt(b.size), b.mean()
    s = got.std(axis=0, ddof=1)
    z = (got.mean(axis=0) - x_bar) / (s / math.sqrt(got.shape[0]))
    assert np.max(np.abs(z)) <= 5.0, np.max(np.abs(z))


@pytest.mark.parametrize("bits", [1, 3, 8])
def test_rand_k_extra_error_is_the_rounding_variance(bits: int) -> None:
    xs = correlated_vectors(N, D, 4.0, seed=6)
    x_bar = xs.mean(axis=0)
    flt = rpsagg.make_estimator("rand-k", n=N, k=K, d=D)
    qnt = rpsagg.make_estimator("rand-k", n=N, k=K, d=D, value_bits=bits)
    top = 2**bits - 1
    beta = D / (N * K)
    diffs = np.empty(1500)
    for t in range(diffs.size):
        seeds = [90_000 + t * N + i for i in range(N)]
        f_msgs = [flt.encode(x, s) for x, s in zip(xs, seeds, strict=True)]
        q_msgs = [qnt.encode(x, s) for x, s in zip(xs, seeds, strict=True)]
        predicted = 0.0
        for msg in f_msgs:
            v = msg.values.astype(np.float64)
            m = float(float32_ceil(float(np.max(np.abs(v)))))
            pos = (v + m) * (top / (2 * m))
            p = pos - np.floor(pos)
            predicted += (2 * m / top) ** 2 * float(np.sum(p * (1 - p)))
        err_f = np.sum((flt.decode(f_msgs) - x_bar) ** 2)
        err_q = np.sum((qnt.decode(q_msgs) - x_bar) ** 2)
        diffs[t] = err_q - err_f - beta**2 * predicted
    assert abs(diffs.mean()) <= Z * diffs.std(ddof=1) / math.sqrt(diffs.size), diffs.mean()


def test_sizes() -> None:
    x = np.ones(D)
    for name in ("rand-k", "rand-k-spatial", "rand-proj-spatial"):
        msg = rpsagg.make_estimator(name, n=N, k=K, d=D, value_bits=3).encode(x, 1)
        assert msg.value_bits == 3 and msg.codes is not None and msg.codes.size == K
        assert msg.bits == 64 + 3 * K + 32
        assert msg.payload_bytes == 8 + math.ceil(3 * K / 8) + 4
        full = rpsagg.make_estimator(name, n=N, k=K, d=D).encode(x, 1)
        assert full.bits == 64 + 32 * K and full.codes is None
    wangni = rpsagg.make_estimator("rand-k-wangni", n=N, k=K, d=D).encode(np.arange(D + 0.0), 1)
    assert wangni.bits == 64 + 64 * wangni.values.size


def test_quantized_messages_need_spec_v3() -> None:
    # packed codes exist from rpsagg-seed-v3 on: a message that claims an older format (or
    # none: v1) is refused by the decoder, the same message claiming v3 decodes
    import dataclasses

    est = rpsagg.make_estimator("rand-k", n=2, k=4, d=16, value_bits=2)
    msgs = [est.encode(np.arange(16.0), seed=s) for s in (1, 2)]
    assert all(m.spec_version == rpsagg.SPEC_VERSION == "rpsagg-seed-v5" for m in msgs)
    assert est.decode(msgs).shape == (16,)
    for old in ("rpsagg-seed-v2", "rpsagg-seed-v1"):
        stale = [dataclasses.replace(m, spec_version=old) for m in msgs]
        with pytest.raises(ValueError, match="has no quantized values"):
            est.decode(stale)
