"""Blockwise Rand-Proj-Spatial: each block is an independent Rand-Proj-Spatial problem."""

from __future__ import annotations

import numpy as np
import pytest
from repo_paths import ROOT

import rpsagg
from rpsagg._blockwise import block_budgets, block_seed
from rpsagg.synthetic import correlated_vectors

pytestmark = pytest.mark.unit


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
    # Same statistic and derivation as tests/unit/test_statistics.py::test_unbiased.
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


# -- quantized blockwise values (docs/wire-format.md section 15) -------------------------------
def test_quantized_blocks_are_the_section_13_messages_of_the_blocks() -> None:
    # Block j's codes and scale are those of a plain quantized Rand-Proj-Spatial message of
    # the (zero-padded) block with seed block_seed(seed, j); the decode is the per-block one.
    n, k, d, b, bits = 4, 10, 100, 32, 3
    xs = np.random.default_rng(1).standard_normal((n, d)) * np.linspace(0.1, 3.0, d)
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=b,
                                value_bits=bits)
    msgs = [est.encode(x, 500 + i) for i, x in enumerate(xs)]
    assert msgs[0].spec_version == "rpsagg-seed-v5" and est.wire.spec_version == "rpsagg-seed-v5"
    assert est.scale_counts == tuple(block_budgets(k, 4)) == (3, 3, 2, 2)
    assert msgs[0].scales is not None and msgs[0].scales.size == 4
    assert msgs[0].bits == 64 + bits * k + 32 * 4
    expected = []
    offset = 0
    for j, kb in enumerate(block_budgets(k, 4)):
        sub = rpsagg.make_estimator("rand-proj-spatial", n=n, k=kb, d=b, value_bits=bits)
        block = np.zeros((n, b))
        part = xs[:, j * b : (j + 1) * b]
        block[:, : part.shape[1]] = part
        sub_msgs = [sub.encode(row, block_seed(500 + i, j)) for i, row in enumerate(block)]
        for m, s in zip(msgs, sub_msgs, strict=True):
            assert m.codes is not None and m.scales is not None and s.scales is not None
            np.testing.assert_array_equal(m.codes[offset : offset + kb], s.codes)
            np.testing.assert_array_equal(m.values[offset : offset + kb], s.values)
            assert m.scales[j] == s.scales[0]
        expected.append(sub.decode(sub_msgs))
        offset += kb
    np.testing.assert_allclose(est.decode(msgs), np.concatenate(expected)[:d], rtol=1e-12)
    # the blocks' scales differ (x grows along d): one grid per block, not the largest one's
    assert msgs[0].scales is not None and msgs[0].scales[0] < msgs[0].scales[2] / 2


def test_quantized_blockwise_rounding_is_unbiased_with_the_per_block_variance() -> None:
    # Per value the code's value q differs from the unquantized binary64 sketch value v by
    # e = q - v, with E[e] = 0 and Var[e] = f (1 - f) D^2 exactly, where D = 2 m_j / L is the
    # block's grid step and f = t - floor(t) the value's place in its cell (the Bernoulli(f)
    # rounding: e = (1 - f) D w.p. f, -f D w.p. 1 - f). Over N independent values (fresh
    # seeds: the rounding uniforms of different seeds are independent)
    #   S1 = sum e,        Var[S1] = sum f(1-f) D^2 =: V;
    #   S2 = sum e^2,      E[S2] = V,  Var[S2] = sum D^4 f(1-f)(1-2f)^2 =: W
    # (E[e^4] = D^4 f(1-f)(f^3 + (1-f)^3), minus (E[e^2])^2). With N ~ 2e4 values the CLT
    # applies to both sums; |S1| <= 5 sqrt(V) and |S2 - V| <= 5 sqrt(W) fail with
    # probability ~6e-7 each for a correct quantizer (fixed seeds: deterministic here). x's
    # four blocks differ 80x in scale, so both sums also check that each block's codes are
    # on its own scale's grid.
    n, k, d, b, bits, trials = 1, 96, 400, 64, 3, 300
    top = (1 << bits) - 1
    x = np.random.default_rng(2).standard_normal(d) * np.repeat([0.05, 0.2, 1.0, 4.0], 100)
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=b,
                                value_bits=bits)
    counts = np.array(block_budgets(k, est.blocks))
    s1 = s2 = var = w = 0.0
    for t in range(trials):
        seed = 77_000 + t
        msg = est.encode(x, seed)
        assert msg.codes is not None and msg.scales is not None
        v, _ = est._encode(x, seed)  # the binary64 quantizer input (section 15's v_p)
        m = np.repeat(msg.scales.astype(np.float64), counts)
        step = 2.0 * m / top
        q = m * (2.0 * msg.codes.astype(np.float64) - top) / top
        pos = (v + m) * (top / (2.0 * m))
        f = pos - np.floor(pos)
        e = q - v
        s1 += float(e.sum())
        s2 += float((e * e).sum())
        var += float((f * (1 - f) * step**2).sum())
        w += float((step**4 * f * (1 - f) * (1 - 2 * f) ** 2).sum())
    assert abs(s1) <= 5 * np.sqrt(var)
    assert abs(s2 - var) <= 5 * np.sqrt(w)


