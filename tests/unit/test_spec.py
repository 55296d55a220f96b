"""Wire format ``rpsagg-seed-v1``: golden vectors and a pure-Python reference.

The seed-to-transform derivation (``docs/wire-format.md``) must give the same signs, rows,
indices and uniforms in every language and on every machine, and the SRHT encoding must be
``(1/sqrt(d')) (H D x_pad)[rows]`` rounded to float32. This file pins it three ways:

* a plain-Python reference of the spec (Python ints and floats only, no numpy), written
  from the document (``conformance/wire_reference.py``, shared with the vector generator
  and the conformance runner), compared with the vectorized library on random inputs;
* golden values, generated once with the library and checked against the reference,
  hard-coded below, including SplitMix64's published outputs for seeds 0 and 1234567;
* a fresh interpreter (with each FWHT backend) reproduces the golden values.

It also checks ``srht_matrix`` (orthonormal rows, agrees with the encoder), the FWHT
backends against a dense Sylvester-Hadamard matrix, and the ValueErrors on bad inputs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import wire_reference
from repo_paths import ROOT, TESTS
from wire_reference import (  # the plain-Python reference of the spec (conformance/)
    MASK64,
    f32_bits,
    golden_x,
    named_x,
    ref_encode,
    ref_induced_encode,
    ref_key,
    ref_round_seed,
    ref_sample_distinct,
    ref_sign_bits,
    ref_tag,
    ref_uniforms,
    ref_wangni_c,
    ref_wangni_encode,
    ref_words,
)

import rpsagg
from rpsagg import _fwht, spec
from rpsagg._srht import JointSRHT, srht_encode

pytestmark = pytest.mark.unit

# --------------------------------------------------------------------------------------
# Golden values: docs/wire-vectors.json, the language-neutral file beside the spec (moved
# there from this file; generated once with rpsagg 0.1.0 and checked against the reference
# of conformance/wire_reference.py). Keys: stream key mix64(seed ^ tag). Sign words: words
# 0..3 of the rpsSIGNS stream.
# Cases: sign_bits = sum_j b_j 2^j over the first min(64, d') bits; y = float32 bit
# patterns of the encoding of golden_x(d); induced = the k - k//2 indices of rpsINDCD.
# Round: (client_seed, nonce, client_id, vector_index, derive_round_seed(...)).
# --------------------------------------------------------------------------------------
VECTORS_PATH = ROOT / "docs" / "wire-vectors.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))

# SHIFT (v2) and SIGN2 (v4) are checked by test_dct.py and test_hblocks.py
TAG_NAMES: dict[str, str] = {
    n: t for n, t in VECTORS["tags"].items() if n not in ("SHIFT", "SIGN2")
}
PUBLISHED_SPLITMIX64 = {
    int(state): [int(w, 16) for w in words]
    for state, words in VECTORS["published_splitmix64"].items()
}
GOLDEN_KEYS = {
    int(seed, 16): {n: int(v, 16) for n, v in keys.items() if n not in ("SHIFT", "SIGN2")}
    for seed, keys in VECTORS["keys"].items()
}
GOLDEN_SIGN_WORDS = {
    int(seed, 16): [int(w, 16) for w in words] for seed, words in VECTORS["sign_words"].items()
}
GOLDEN_CASES: list[dict[str, Any]] = [
    dict(c, seed=int(c["seed"], 16), sign_bits=int(c["sign_bits"], 16),
         y=[int(v, 16) for v in c["y"]])
    for c in VECTORS["srht_cases"]
]
GOLDEN_ROUND = [
    (int(r["client_seed"], 16), int(r["nonce"], 16), r["client_id"], r["vector_index"],
     int(r["seed"], 16))
    for r in VECTORS["round"]
]


def library_snapshot() -> dict[str, Any]:
    """Every golden quantity as computed by the library (JSON-able; hex strings for ints)."""
    tags = {name: spec._tag(raw.encode()) for name, raw in TAG_NAMES.items()}
    snap: dict[str, Any] = {"keys": {}, "words": {}, "cases": [], "round": []}
    for seed in GOLDEN_KEYS:
        snap["keys"][hex(seed)] = {n: hex(spec.stream_key(seed, t)) for n, t in tags.items()}
        key = spec.stream_key(seed, spec.TAG_SIGNS)
        snap["words"][hex(seed)] = [hex(int(w)) for w in spec.stream_words(key, 0, 4)]
    for case in GOLDEN_CASES:
        seed, k, d = case["seed"], case["k"], case["d"]
        d_pad = spec.padded_dim(d)
        bits = spec.sign_bits(seed, d_pad)[:64]
        est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d, projection="srht")
        y = est.encode(np.array(golden_x(d)), seed=seed).values
        snap["cases"].append(
            {
                "seed": hex(seed),
                "k": k,
                "d": d,
                "d_pad": d_pad,
                "sign_bits": hex(sum(int(b) << j for j, b in enumerate(bits))),
                "rows": spec.srht_rows(seed, k, d_pad).tolist(),
                "randk": spec.randk_indices(seed, k, d).tolist(),
                "induced": spec.sample_distinct(seed, spec.TAG_INDUCED, k - k // 2, d).tolist(),
                "wangni_u": [float(u).hex() for u in spec.uniforms(seed, spec.TAG_WANGNI, 3)],
                "y": [hex(int(v)) for v in y.view(np.uint32)],
            }
        )
    for cs, nonce, cid, idx, _ in GOLDEN_ROUND:
        snap["round"].append(hex(spec.derive_round_seed(cs, nonce, cid, idx)))
    return snap


def expected_snapshot() -> dict[str, Any]:
    """The hard-coded golden values in the format of :func:`library_snapshot`."""
    return {
        "keys": {hex(s): {n: hex(v) for n, v in keys.items()} for s, keys in GOLDEN_KEYS.items()},
        "words": {hex(s): [hex(w) for w in ws] for s, ws in GOLDEN_SIGN_WORDS.items()},
        "cases": [
            {
                "seed": hex(c["seed"]),
                "k": c["k"],
                "d": c["d"],
                "d_pad": c["d_pad"],
                "sign_bits": hex(c["sign_bits"]),
                "rows": c["rows"],
                "randk": c["randk"],
                "induced": c["induced"],
                "wangni_u": c["wangni_u"],
                "y": [hex(v) for v in c["y"]],
            }
            for c in GOLDEN_CASES
        ],
        "round": [hex(r[4]) for r in GOLDEN_ROUND],
    }


# --------------------------------------------------------------------------------------
# The reference against itself and against published values
# --------------------------------------------------------------------------------------
def test_spec_version() -> None:
    assert rpsagg.SPEC_VERSION == spec.SPEC_VERSION == VECTORS["spec"] == "rpsagg-seed-v5"
    assert spec.SPEC_VERSIONS == (
        "rpsagg-seed-v1", "rpsagg-seed-v2", "rpsagg-seed-v3", "rpsagg-seed-v4", "rpsagg-seed-v5"
    )


def test_reference_matches_published_splitmix64() -> None:
    for state, outputs in PUBLISHED_SPLITMIX64.items():
        assert ref_words(state, len(outputs)) == outputs
        assert [int(w) for w in spec.stream_words(state, 0, len(outputs))] == outputs


def test_tags_are_the_documented_ascii_names() -> None:
    assert spec.TAG_SIGNS == ref_tag("rpsSIGNS") == 0x7270735349474E53
    assert ref_tag("rpsROWS_") == spec.TAG_ROWS
    assert ref_tag("rpsRANDK") == spec.TAG_RANDK
    assert ref_tag("rpsWNGNI") == spec.TAG_WANGNI
    assert ref_tag("rpsINDCD") == spec.TAG_INDUCED
    assert ref_tag("rpsMCBTA") == spec.TAG_MCBETA
    assert ref_tag("rpsROUND") == spec.TAG_ROUND
    assert ref_tag("rpsSHIFT") == spec.TAG_SHIFT
    assert ref_tag("rpsSIGN2") == spec.TAG_SIGN2


# --------------------------------------------------------------------------------------
# Golden values: the reference reproduces them, the library reproduces them
# --------------------------------------------------------------------------------------
def test_reference_reproduces_golden_values() -> None:
    for seed, keys in GOLDEN_KEYS.items():
        for name, value in keys.items():
            assert ref_key(seed, TAG_NAMES[name]) == value, (seed, name)
        assert ref_words(keys["SIGNS"], 4) == GOLDEN_SIGN_WORDS[seed]
    for c in GOLDEN_CASES:
        seed, k, d, d_pad = c["seed"], c["k"], c["d"], c["d_pad"]
        assert d_pad == 1 << (d - 1).bit_length()
        bits = ref_sign_bits(seed, d_pad)[:64]
        assert sum(b << j for j, b in enumerate(bits)) == c["sign_bits"]
        assert ref_sample_distinct(seed, "rpsROWS_", k, d_pad) == c["rows"]
        assert ref_sample_distinct(seed, "rpsRANDK", k, d) == c["randk"]
        assert ref_sample_distinct(seed, "rpsINDCD", k - k // 2, d) == c["induced"]
        assert [u.hex() for u in ref_uniforms(seed, "rpsWNGNI", 3)] == c["wangni_u"]
        assert [f32_bits(v) for v in ref_encode(golden_x(d), seed, k)] == c["y"]
    for cs, nonce, cid, idx, expected in GOLDEN_ROUND:
        assert ref_round_seed(cs, nonce, cid, idx) == expected


def test_library_reproduces_golden_values() -> None:
    assert library_snapshot() == expected_snapshot()


def test_golden_values_structure() -> None:
    # the golden set covers the edge cases it claims to cover
    seeds = {c["seed"] for c in GOLDEN_CASES} | set(GOLDEN_KEYS)
    assert {0, 1, MASK64} <= seeds
    assert any(c["k"] == c["d"] for c in GOLDEN_CASES)
    assert any(c["d"] == 1 for c in GOLDEN_CASES)
    assert any(c["d"] & (c["d"] - 1) for c in GOLDEN_CASES)  # non-power-of-two d
    for c in GOLDEN_CASES:
        assert len(set(c["rows"])) == c["k"] and max(c["rows"]) < c["d_pad"]
        assert len(set(c["randk"])) == c["k"] and max(c["randk"]) < c["d"]
        assert len(c["y"]) == c["k"]


def test_fresh_interpreter_reproduces_golden_values() -> None:
    # One fresh interpreter computes the golden values with the default FWHT backend and
    # again with the numpy butterfly forced.
    env = dict(os.environ)
    env.pop("RPSAGG_FWHT", None)
    code = (
        "import json, sys; sys.path[:0] = sys.argv[1:]; import test_spec, rpsagg; "
        "from rpsagg import _fwht; first = test_spec.library_snapshot(); "
        "_fwht._FAST = None; _fwht._NATIVE = None; "
        "print(json.dumps([rpsagg.FWHT_BACKEND, first, test_spec.library_snapshot()]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(TESTS),
         str(Path(wire_reference.__file__).parent)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    backend, default_snap, numpy_snap = json.loads(proc.stdout)
    assert backend == rpsagg.FWHT_BACKEND
    assert default_snap == expected_snapshot()
    assert numpy_snap == expected_snapshot()


def test_environment_forces_numpy_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RPSAGG_FWHT", "numpy")
    assert _fwht._load_fast() is None
    monkeypatch.setenv("RPSAGG_FWHT", "")
    if _fwht._FAST is not None:
        assert _fwht._load_fast() is not None


# --------------------------------------------------------------------------------------
# Vectorized library == plain-Python reference on random inputs
# --------------------------------------------------------------------------------------
def _random_seeds(count: int, salt: int) -> list[int]:
    rng = np.random.default_rng(salt)
    seeds = [int(v) for v in rng.integers(0, 2**63, size=count, dtype=np.uint64)]
    return [(s << 1) | (i & 1) for i, s in enumerate(seeds)]  # cover the top bit too


def test_stream_words_match_reference() -> None:
    for seed in _random_seeds(50, 1):
        for name in TAG_NAMES.values():
            key = spec.stream_key(seed, ref_tag(name))
            assert key == ref_key(seed, name)
        key = ref_key(seed, "rpsSIGNS")
        words = spec.stream_words(key, 0, 70)
        assert words.dtype == np.uint64
        assert [int(w) for w in words] == ref_words(key, 70)
        # counter mode: any window of the stream
        assert [int(w) for w in spec.stream_words(key, 33, 5)] == ref_words(key, 38)[33:]


def test_sign_bits_match_reference() -> None:
    for seed, d_pad in zip(_random_seeds(20, 2), [1, 2, 4, 64, 128, 256, 1024] * 3, strict=False):
        bits = spec.sign_bits(seed, d_pad)
        assert bits.shape == (d_pad,)
        assert bits.tolist() == ref_sign_bits(seed, d_pad)
        np.testing.assert_array_equal(spec.signs(seed, d_pad), 1.0 - 2.0 * bits)


@pytest.fixture(params=["native", "numpy"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the compiled kernels (rpsagg._fast) and with the numpy code."""
    if request.param == "numpy":
        monkeypatch.setattr(spec, "NATIVE", None)
    elif spec.NATIVE is None:
        pytest.fail("rpsagg._fast is not built (pip install compiles it; needs a C compiler)")
    return str(request.param)


