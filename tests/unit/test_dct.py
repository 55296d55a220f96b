"""The subsampled randomized DCT (projection ``"dct"``, wire format ``rpsagg-seed-v2``).

Pinned three ways, as the SRHT in ``test_spec.py``: a plain-Python reference of
``docs/wire-format.md`` section 12, the golden vectors of ``docs/wire-vectors.json``, and the
dense matrix against the matrix-free operators. Then the statistics that made it the default
for d not a power of two until v4 (now hblocks, ``test_hblocks.py``): at d = 300, RPS(one)
has Rand-k's MSE and RPS(max) on identical vectors has d/(nk) - 1, where the padded SRHT is
21% and 11% worse.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from anyd_util import check_joint_operator
from test_spec import VECTORS
from wire_reference import (
    f32_bits,
    golden_x,
    ref_dct_encode,
    ref_key,
    ref_sign_bits,
)

import rpsagg
from rpsagg import spec
from rpsagg._dct import JointDCT, dct_encode, dct_matrix
from rpsagg._projection import resolve_projection

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------------------
# Golden vectors (docs/wire-vectors.json) and the reference
# --------------------------------------------------------------------------------------
def test_shift_stream_keys_match_the_vectors() -> None:
    for seed, keys in VECTORS["keys"].items():
        assert ref_key(int(seed, 16), "rpsSHIFT") == int(keys["SHIFT"], 16)
        assert spec.stream_key(int(seed, 16), spec.TAG_SHIFT) == int(keys["SHIFT"], 16)


@pytest.mark.parametrize("case", VECTORS["dct_cases"], ids=lambda c: f"d={c['d']}")
def test_golden_dct_vectors(case: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    seed, k, d = int(str(case["seed"]), 16), int(str(case["k"])), int(str(case["d"]))
    x = golden_x(d)
    tol = float(VECTORS["dct_abs_tolerance"]) * max(1.0, math.sqrt(sum(v * v for v in x)))
    shift, rows, ref = ref_dct_encode(x, seed, k)
    # the reference reproduces the file's integers and values
    assert shift == case["shift"] == spec.dct_shift(seed, d)
    assert rows == case["rows"] == spec.sample_distinct(seed, spec.TAG_ROWS, k, d).tolist()
    bits = ref_sign_bits(seed, d)[:64]
    assert hex(sum(b << j for j, b in enumerate(bits))) == case["sign_bits"]
    expected = [float(v) for v in case["y_f64"]]  # type: ignore[attr-defined]
    assert np.allclose(ref, expected, rtol=0, atol=1e-12)
    assert [hex(f32_bits(v)) for v in expected] == case["y_f32"]
    # the library, with the compiled sign kernel and with numpy, within the stated tolerance
    for native in (spec.NATIVE, None):
        monkeypatch.setattr(spec, "NATIVE", native)
        est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d, projection="dct")
        msg = est.encode(np.array(x), seed=seed)
        assert msg.scheme == "rand-proj-spatial:dct"
        assert msg.spec_version == rpsagg.SPEC_VERSION  # v4: the DCT is defined from v2 on
        assert np.max(np.abs(msg.values.astype(np.float64) - expected)) <= tol


def test_library_matches_reference_on_random_input() -> None:
    rng = np.random.default_rng(5)
    for d in (2, 3, 17, 100, 300):
        x = rng.standard_normal(d)
        for seed in (int(s) for s in rng.integers(0, 2**63, size=3, dtype=np.uint64)):
            k = min(d, 11)
            _, _, ref = ref_dct_encode(x.tolist(), seed, k)
            np.testing.assert_allclose(dct_encode(x, seed, k), ref, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------
# The dense matrix and the matrix-free operators
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("seed", "k", "d"), [(0, 4, 100), (2**64 - 1, 12, 12), (5, 1, 1),
                                              (9, 30, 300), (3, 7, 97)])
def test_dct_matrix_orthonormal_rows_and_encoding(seed: int, k: int, d: int) -> None:
    g = dct_matrix(seed, k, d)
    assert g.shape == (k, d)
    np.testing.assert_allclose(g @ g.T, np.eye(k), atol=1e-12)
    x = np.random.default_rng(seed % 1000).standard_normal(d)
    np.testing.assert_allclose(dct_encode(x, seed, k), g @ x, rtol=0, atol=1e-12)


def test_joint_operator_matches_dense_matrices() -> None:
    # the joint solve through the operator equals the dense formula A^T ((1-c) I + c K)^-1 y
    check_joint_operator(JointDCT.from_seeds, dct_matrix)


def test_default_projection_and_schemes() -> None:
    assert resolve_projection("auto", 256) == "srht"
    assert resolve_projection("auto", 300) == "hblocks"  # the default since v4
    assert resolve_projection("dct", 300) == "dct"
    assert resolve_projection("auto", 1) == "srht"
    with pytest.raises(ValueError, match="projection must be"):
        resolve_projection("fft", 300)
    est = rpsagg.make_estimator("rand-proj-spatial", n=3, k=5, d=300, projection="dct")
    assert (est.name, est.d_pad) == ("rand-proj-spatial:dct", 300)  # type: ignore[attr-defined]
    est = rpsagg.make_estimator("rand-proj-spatial", n=3, k=5, d=256)
    assert est.name == "rand-proj-spatial"
    # the scheme string of a message rebuilds its estimator
    again = rpsagg.make_estimator("rand-proj-spatial:dct", n=3, k=5, d=256)
    assert again.name == "rand-proj-spatial:dct"
    with pytest.raises(ValueError, match="projection applies to rand-proj-spatial only"):
        rpsagg.make_estimator("rand-k", n=3, k=5, d=300, projection="dct")
    # a message claiming v1 cannot be a DCT sketch; unknown versions are refused
    dct = rpsagg.make_estimator("rand-proj-spatial", n=3, k=5, d=300, projection="dct")
    msg = dct.encode(np.ones(300), seed=1)
    v1 = rpsagg.Encoded(msg.scheme, 1, 5, 300, msg.values, spec_version="rpsagg-seed-v1")
    with pytest.raises(ValueError, match="has no 'rand-proj-spatial:dct'"):
        dct.decode([v1])
    v9 = rpsagg.Encoded(msg.scheme, 1, 5, 300, msg.values, spec_version="rpsagg-seed-v9")
    with pytest.raises(ValueError, match="seed-v2, rpsagg-seed-v3, rpsagg-seed-v4, rpsagg-seed-v5"):
        dct.decode([v9])
    # an SRHT message of the v1 format still decodes
    srht = rpsagg.make_estimator("rand-proj-spatial", n=3, k=5, d=300, projection="srht")
    m = srht.encode(np.ones(300), seed=1)
    old = rpsagg.Encoded(m.scheme, 1, 5, 300, m.values, spec_version="rpsagg-seed-v1")
    np.testing.assert_array_equal(srht.decode([old]), srht.decode([m]))


def test_worked_example_of_the_document() -> None:
    # docs/wire-format.md, section 12: seed 1, d = 300, k = 9, x_j = (j mod 7) - 3
    assert spec.stream_key(1, spec.TAG_SHIFT) == 0xED100D1251F9BFF7
    assert spec.dct_shift(1, 300) == 62
    rows = spec.sample_distinct(1, spec.TAG_ROWS, 9, 300).tolist()
    assert rows == [118, 207, 4, 140, 297, 204, 121, 266, 154]
    bits = spec.sign_bits(1, 300)[:64]
    assert sum(int(b) << j for j, b in enumerate(bits)) == 0xE590BEA4ADE76226
    y = dct_encode(np.array(golden_x(300)), 1, 9)
    np.testing.assert_allclose(y[:3], [0.4706747515, 0.7972705461, -4.787007518], atol=1e-9)
