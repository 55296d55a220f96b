"""Two overlapping Hadamard blocks (projection ``"hblocks"``, wire format ``rpsagg-seed-v4``).

Pinned as the DCT in ``test_dct.py``: a plain-Python reference of ``docs/wire-format.md``
section 14 (integer arithmetic up to the last scaling), the golden vectors of
``docs/wire-vectors.json``, and the dense matrix against the matrix-free operators. Then the
statistics that make it the default for d not a power of two (d = 300, the issue's targets).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from anyd_util import check_joint_operator
from test_spec import VECTORS
from wire_reference import (
    f32_bits,
    golden_x,
    ref_hblocks_encode,
    ref_key,
    ref_sign_bits,
)

import rpsagg
from rpsagg import _hblocks, spec
from rpsagg._decode import joint_solve
from rpsagg._hblocks import JointHBlocks, hblocks_encode, hblocks_matrix
from rpsagg._projection import resolve_projection

pytestmark = pytest.mark.unit

CASES: list[dict[str, Any]] = VECTORS["hblocks_cases"]


# --------------------------------------------------------------------------------------
# Golden vectors (docs/wire-vectors.json) and the reference
# --------------------------------------------------------------------------------------
def test_sign2_stream_keys_match_the_vectors() -> None:
    assert spec.TAG_SIGN2 == int.from_bytes(b"rpsSIGN2", "big") == 0x7270735349474E32
    for seed, keys in VECTORS["keys"].items():
        assert ref_key(int(seed, 16), "rpsSIGN2") == int(keys["SIGN2"], 16)
        assert spec.stream_key(int(seed, 16), spec.TAG_SIGN2) == int(keys["SIGN2"], 16)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d={c['d']}")
def test_golden_hblocks_vectors(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    seed, k, d = int(case["seed"], 16), int(case["k"]), int(case["d"])
    x = [int(v) for v in golden_x(d)]
    tol = float(VECTORS["hblocks_abs_tolerance"]) * max(1.0, math.sqrt(sum(v * v for v in x)))
    ref = ref_hblocks_encode(x, seed, k)
    # the reference reproduces the file's integers and values
    assert ref["b"] == case["b"] == _hblocks.block_split(d)[0]
    assert ref["shift"] == case["shift"] == spec.dct_shift(seed, d)
    assert ref["rows"] == case["rows"] == spec.sample_distinct(seed, spec.TAG_ROWS, k, d).tolist()
    bits = ref_sign_bits(seed, d)[:64]
    assert hex(sum(b << j for j, b in enumerate(bits))) == case["sign_bits"]
    bits2 = ref["sign2_bits"][:64]
    assert hex(sum(b << j for j, b in enumerate(bits2))) == case["sign2_bits"]
    expected = [float(v) for v in case["y_f64"]]
    assert np.allclose(ref["y"], expected, rtol=0, atol=1e-12)
    assert [hex(f32_bits(v)) for v in expected] == case["y_f32"]
    # the library on every path (the old one-call kernel, the fused pipeline on two threads
    # and on one, the compiled passes around the FWHT backend, numpy), each within the
    # stated tolerance of the reference
    for path in PATHS:
        if not _force_path(monkeypatch, path):
            continue
        est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d, projection="hblocks")
        msg = est.encode(np.array(x, dtype=np.float64), seed=seed)
        assert msg.scheme == "rand-proj-spatial:hblocks"
        assert msg.spec_version == rpsagg.SPEC_VERSION == "rpsagg-seed-v5"
        assert np.max(np.abs(msg.values.astype(np.float64) - expected)) <= tol
        if case["b"].bit_length() % 2 == 1:  # b = 4^j: every operation exact, bits equal
            assert [hex(int(v)) for v in msg.values.view(np.uint32)] == case["y_f32"]
        np.testing.assert_allclose(hblocks_encode(np.array(x, float), seed, k), ref["y"],
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["fht-cpu", "native", "numpy"])
def test_golden_vectors_with_each_fwht_backend(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the compiled passes' path the two FWHTs go through rpsagg._fwht: each backend
    # reproduces the golden values (bit for bit where b is a power of 4, every operation
    # then being exact)
    from rpsagg import _fwht

    if backend == "fht-cpu" and _fwht._FAST is None:
        pytest.skip("fht-cpu is not installed")
    if backend == "native" and _fwht._NATIVE is None:
        pytest.skip("the compiled kernels are not built")
    if backend != "fht-cpu":
        monkeypatch.setattr(_fwht, "_FAST", None)
    if backend == "numpy":
        monkeypatch.setattr(_fwht, "_NATIVE", None)
    # (without the compiled kernels the numpy path wraps the backend too)
    assert _force_path(monkeypatch, "passes") or _force_path(monkeypatch, "numpy")
    for case in CASES:
        seed, k, d = int(case["seed"], 16), int(case["k"]), int(case["d"])
        x = np.array(golden_x(d))
        y = hblocks_encode(x, seed, k)
        np.testing.assert_allclose(y, [float(v) for v in case["y_f64"]], rtol=0, atol=1e-12)
        if case["b"].bit_length() % 2 == 1:
            bits = [hex(int(v)) for v in y.astype(np.float32).view(np.uint32)]
            assert bits == case["y_f32"]


def test_library_matches_reference_on_every_split() -> None:
    # d from 1 up to just below and above powers of two: overlap b - e from b down to 1
    rng = np.random.default_rng(5)
    for d in (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 100, 127, 129, 300, 1023, 1025, 3000):
        x = [int(v) for v in rng.integers(-5, 6, size=d)]
        for seed in (0, int(rng.integers(0, 2**63)), 2**64 - 1):
            k = min(d, 11)
            ref = ref_hblocks_encode(x, seed, k)
            got = hblocks_encode(np.array(x, dtype=np.float64), seed, k)
            np.testing.assert_allclose(got, ref["y"], rtol=0, atol=1e-12 * max(1, d))


def test_a_compiled_module_without_the_kernels_falls_back_to_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an rpsagg._fast built before the hblocks kernels (a stale build in a checkout) has
    # sign_multiply and sample_distinct but no hb_*: the encode takes the numpy path
    if spec.NATIVE is None:
        pytest.skip("the compiled kernels are not built")

    class Stale:
        sign_multiply = staticmethod(spec.NATIVE.sign_multiply)
        sample_distinct = staticmethod(spec.NATIVE.sample_distinct)

    x = np.random.default_rng(4).standard_normal(5000)
    want = hblocks_encode(x, 8, 50)
    monkeypatch.setattr(spec, "NATIVE", Stale())
    np.testing.assert_allclose(hblocks_encode(x, 8, 50), want, rtol=0, atol=1e-12)


# The encode's paths: "one-call" (hb_encode, small b), "pipe-2" and "pipe-1" (hb_pipe on two
# threads and on one), "passes" (hb_first / hb_middle / hb_gather around rpsagg._fwht),
# "numpy" (no compiled module)
PATHS = ("one-call", "pipe-2", "pipe-1", "passes", "numpy")


def _force_path(monkeypatch: pytest.MonkeyPatch, path: str) -> bool:
    """Make the encode take ``path`` whatever this machine has and whatever d is; False
    (and nothing changed) for a compiled path without the compiled kernels."""
    huge = 1 << 62
    if path != "numpy" and spec.NATIVE is None:
        return False
    if path == "numpy":
        monkeypatch.setattr(spec, "NATIVE", None)
    monkeypatch.setattr(_hblocks, "_CORES", 2)
    monkeypatch.setattr(_hblocks, "_PIPE_MIN", huge if path == "one-call" else 8)
    monkeypatch.setattr(_hblocks, "_TWO_THREADS_MIN", 8 if path == "pipe-2" else huge)
    monkeypatch.setattr(_hblocks, "_FHT_ONE_THREAD_MIN", 8 if path == "passes" else huge)
    monkeypatch.setattr(_hblocks, "BATCH_THREADS", path == "passes")
    return True


@pytest.mark.parametrize("d", [2**17 + 5, 200_003, 300_001, 2**19 - 1, 2**19 + 2**18 + 3,
                               2**19 + 2**18 + 64, 2**19 + 2**18 - 65, 10**6, 20_001, 4099])
def test_every_encode_path_agrees(d: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the fused pipeline on two threads (the halves of each FWHT on the caller and the helper
    # thread) gives the bits of the pipeline on one thread and of the one-call kernel (the
    # same butterflies in the same order); the passes around the FWHT backend and numpy
    # agree to rounding (the backend may order its sums otherwise)
    if spec.NATIVE is None:
        pytest.skip("the compiled kernels are not built")
    x = np.random.default_rng(d).standard_normal(d)
    k = d // 100
    got = {}
    for path in PATHS:
        with monkeypatch.context() as m:
            _force_path(m, path)
            got[path] = hblocks_encode(x, 5, k)
    assert np.array_equal(got["pipe-2"], got["pipe-1"])
    assert np.array_equal(got["pipe-2"], got["one-call"])
    for path in ("passes", "numpy"):
        np.testing.assert_allclose(got[path], got["pipe-2"], rtol=0, atol=1e-11)
    assert np.array_equal(hblocks_encode(x, 5, k, threads=1), got["passes"])  # the default here
    assert np.array_equal(hblocks_encode(x, 5, k), got["pipe-2"])


def test_threads_argument() -> None:
    x = np.random.default_rng(2).standard_normal(70_001)
    with pytest.raises(ValueError, match="threads"):
        hblocks_encode(x, 1, 700, threads=0)
    np.testing.assert_allclose(hblocks_encode(x, 1, 700, threads=2),
                               hblocks_encode(x, 1, 700, threads=1), rtol=0, atol=1e-11)


def test_two_thread_encodes_from_many_threads_at_once() -> None:
    # one caller at a time owns the helper thread; the others run their encodes alone: every
    # result is the same bits as the encode alone, whoever ran which half
    if spec.NATIVE is None:
        pytest.skip("the compiled kernels are not built")
    import concurrent.futures

    d, k = 70_001, 700
    xs = np.random.default_rng(3).standard_normal((8, d))
    want = [hblocks_encode(x, 10 + i, k, threads=2) for i, x in enumerate(xs)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            got = list(pool.map(lambda i: hblocks_encode(xs[i], 10 + i, k, threads=2), range(8)))
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(g, w)


def test_two_thread_encode_in_a_forked_child() -> None:
    # the helper thread does not survive fork(): a child starts its own (a child that waited
    # for the parent's helper would hang; the join is bounded)
    if spec.NATIVE is None:
        pytest.skip("the compiled kernels are not built")
    import multiprocessing

    d, k = 70_001, 700
    x = np.random.default_rng(4).standard_normal(d)
    want = hblocks_encode(x, 3, k, threads=2)  # the parent's helper exists now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_encode_into, args=(queue, x, 3, k))
    child.start()
    try:
        got = queue.get(timeout=60)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert np.array_equal(got, want)


def _encode_into(queue: Any, x: np.ndarray, seed: int, k: int) -> None:
    queue.put(hblocks_encode(x, seed, k, threads=2))


def test_pipeline_kernel_refuses_bad_arguments() -> None:
    if spec.NATIVE is None:
        pytest.skip("the compiled kernels are not built")
    native = spec.NATIVE
    d, b, k = 100, 64, 3
    x, rows = np.zeros(d), np.array([0, 50, 99], dtype=np.int64)
    native.hb_pipe(x, 1, rows, np.empty(2 * b), np.empty(k), 2)  # well-formed
    bad = [
        (x, np.array([0, 50, 100], dtype=np.int64), np.empty(2 * b), np.empty(k)),  # row >= d
        (x, np.array([0, -1, 5], dtype=np.int64), np.empty(2 * b), np.empty(k)),  # row < 0
        (x, rows, np.empty(2 * b), np.empty(k + 1)),  # rows and out differ
        (x, rows, np.empty(2 * b - 1), np.empty(k)),  # work too short
        (np.zeros(7), np.array([0], dtype=np.int64), np.empty(8), np.empty(1)),  # b < 8
    ]
    for args in bad:
        with pytest.raises(ValueError, match="hb_pipe"):
            native.hb_pipe(args[0], 1, args[1], args[2], args[3], 2)
    work = np.zeros(2 * b + d)
    with pytest.raises(ValueError, match="overlap"):  # x inside the work buffer
        native.hb_pipe(work[b:b + d], 1, rows, work[:2 * b], np.empty(k), 1)
    with pytest.raises(ValueError, match="overlap"):  # out inside the work buffer
        native.hb_pipe(x, 1, rows, work[:2 * b], work[:k], 1)


def test_compiled_and_numpy_paths_agree_at_large_d(monkeypatch: pytest.MonkeyPatch) -> None:
    # above _ONE_CALL_MAX the compiled passes wrap the FWHT backend; the numpy path must
    # give the same numbers (same operations; the FWHT backend may order sums differently)
    x = np.random.default_rng(1).standard_normal(70_001)
    fast = hblocks_encode(x, 99, 700)
    monkeypatch.setattr(spec, "NATIVE", None)
    slow = hblocks_encode(x, 99, 700)
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-11)


# --------------------------------------------------------------------------------------
# The dense matrix and the matrix-free operators
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("seed", "k", "d"), [(0, 4, 100), (2**64 - 1, 12, 12), (5, 1, 1),
                                              (9, 30, 300), (3, 7, 97), (4, 5, 129)])
def test_matrix_is_orthogonal_and_matches_the_encoding(seed: int, k: int, d: int) -> None:
    full = hblocks_matrix(seed, d, d)  # every row: G^T G = I (B P D is orthogonal)
    np.testing.assert_allclose(full.T @ full, np.eye(d), atol=1e-12)
    g = hblocks_matrix(seed, k, d)
    np.testing.assert_allclose(g @ g.T, np.eye(k), atol=1e-12)
    x = np.random.default_rng(seed % 1000).standard_normal(d)
    np.testing.assert_allclose(hblocks_encode(x, seed, k), g @ x, rtol=0, atol=1e-12)


def test_joint_operator_matches_dense_matrices() -> None:
    op, a, y = check_joint_operator(JointHBlocks.from_seeds, hblocks_matrix)
    # max (c = 1): the minimum-norm solution through LSQR equals the pseudo-inverse's
    xt, _ = joint_solve(op, y, 1.0, method="cg", rtol=1e-12)
    np.testing.assert_allclose(xt, np.linalg.pinv(a) @ y.reshape(-1), atol=1e-7)


def test_default_projection_versions_and_schemes() -> None:
    assert resolve_projection("auto", 256) == "srht"
    assert resolve_projection("auto", 300) == "hblocks"
    assert resolve_projection("hblocks", 256) == "hblocks"
    est = rpsagg.make_estimator("rand-proj-spatial", n=3, k=5, d=300)
    assert (est.name, est.d_pad) == ("rand-proj-spatial:hblocks", 300)  # type: ignore[attr-defined]
    assert est.wire.spec_version == "rpsagg-seed-v4" and est.wire.projection == "hblocks"
    again = rpsagg.make_estimator("rand-proj-spatial:hblocks", n=3, k=5, d=256)
    assert again.name == "rand-proj-spatial:hblocks"
    # a message claiming v3 (or anything older) cannot be an hblocks sketch
    msg = est.encode(np.ones(300), seed=1)
    for old in ("rpsagg-seed-v1", "rpsagg-seed-v2", "rpsagg-seed-v3"):
        claim = rpsagg.Encoded(msg.scheme, 1, 5, 300, msg.values, spec_version=old)
        with pytest.raises(ValueError, match="has no 'rand-proj-spatial:hblocks'"):
            est.decode([claim])
    # messages of the older formats still decode: v1 SRHT, v2 DCT
    for proj, version in (("srht", "rpsagg-seed-v1"), ("dct", "rpsagg-seed-v2")):
        other = rpsagg.make_estimator("rand-proj-spatial", n=3, k=5, d=300, projection=proj)
        m = other.encode(np.ones(300), seed=1)
        old_msg = rpsagg.Encoded(m.scheme, 1, 5, 300, m.values, spec_version=version)
        np.testing.assert_array_equal(other.decode([old_msg]), other.decode([m]))


def test_overflow_and_quantized_values() -> None:
    # section 7's overflow rule: a value that would round to a binary32 infinity is never
    # sent; the encoder refuses the input
    est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=5, d=300)
    with pytest.raises(ValueError, match="x is too large"):
        est.encode(np.full(300, 1e40), seed=1)
    with pytest.raises(ValueError, match="x must be finite"):
        est.encode(np.full(300, np.inf), seed=1)
    # b-bit codes (section 13) of an hblocks sketch: the message needs v4 (the later of
    # hblocks' v4 and the codes' v3) and decodes to the float decode of its code values
    q = rpsagg.make_estimator("rand-proj-spatial", n=2, k=5, d=300, value_bits=4)
    assert (q.name, q.wire.spec_version) == ("rand-proj-spatial:hblocks", "rpsagg-seed-v4")
    x = np.random.default_rng(2).standard_normal((2, 300))
    msgs = [q.encode(x[i], seed=3 + i) for i in range(2)]
    # the library stamps its own version (v5), which is not older than the v4 needed
    assert all(m.codes is not None and m.spec_version == "rpsagg-seed-v5" for m in msgs)
    assert np.all(np.isfinite(q.decode(msgs)))
    stale = [rpsagg.Encoded(m.scheme, m.seed, m.k, m.d, m.values, m.indices, "rpsagg-seed-v3",
                            m.value_bits, m.codes, m.scales) for m in msgs]
    with pytest.raises(ValueError, match="has no 'rand-proj-spatial:hblocks'"):
        q.decode(stale)