def test_native_kernels_are_built_unless_disabled() -> None:
    # The install compiles rpsagg/_fast.c on this kind of machine; a silent fallback to the
    # numpy code would hide a broken build (RPSAGG_NATIVE=0 disables it on purpose).
    if os.environ.get("RPSAGG_NATIVE") == "0":
        assert spec.NATIVE is None
    else:
        assert spec.NATIVE is not None


def test_sample_distinct_matches_reference(kernels: str) -> None:
    rng = np.random.default_rng(3)
    bounds = [1, 2, 3, 5, 8, 13, 64, 100, 127, 128, 129, 1000, 1024]
    for i, seed in enumerate(_random_seeds(120, 4)):
        bound = bounds[i % len(bounds)]
        k = int(rng.integers(1, bound + 1)) if i % 3 else bound  # k = bound a third of the time
        name, tag = [("rpsROWS_", spec.TAG_ROWS), ("rpsRANDK", spec.TAG_RANDK)][i % 2]
        got = spec.sample_distinct(seed, tag, k, bound)
        assert got.dtype == np.int64
        assert got.tolist() == ref_sample_distinct(seed, name, k, bound), (seed, k, bound)
    # prefix property: the first k' of k draws are the draws for k'
    full = spec.randk_indices(9, 500, 1000)
    np.testing.assert_array_equal(spec.randk_indices(9, 123, 1000), full[:123])