def test_quantized_blockwise_estimator_is_unbiased() -> None:
    # Same statistic and derivation as test_blockwise_is_unbiased (and
    # tests/unit/test_statistics.py::test_unbiased), with 3-bit block codes.
    n, k, d, b, trials = 6, 12, 100, 32, 1500
    xs = correlated_vectors(n, d, 2.0, seed=9) * np.linspace(0.5, 2.0, d)
    x_bar = xs.mean(axis=0)
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=b,
                                value_bits=3)
    estimates = np.empty((trials, d))
    for t in range(trials):
        estimates[t] = est.decode([est.encode(x, 19_000 + t * n + i) for i, x in enumerate(xs)])
    proj = (estimates - x_bar) @ x_bar / (x_bar @ x_bar)
    assert abs(proj.mean()) <= 4 * proj.std(ddof=1) / np.sqrt(trials)
    z = (estimates.mean(axis=0) - x_bar) / (estimates.std(axis=0, ddof=1) / np.sqrt(trials))
    assert np.max(np.abs(z)) <= 5.0


def test_quantized_blockwise_decode_checks() -> None:
    from dataclasses import replace

    est = rpsagg.make_estimator("rand-proj-spatial", n=3, k=8, d=100, block_size=32,
                                value_bits=4)
    x = np.random.default_rng(3).standard_normal(100)
    msgs = [est.encode(x, 1), est.encode(x, 2)]
    result = est.decode_with_info(msgs)
    assert result.error_estimate is not None and result.error_estimate.quantization > 0
    assert msgs[1].scales is not None
    with pytest.raises(ValueError, match="has 1 scales; expected 4"):
        est.decode([msgs[0], replace(msgs[1], scales=msgs[1].scales[:1])])
    with pytest.raises(ValueError, match="needs 'rpsagg-seed-v5'"):
        est.decode([msgs[0], replace(msgs[1], spec_version="rpsagg-seed-v4")])
    floats = rpsagg.make_estimator("rand-proj-spatial", n=3, k=8, d=100, block_size=32)
    assert floats.wire.spec_version == "rpsagg-seed-v1" and floats.scale_counts == (2, 2, 2, 2)
    with pytest.raises(ValueError, match="8-bit values; expected 4-bit"):
        est.decode([rpsagg.make_estimator("rand-proj-spatial", n=3, k=8, d=100,
                                          block_size=32, value_bits=8).encode(x, 3)])
    auto = rpsagg.make_estimator("rand-proj-spatial", n=3, k=8, d=100, block_size=32,
                                 value_bits=4, transform="auto").with_prior(1.0)
    assert auto.value_bits == 4 and auto.encode(x, 1).scales is not None


def test_blockwise_quantized_vectors_from_the_documented_rule() -> None:
    # docs/wire-format.md section 15 in plain Python (integers, binary64 and struct only):
    # block seeds, each block's SRHT values, scale rounded up to binary32, stochastic
    # rounding from the block seed's rpsQRND_ stream, one packed stream of all k codes.
    import json
    import math
    import struct

    from wire_reference import ref_encode, ref_key, ref_mix64, ref_uniforms

    vectors = json.loads((ROOT / "docs"
                          / "wire-vectors.json").read_text(encoding="utf-8"))
    cases = vectors["blockwise_quantized_cases"]
    assert len(cases) >= 6
    for c in cases:
        seed, k, d, b, bits = int(c["seed"], 16), c["k"], c["d"], c["block_size"], c["value_bits"]
        x = [float((j % 7) - 3) if c.get("x", "golden") == "golden" else 0.0 for j in range(d)]
        blocks = -(-d // b)
        budgets = [k // blocks + (1 if j < k % blocks else 0) for j in range(blocks)]
        top = (1 << bits) - 1
        codes: list[int] = []
        scales: list[str] = []
        for j, kb in enumerate(budgets):
            bseed = ref_mix64(ref_key(seed, "rpsBLOCK") ^ j)
            assert c["blocks"][j]["seed"] == hex(bseed)
            part = (x[j * b : (j + 1) * b] + [0.0] * b)[:b]
            v = ref_encode(part, bseed, kb)
            assert [a.hex() for a in v] == c["blocks"][j]["values_f64"]
            mag = max(abs(a) for a in v)
            m = struct.unpack("<f", struct.pack("<f", mag))[0]
            if m < mag:
                m = struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack(
                    "<f", m))[0] + 1))[0]
            scales.append(hex(struct.unpack("<I", struct.pack("<f", m))[0]))
            if m == 0:
                codes += [0] * kb
                continue
            for a, u in zip(v, ref_uniforms(bseed, "rpsQRND_", kb), strict=True):
                t = (a + m) * (top / (2 * m))
                codes.append(min(top, max(0, math.floor(t) + (1 if u < t - math.floor(t)
                                                             else 0))))
        stream = [(cv >> i) & 1 for cv in codes for i in range(bits)]
        stream += [0] * (-len(stream) % 8)
        packed = bytes(sum(bit << i for i, bit in enumerate(stream[p : p + 8]))
                       for p in range(0, len(stream), 8))
        assert packed.hex() == c["packed_hex"] and scales == c["scales_bits"]
        assert budgets == c["budgets"] and c["bits"] == 64 + bits * k + 32 * blocks