@pytest.mark.parametrize("path", ["scatter", "sort"])
def test_both_first_accepted_paths_match_reference(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spec, "NATIVE", None)  # the numpy paths, not the compiled one
    # sample_distinct picks the scatter path for large draws and the sort path otherwise;
    # force each in turn on draws big enough to hold duplicates and (for bounds that are
    # not powers of two) rejections, and compare with the plain-Python reference.
    from rpsagg import _distinct  # spec.sample_distinct's vectorised core

    if path == "scatter":
        monkeypatch.setattr(_distinct, "_SCATTER_MIN_DRAWN", 0)
    else:
        monkeypatch.setattr(_distinct, "_SCATTER_MAX_BOUND", 0)
    cases = [(5000, 1 << 14), (3000, 5000), (4097, 4097), (1, 1), (7, 9), (20000, 1 << 16)]
    for i, (k, bound) in enumerate(cases):
        seed = _random_seeds(len(cases), 11)[i]
        got = spec.sample_distinct(seed, spec.TAG_ROWS, k, bound)
        assert got.dtype == np.int64
        assert got.tolist() == ref_sample_distinct(seed, "rpsROWS_", k, bound), (k, bound)


def test_native_sampler_equals_numpy_at_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    if spec.NATIVE is None:
        pytest.skip("rpsagg._fast not built (test_native_kernels_are_built_unless_disabled)")
    cases = [(1 << 15, 1 << 20), (1 << 12, 1 << 12), (50_000, 1_000_003), (3, (1 << 28) - 5)]
    for i, (k, bound) in enumerate(cases):
        seed = _random_seeds(len(cases), 14)[i]
        native = spec.sample_distinct(seed, spec.TAG_RANDK, k, bound)
        with monkeypatch.context() as m:
            m.setattr(spec, "NATIVE", None)
            numpy_rows = spec.sample_distinct(seed, spec.TAG_RANDK, k, bound)
        assert native.dtype == np.int64 and native.tolist() == numpy_rows.tolist(), (k, bound)


def test_first_accepted_paths_agree_on_duplicates() -> None:
    # Many duplicates and rejections (values drawn from [0, 300) with bound 200), including
    # repeated values at the first and last positions.
    rng = np.random.default_rng(12)
    drawn = rng.integers(0, 300, size=5000).astype(np.uint64)
    drawn[-1] = drawn[0]
    scatter = spec._first_accepted_scatter(drawn, 200)
    sort = spec._first_accepted_sort(drawn, 200, 9)
    seen: set[int] = set()
    expected = []
    for pos, value in enumerate(drawn.tolist()):
        if value < 200 and value not in seen:
            seen.add(value)
            expected.append(pos)
    assert scatter.tolist() == expected
    assert sort.tolist() == expected


@pytest.mark.parametrize("native", [True, False])
def test_sign_factors_equal_one_minus_twice_the_bits(native: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if native and spec.NATIVE is None:
        pytest.skip("compiled kernels not built (a test in test_spec fails for that)")
    if not native:
        monkeypatch.setattr(spec, "NATIVE", None)
    buf = np.empty(2048, dtype=np.int8)
    idx = np.empty(256, dtype=np.intp)
    for seed, d_pad in zip(_random_seeds(8, 13), [1, 2, 7, 8, 64, 100, 1024, 2048], strict=True):
        expected = 1 - 2 * np.array(ref_sign_bits(seed, d_pad), dtype=np.int8)
        fresh = spec.sign_factors(seed, d_pad)
        reused = spec.sign_factors(seed, d_pad, out=buf, index_buffer=idx)
        assert fresh.dtype == np.int8 and fresh.tolist() == expected.tolist()
        assert reused.tolist() == expected.tolist()
    with pytest.raises(ValueError, match="int8"):
        spec.sign_factors(1, 64, out=np.empty(64, dtype=np.float64))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="int8"):
        spec.sign_factors(1, 64, out=np.empty(8, dtype=np.int8))


@pytest.mark.parametrize("native", [True, False])
def test_write_sign_factors_matches_the_reference(native: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the compiled loop (whole words by a byte table, then the last bits one at a time) and
    # the numpy one write the reference's factors, on either stream, for every length
    if native and spec.NATIVE is None:
        pytest.skip("compiled kernels not built (a test in test_spec fails for that)")
    if not native:
        monkeypatch.setattr(spec, "NATIVE", None)
    for seed, d in zip(_random_seeds(9, 17), [1, 7, 63, 64, 65, 127, 1000, 4096, 70_001],
                       strict=True):
        for tag, name in ((spec.TAG_SIGNS, "rpsSIGNS"), (spec.TAG_SIGN2, "rpsSIGN2")):
            out = np.full(d, 5, dtype=np.int8)
            spec.write_sign_factors(seed, out, tag)
            bits = ref_sign_bits(seed, d) if name == "rpsSIGNS" else None
            want = spec.sign_factors(seed, d, tag=tag)
            assert out.tolist() == want.tolist()
            if bits is not None:
                assert out.tolist() == [1 - 2 * b for b in bits]
    with pytest.raises(ValueError, match="int8"):
        spec.write_sign_factors(1, np.empty(8))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="int8"):
        spec.write_sign_factors(1, np.empty((2, 8), dtype=np.int8))


def test_uniforms_match_reference() -> None:
    for seed in _random_seeds(10, 5):
        u = spec.uniforms(seed, spec.TAG_WANGNI, 40)
        assert u.tolist() == ref_uniforms(seed, "rpsWNGNI", 40)
        assert np.all((u >= 0.0) & (u < 1.0))


def test_derive_round_seed_matches_reference() -> None:
    rng = np.random.default_rng(6)
    for seed in _random_seeds(20, 7):
        nonce = int(rng.integers(0, 2**63)) * 2 + 1
        idx = int(rng.integers(0, 100))
        cid = f"client-{idx}-ü"
        assert spec.derive_round_seed(seed, nonce, cid, idx) == ref_round_seed(
            seed, nonce, cid, idx
        )
    assert spec.derive_round_seed(1, 2, "c") == spec.derive_round_seed(1, 2, "c", 0)
    assert spec.derive_round_seed(1, 2, "c", 0) != spec.derive_round_seed(1, 2, "c", 1)
    assert spec.derive_round_seed(1, 2, "c") != spec.derive_round_seed(1, 2, "d")
    assert spec.derive_round_seed(1, 2, "c") != spec.derive_round_seed(1, 3, "c")


@pytest.fixture(params=["one-fwht", "two-halves"])
def encode_path(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, kernels: str
) -> str:
    """Run a test with each of srht_encode's paths: whole FWHT or halves on two cores, each
    with the compiled kernels and with numpy (the ``kernels`` fixture)."""
    import rpsagg._srht as srht_module

    if request.param == "two-halves":
        monkeypatch.setattr(srht_module, "_SPLIT_MIN", 2)
        monkeypatch.setattr(srht_module, "_CORES", 2)
    else:
        monkeypatch.setattr(srht_module, "_SPLIT_MIN", 1 << 62)
    return f"{request.param}-{kernels}"


@pytest.mark.parametrize("d", [1, 2, 3, 7, 64, 100, 128, 300])
def test_encode_matches_reference_exactly_on_integer_input(d: int, encode_path: str) -> None:
    x = golden_x(d)
    for seed in _random_seeds(3, 100 + d):
        k = max(1, min(d, 9))
        est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d, projection="srht")
        msg = est.encode(np.array(x), seed=seed)
        ref = ref_encode(x, seed, k)
        assert msg.values.dtype == np.float32
        assert msg.values.view(np.uint32).tolist() == [f32_bits(v) for v in ref]
        padded = np.zeros(est.d_pad)  # type: ignore[attr-defined]
        padded[:d] = x
        assert srht_encode(padded, seed, k).tolist() == ref  # float64, bit for bit


def test_encode_matches_reference_on_float_input(encode_path: str) -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal(200)
    ref = ref_encode(x.tolist(), 77, 20)  # float sums in a different order: not bit-exact
    padded = np.zeros(256)
    padded[:200] = x
    np.testing.assert_allclose(srht_encode(padded, 77, 20), ref, rtol=1e-12, atol=1e-12)


def test_both_encode_paths_agree_at_full_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # d' = 2^18 takes the two-halves path by default on a multi-core machine; compare it
    # with one whole-vector FWHT: bit for bit on integers (every sum exact), 1e-12 on floats.
    import rpsagg._srht as srht_module

    # The compiled kernels give the numpy code's bits on both paths.
    d = 1 << 18
    rng = np.random.default_rng(21)
    native = spec.NATIVE
    for x in (rng.integers(-50, 50, d).astype(np.float64), rng.standard_normal(d)):
        monkeypatch.setattr(srht_module, "_SPLIT_MIN", 2)
        monkeypatch.setattr(srht_module, "_CORES", 2)
        halves = srht_encode(x, 31, d // 32)
        monkeypatch.setattr(spec, "NATIVE", None)
        assert srht_encode(x, 31, d // 32).tolist() == halves.tolist()
        monkeypatch.setattr(srht_module, "_SPLIT_MIN", 1 << 62)
        whole = srht_encode(x, 31, d // 32)
        monkeypatch.setattr(spec, "NATIVE", native)
        assert srht_encode(x, 31, d // 32).tolist() == whole.tolist()
        if np.all(x == np.round(x)):
            assert halves.tolist() == whole.tolist()
        else:
            np.testing.assert_allclose(halves, whole, rtol=1e-12, atol=1e-12 * np.abs(whole).max())
    # a strided (non-contiguous) x is accepted, as on the numpy path
    wide = np.zeros((2 * d,))
    wide[::2] = rng.standard_normal(d)
    assert srht_encode(wide[::2], 5, 64).tolist() == srht_encode(wide[::2].copy(), 5, 64).tolist()


# --------------------------------------------------------------------------------------
# srht_matrix and the joint operator
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seed", "k", "d"), [(0, 4, 100), (MASK64, 12, 12), (5, 1, 1), (9, 30, 64)]
)
def test_srht_matrix_rows_are_orthonormal(seed: int, k: int, d: int) -> None:
    g = rpsagg.srht_matrix(seed, k, d)
    d_pad = spec.padded_dim(d)
    assert g.shape == (k, d_pad)
    np.testing.assert_allclose(g @ g.T, np.eye(k), atol=1e-12)
    np.testing.assert_allclose(np.abs(g), 1.0 / math.sqrt(d_pad))


@pytest.mark.parametrize(
    ("seed", "k", "d"), [(0, 4, 100), (MASK64, 12, 12), (5, 1, 1), (9, 30, 64)]
)
def test_srht_matrix_agrees_with_encoding(seed: int, k: int, d: int) -> None:
    g = rpsagg.srht_matrix(seed, k, d)
    rng = np.random.default_rng(seed % 1000)
    x = np.zeros(g.shape[1])
    x[:d] = rng.standard_normal(d)
    np.testing.assert_allclose(g @ x, srht_encode(x, seed, k), rtol=1e-12, atol=1e-13)
    est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d, projection="srht")
    y32 = est.encode(x[:d], seed=seed).values
    np.testing.assert_allclose(y32, g @ x, rtol=1e-6, atol=1e-6)


def test_same_seed_same_transform_different_seed_different() -> None:
    g1 = rpsagg.srht_matrix(123, 8, 100)
    g2 = rpsagg.srht_matrix(123, 8, 100)
    g3 = rpsagg.srht_matrix(124, 8, 100)
    np.testing.assert_array_equal(g1, g2)
    assert not np.allclose(g1, g3)
    assert not np.array_equal(spec.signs(123, 128), spec.signs(124, 128))
    assert not np.array_equal(spec.srht_rows(123, 8, 128), spec.srht_rows(124, 8, 128))
    # numpy integer seeds are the same seeds
    np.testing.assert_array_equal(
        rpsagg.srht_matrix(np.uint64(MASK64), 3, 10),  # type: ignore[arg-type]
        rpsagg.srht_matrix(MASK64, 3, 10),
    )


def test_joint_operator_matches_dense_matrices() -> None:
    seeds, k, d = [3, 1, 4, 15], 6, 50
    gs = np.vstack([rpsagg.srht_matrix(s, k, d) for s in seeds])  # A, (nk, d')
    op = JointSRHT.from_seeds(seeds, k, 64)
    rng = np.random.default_rng(0)
    u = rng.standard_normal(64)
    z = rng.standard_normal((len(seeds), k))
    np.testing.assert_allclose(op.forward(u).reshape(-1), gs @ u, atol=1e-12)
    np.testing.assert_allclose(op.adjoint(z), gs.T @ z.reshape(-1), atol=1e-12)
    np.testing.assert_allclose(op.gram(), gs @ gs.T, atol=1e-12)


# --------------------------------------------------------------------------------------
# FWHT backends against the dense Sylvester-Hadamard matrix
# --------------------------------------------------------------------------------------
def dense_hadamard_apply(a: np.ndarray) -> np.ndarray:
    """``a @ H`` with ``H[r, j] = (-1)^popcount(r & j)`` built in column blocks."""
    n = a.shape[-1]
    rows = np.arange(n, dtype=np.int64)
    out = np.empty(a.shape)
    for lo in range(0, n, 512):
        cols = np.arange(lo, min(n, lo + 512), dtype=np.int64)
        parity = np.bitwise_count(rows[:, None] & cols[None, :]) & 1
        out[..., lo : lo + cols.size] = a @ (1.0 - 2.0 * parity)
    return out


@pytest.mark.parametrize("log_n", range(13))
def test_fwht_backends_agree_with_dense_hadamard(log_n: int) -> None:
    n = 1 << log_n
    rng = np.random.default_rng(log_n)
    ints = rng.integers(-8, 9, size=(3, n)).astype(np.float64)  # exact in any order
    floats = rng.standard_normal((3, n))
    backends: list[tuple[str, Callable[[np.ndarray], np.ndarray]]] = [("numpy", _fwht.fwht_numpy)]
    if _fwht._FAST is not None:
        backends.append(("fht-cpu", _fwht._FAST))
    elif os.environ.get("RPSAGG_FWHT", "").lower() != "numpy":
        pytest.importorskip("fht_cpu")
    native = spec.NATIVE
    if native is not None:  # the compiled kernel: numpy's butterflies, so the same bits
        def fwht_native(a: np.ndarray) -> np.ndarray:
            native.fwht_rows(a.reshape(-1), a.shape[-1])
            return a

        backends.append(("native", fwht_native))
        b = floats.copy()
        np.testing.assert_array_equal(fwht_native(b), _fwht.fwht_numpy(floats.copy()))
    dense = dense_hadamard_apply(np.vstack([ints, floats]))  # one pass over H for both
    for a, ref2 in ((ints, dense[:3]), (floats, dense[3:])):
        ref1 = ref2[0]  # the 1-D input is the first row
        for name, fn in backends:
            got2 = fn(a.copy())
            got1 = fn(a[0].copy())
            if a is ints:
                np.testing.assert_array_equal(got2, ref2, err_msg=name)
                np.testing.assert_array_equal(got1, ref1, err_msg=name)
            else:
                tol = 1e-12 * math.sqrt(n) * (log_n + 1)
                np.testing.assert_allclose(got2, ref2, rtol=0, atol=tol, err_msg=name)
                np.testing.assert_allclose(got1, ref1, rtol=0, atol=tol, err_msg=name)
        # the public entry point: a copy by default, in place on request
        before = a.copy()
        out = rpsagg.fwht(a)
        np.testing.assert_array_equal(a, before)
        np.testing.assert_allclose(out, ref2, rtol=0, atol=1e-12 * n)
        inplace = a.copy()
        assert rpsagg.fwht(inplace, inplace=True) is inplace
        # a small batch on two threads on request (hblocks' encode): the same values
        forced = rpsagg.fwht(a, threads=2, min_parallel=0)
        np.testing.assert_allclose(forced, ref2, rtol=0, atol=1e-12 * n)


@pytest.mark.parametrize("log_n", [11, 12, 13, 14, 15, 16, 17, 20, 23])
def test_native_fwht_equals_numpy_on_large_rows(log_n: int) -> None:
    # Every regime of fwht_rows: one L1 block (<= 2^11), then the stages across blocks,
    # fused by three, two or one (2^(log_n - 11) = 2, 4, 8, 16 = 4 x 4, 32 = 8 x 4, 64,
    # 512, 4096 blocks); each must give numpy's bits exactly.
    native = spec.NATIVE
    if native is None:
        pytest.skip("compiled kernels not built (a test in test_spec fails for that)")
    n = 1 << log_n
    a = np.random.default_rng(log_n).standard_normal((2 if log_n < 20 else 1, n))
    got = a.copy()
    native.fwht_rows(got.reshape(-1), n)
    np.testing.assert_array_equal(got, _fwht.fwht_numpy(a))
    with pytest.raises(ValueError, match="power of two"):
        native.fwht_rows(np.ones(12), 12)
    with pytest.raises(ValueError, match="power of two"):
        native.fwht_rows(np.ones(12), 8)


def test_fwht_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="power of two"):
        rpsagg.fwht(np.ones(6))
    with pytest.raises(ValueError, match="power of two"):
        _fwht.fwht_numpy(np.ones((2, 12)))
    with pytest.raises(ValueError, match="C-contiguous float64"):
        rpsagg.fwht(np.ones(8, dtype=np.float32), inplace=True)
    with pytest.raises(ValueError, match="C-contiguous float64"):
        rpsagg.fwht(np.ones((8, 8))[:, ::2], inplace=True)


# --------------------------------------------------------------------------------------
# Bad inputs raise ValueError naming the constraint
# --------------------------------------------------------------------------------------
BAD_SEEDS = [-1, 2**64, True, 1.0, "1", None]


@pytest.mark.parametrize("seed", BAD_SEEDS)
def test_bad_seeds_rejected_everywhere(seed: Any) -> None:
    calls = [
        lambda: spec.check_seed(seed),
        lambda: spec.stream_key(seed, spec.TAG_SIGNS),
        lambda: spec.sign_bits(seed, 8),
        lambda: spec.signs(seed, 8),
        lambda: spec.srht_rows(seed, 2, 8),
        lambda: spec.randk_indices(seed, 2, 8),
        lambda: spec.uniforms(seed, spec.TAG_WANGNI, 3),
        lambda: spec.derive_round_seed(seed, 0, "a"),
        lambda: rpsagg.srht_matrix(seed, 2, 8),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"seed must be (an integer )?in \[0, 2\^64\)"):
            call()
    # the other 64-bit arguments of derive_round_seed are named in their messages
    with pytest.raises(ValueError, match=r"nonce must be (an integer )?in \[0, 2\^64\)"):
        spec.derive_round_seed(0, seed, "a")
    with pytest.raises(ValueError, match=r"vector_index must be (an integer )?in \[0, 2\^64\)"):
        spec.derive_round_seed(0, 0, "a", seed)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((0, 5, 4), r"k must be in \[1, d\]"),
        ((0, 0, 4), r"k must be in \[1, d\]"),
        ((0, -1, 4), r"k must be in \[1, d\]"),
        ((0, 1, 0), r"d must be >= 1"),
        ((0, 1, -3), r"d must be >= 1"),
    ],
)
def test_srht_matrix_rejects_bad_dims(args: tuple[int, int, int], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        rpsagg.srht_matrix(*args)


def test_spec_rejects_bad_dims() -> None:
    with pytest.raises(ValueError, match=r"k must be in \[1, bound\]"):
        spec.srht_rows(0, 9, 8)
    with pytest.raises(ValueError, match=r"k must be in \[1, bound\]"):
        spec.randk_indices(0, 0, 5)
    with pytest.raises(ValueError, match=r"k must be in \[1, bound\]"):
        spec.randk_indices(0, 6, 5)
    with pytest.raises(ValueError, match=r"bound must be >= 1"):
        spec.randk_indices(0, 1, 0)
    with pytest.raises(ValueError, match=r"d_pad must be >= 1"):
        spec.sign_bits(0, 0)
    for bad in (0, -4, True, 2.0):
        with pytest.raises(ValueError, match=r"d must be an integer >= 1"):
            spec.padded_dim(bad)  # type: ignore[arg-type]
    assert [spec.padded_dim(d) for d in (1, 2, 3, 4, 5, 100, 1024, 1025)] == [
        1,
        2,
        4,
        4,
        8,
        128,
        1024,
        2048,
    ]


def test_worked_example_of_the_document() -> None:
    # docs/wire-format.md, section 9: seed 1, d = 5 (d' = 8), k = 3, x = [1, 2, 3, 4, 5]
    assert spec.stream_key(1, spec.TAG_SIGNS) == 0x46CD1D801095F9F8
    assert spec.sign_bits(1, 8).tolist() == [0, 1, 1, 0, 0, 1, 0, 0]
    assert spec.srht_rows(1, 3, 8).tolist() == [5, 7, 1]
    assert spec.randk_indices(1, 3, 5).tolist() == [3, 0, 2]
    assert spec.sample_distinct(1, spec.TAG_INDUCED, 2, 5).tolist() == [1, 2]
    assert spec.uniforms(1, spec.TAG_WANGNI, 1)[0] == 0.5218696010989519
    est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=3, d=5, projection="srht")
    y = est.encode([1.0, 2.0, 3.0, 4.0, 5.0], seed=1).values
    assert y.view(np.uint32).tolist() == [0xC04BA592, 0x3FE24630, 0x3EB504F3]
    assert spec.client_id_word("client-0") == 0x16C2885525297D11
    assert spec.derive_round_seed(1, 2, "client-0", 0) == 0xDDFC6760C0D058EA
    assert spec.derive_round_seed(1, 2, "client-0", 1) == 0xC5E9BBF600EA0398


# -- Rand-k-Wangni and Induced (sections 5 and 6), from the document in plain Python --------
@pytest.mark.parametrize("group", ["wangni_cases", "induced_cases"])
def test_sparse_vectors_follow_the_document(group: str, kernels: str) -> None:
    scheme = "rand-k-wangni" if group == "wangni_cases" else "induced"
    ref = ref_wangni_encode if scheme == "rand-k-wangni" else ref_induced_encode
    for c in VECTORS[group]:
        seed, k, d = int(c["seed"], 16), c["k"], c["d"]
        x = named_x(c["x"], d)
        indices, bits = ref(x, seed, k)
        assert indices == c["indices"] and bits == [int(b, 16) for b in c["values_f32"]]
        msg = rpsagg.make_estimator(scheme, n=2, k=k, d=d).encode(np.array(x), seed)
        assert msg.indices is not None and msg.indices.tolist() == indices
        assert msg.values.view(np.uint32).tolist() == bits
        if scheme == "rand-k-wangni":
            c_ref = ref_wangni_c(x, k)
            assert c["c"] == (None if c_ref is None else c_ref.hex())


def test_wangni_and_induced_agree_with_the_document_on_random_inputs(kernels: str) -> None:
    rng = np.random.default_rng(20)
    for trial in range(40):
        d = int(rng.integers(1, 300))
        k = int(rng.integers(1, d + 1))
        x = rng.standard_normal(d) * np.exp(3 * rng.standard_normal(d))
        x[rng.random(d) < 0.2] = 0.0
        x[rng.random(d) < 0.1] = 1.5  # ties in |x|
        seed = int(rng.integers(0, 2**63)) * 2 + trial % 2
        for scheme, ref in (("rand-k-wangni", ref_wangni_encode),
                            ("induced", ref_induced_encode)):
            indices, bits = ref(x.tolist(), seed, k)
            msg = rpsagg.make_estimator(scheme, n=2, k=k, d=d).encode(x, seed)
            assert msg.indices is not None and msg.indices.tolist() == indices, (scheme, d, k)
            assert msg.values.view(np.uint32).tolist() == bits, (scheme, d, k)


def test_wangni_refuses_magnitudes_whose_sum_overflows() -> None:
    est = rpsagg.make_estimator("rand-k-wangni", n=2, k=1, d=3)
    with pytest.raises(ValueError, match="sum of its magnitudes overflows float64"):
        est.encode(np.array([1e308, 1e308, 1e308]), 1)
    # at most k non-zero coordinates: nothing is summed, every one is sent as it is
    msg = rpsagg.make_estimator("rand-k-wangni", n=2, k=2, d=3).encode(
        np.array([3e38, 0.0, -3e38]), 1)
    assert msg.indices is not None and msg.indices.tolist() == [0, 2]
