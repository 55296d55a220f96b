#!/usr/bin/env python3
"""Write docs/wire-vectors.json: the test vectors of docs/wire-format.md.

Run from the repository root with the project's venv: ``.venv/bin/python
scripts/gen-wire-vectors.py`` (``--out PATH`` writes elsewhere; ``--check`` compares with
the committed file and exits 1 on a difference). ``tests/unit/test_conformance.py`` regenerates
the file and compares it byte for byte, so a change to a number produced by the spec shows
as a diff of this file.

Every value comes from the library's public modules (``rpsagg``, ``rpsagg.spec``,
``rpsagg.quantize``, ``rpsagg.projections``), and the sketches' reference values and the
inputs of the cases from the plain-Python re-implementation of the document,
``conformance/wire_reference.py`` (which the tests also check the library against, and the
conformance runner reads the inputs from). Quantized cases whose projection is not bit-exact
across implementations (the DCT) and EDEN (whose sums have no defined order) are checked here
to be robust: perturbing every quantizer input by ``ROBUST_REL`` relative, in several sign
patterns, leaves the codes and the scale unchanged, so any implementation within that of the
reference reproduces them bit for bit.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "common"))
sys.path.insert(0, str(ROOT / "conformance"))

import numpy as np  # noqa: E402
from wire_reference import (  # noqa: E402
    f32_bits,
    golden_x,
    named_x,
    ref_block_budgets,
    ref_dct_encode,
    ref_float32_ceil,
    ref_hblocks_encode,
    ref_sum_of_squares,
    ref_tag,
    ref_wangni_c,
)

import rpsagg  # noqa: E402
from rpsagg import spec  # noqa: E402
from rpsagg.projections import block_seed  # noqa: E402
from rpsagg.quantize import EDEN_BITS, TAG_QROUND, centroids, pack_codes, quantize  # noqa: E402

OUT = ROOT / "docs" / "wire-vectors.json"
MASK64 = (1 << 64) - 1
ROBUST_REL = 2.0**-40  # relative perturbation a robust quantized case withstands
TOLERANCE = 1e-6  # DCT and hblocks: |y - y_f64| <= TOLERANCE * max(1, ||x||_2)

ABOUT = (
    "Test vectors of docs/wire-format.md (section 11), written by scripts/gen-wire-vectors.py. "
    "Integers in hex strings where they are 64-bit words; binary64 values as C99 hex floats "
    "(\"0x1.8p+1\") where they must be exact. Input of every sketch: x_j = (j mod 7) - 3, "
    "j = 0..d-1 (x = 0 where a case says \"x\": \"zero\"). srht, blockwise: y bits must match "
    "exactly (every sum is exact on this input). dct, hblocks: y_f64 is the reference value; "
    "an encoder's binary32 values must lie within <dct|hblocks>_abs_tolerance * max(1, ||x||_2) "
    "of it (hblocks with b a power of 4: y_f32 exactly). quantized (rpsagg-seed-v3): "
    "values_f64 is the quantizer's input (the binary64 sketch values, x for qsgd, the rotated z "
    "for eden), packed_hex the message's codes packed least significant bit first, scale_bits "
    "the binary32 bit pattern of its scale, bits the message's size on the wire (Encoded.bits); "
    "codes and scale must match exactly. blockwise_quantized (rpsagg-seed-v5): the same per "
    "block, scales_bits one binary32 scale per block; exact."
)

# The published first outputs of SplitMix64 (state 0: Vigna's reference code; 1234567: the
# example in the C reference's documentation), literals, not computed here.
PUBLISHED_SPLITMIX64 = {
    "0": ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4", "0x6c45d188009454f"],
    "1234567": ["0x599ed017fb08fc85", "0x2c73f08458540fa5", "0x883ebce5a3f27c77"],
}

TAGS = {
    "SIGNS": "rpsSIGNS", "ROWS": "rpsROWS_", "RANDK": "rpsRANDK", "WANGNI": "rpsWNGNI",
    "INDUCED": "rpsINDCD", "MCBETA": "rpsMCBTA", "ROUND": "rpsROUND", "SHIFT": "rpsSHIFT",
    "SIGN2": "rpsSIGN2", "MCPROBE": "rpsMCPRB", "BLOCK": "rpsBLOCK", "QROUND": "rpsQRND_",
}  # fmt: skip
KEY_SEEDS = [0, 1, MASK64, 0x9F143CDEF6E1B1FA]
SRHT_CASES = [(0, 4, 100), (1, 16, 128), (MASK64, 5, 1000), (0x8BADF00DDEADBEEF, 7, 100),
              (42, 12, 12), (5, 1, 1), (3, 3, 3)]  # fmt: skip
DCT_CASES = [(0, 4, 100), (1, 9, 300), (MASK64, 5, 1000), (0x8BADF00DDEADBEEF, 7, 7),
             (42, 12, 12), (5, 1, 1), (3, 3, 3)]  # fmt: skip
HBLOCKS_CASES = [(0, 4, 100), (1, 9, 300), (MASK64, 12, 12), (0x9F143CDEF6E1B1FA, 6, 1000),
                 (1, 5, 1025), (0, 1, 1)]  # fmt: skip
# (seed, k, d, block size): a short last block, d a multiple of b, one-float blocks, b = 2
BLOCKWISE_CASES = [(1, 10, 300, 64), (MASK64, 7, 100, 32), (0x2A, 8, 256, 64),
                   (0x8BADF00DDEADBEEF, 3, 5, 2)]  # fmt: skip
# (seed, k, d, block size, value_bits, x): quantized blockwise (section 15): a short last
# block, unequal budgets, d a multiple of b, one-float blocks at 1 bit, 31 bits, x = 0
BLOCKWISE_QUANTIZED_CASES: list[tuple[int, int, int, int, int, str]] = [
    (1, 10, 300, 64, 3, "golden"), (MASK64, 7, 100, 32, 8, "golden"),
    (0x2A, 24, 256, 64, 4, "golden"), (0x8BADF00DDEADBEEF, 3, 5, 2, 1, "golden"),
    (0x0123456789ABCDEF, 12, 40, 16, 31, "golden"), (1, 10, 300, 64, 4, "zero"),
]  # fmt: skip
ROUND_CASES = [(0, 0, "", 0), (1, 2, "client-0", 0), (1, 2, "client-0", 1),
               (MASK64, MASK64, "Zoë-Ω", 7), (123456789, 987654321, "alice", 0)]  # fmt: skip
QUANTIZED_SEED = 0x0123456789ABCDEF
# (scheme, options, d, x): every quantizer at several widths, every projection
QUANTIZED_CASES: list[tuple[str, dict[str, Any], int, str]] = [
    ("rand-k", {"k": 6, "value_bits": 3}, 20, "golden"),
    ("rand-proj-spatial", {"k": 6, "value_bits": 3, "projection": "srht"}, 20, "golden"),
    ("rand-proj-spatial", {"k": 6, "value_bits": 3, "projection": "dct"}, 20, "golden"),
    ("eden", {"bits": 1}, 20, "golden"),
    ("eden", {"bits": 2}, 20, "golden"),
    ("qsgd", {"bits": 2}, 20, "golden"),
    # the cases above were the first published; the ones below extend them
    ("rand-k", {"k": 6, "value_bits": 1}, 20, "golden"),
    ("rand-k", {"k": 12, "value_bits": 8}, 20, "golden"),
    ("rand-k", {"k": 20, "value_bits": 16}, 20, "golden"),
    ("rand-k-spatial", {"k": 6, "value_bits": 4}, 20, "golden"),
    ("rand-proj-spatial", {"k": 6, "value_bits": 1, "projection": "srht"}, 20, "golden"),
    ("rand-proj-spatial", {"k": 9, "value_bits": 8, "projection": "srht"}, 20, "golden"),
    ("rand-proj-spatial", {"k": 30, "value_bits": 4, "projection": "srht"}, 300, "golden"),
    ("rand-proj-spatial", {"k": 6, "value_bits": 4, "projection": "dct"}, 20, "golden"),
    ("rand-proj-spatial", {"k": 30, "value_bits": 2, "projection": "dct"}, 300, "golden"),
    ("rand-proj-spatial", {"k": 6, "value_bits": 1, "projection": "hblocks"}, 20, "golden"),
    ("rand-proj-spatial", {"k": 6, "value_bits": 3, "projection": "hblocks"}, 20, "golden"),
    ("rand-proj-spatial", {"k": 30, "value_bits": 4, "projection": "hblocks"}, 300, "golden"),
    ("rand-proj-spatial", {"k": 9, "value_bits": 8, "projection": "hblocks"}, 300, "golden"),
    ("qsgd", {"bits": 1}, 20, "golden"),
    ("qsgd", {"bits": 4}, 20, "golden"),
    ("qsgd", {"bits": 8}, 300, "golden"),
    ("qsgd", {"bits": 16}, 20, "golden"),
    ("eden", {"bits": 4}, 20, "golden"),
    ("eden", {"bits": 8}, 20, "golden"),
    ("eden", {"bits": 4}, 300, "golden"),
    # x = 0: the result every implementation must give (docs/wire-format.md section 13)
    ("rand-proj-spatial", {"k": 6, "value_bits": 4, "projection": "hblocks"}, 20, "zero"),
    ("rand-k", {"k": 6, "value_bits": 3}, 20, "zero"),
    ("qsgd", {"bits": 2}, 20, "zero"),
    ("eden", {"bits": 2}, 20, "zero"),
    # uniform codes wider than 16 bits, up to 31 (the widest a Vector carries)
    ("rand-k", {"k": 6, "value_bits": 17}, 20, "golden"),
    ("rand-k", {"k": 12, "value_bits": 24}, 20, "golden"),
    ("rand-k-spatial", {"k": 6, "value_bits": 31}, 20, "golden"),
    ("rand-proj-spatial", {"k": 9, "value_bits": 20, "projection": "srht"}, 20, "golden"),
    ("rand-proj-spatial", {"k": 9, "value_bits": 31, "projection": "hblocks"}, 300, "golden"),
]
# QSGD's norm (section 13): the squares summed left to right in binary64. The first x is
# the two-coordinate example of the section; on the second, that order gives another
# binary32 scale than the exact sum (math.fsum), numpy's pairwise np.sum and BLAS's dot.
QSGD_NORM_CASES: list[tuple[list[str], int]] = [
    (["0x1p+0", "0x1.ep-24"], 2),
    (["0x1p+0", "0x1.8p+2", "0x1.cp-24", "-0x1.cp+2", "0x1.cp-25", "0x1.8p+2", "0x0p+0",
      "-0x1.8p+1", "0x1.cp-24", "-0x1p+1", "0x1.8p+2", "-0x1.4p+2", "-0x1.8p+1", "0x1p+2",
      "-0x1p+1", "0x1.8p-25"], 4),
]  # fmt: skip
# Rand-k-Wangni and Induced (sections 5, 6): (seed, k, d, x). x "golden" is (j mod 7) - 3
# (ties in |x|), "squares" (j^2 mod 23) - 11, "spike" golden with x_0 = 100 (a p_j = 1),
# "sparse" three non-zero coordinates (at most k: all kept).
SPARSE_CASES: list[tuple[int, int, int, str]] = [
    (1, 6, 20, "golden"), (0x0123456789ABCDEF, 5, 30, "squares"), (MASK64, 4, 20, "spike"),
    (7, 5, 20, "sparse"), (2, 1, 20, "golden"), (3, 20, 20, "squares"), (4, 7, 1000, "squares"),
]  # fmt: skip


def first_bits(seed: int, tag: int, count: int) -> str:
    bits = spec.sign_bits(seed, count, tag)[: min(64, count)]
    return hex(sum(int(b) << j for j, b in enumerate(bits)))


def srht_case(seed: int, k: int, d: int) -> dict[str, Any]:
    d_pad = spec.padded_dim(d)
    est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d, projection="srht")
    y = est.encode(np.array(golden_x(d)), seed=seed).values
    return {
        "seed": hex(seed), "k": k, "d": d, "d_pad": d_pad,
        "sign_bits": first_bits(seed, spec.TAG_SIGNS, d_pad),
        "rows": spec.srht_rows(seed, k, d_pad).tolist(),
        "randk": spec.randk_indices(seed, k, d).tolist(),
        "induced": spec.sample_distinct(seed, spec.TAG_INDUCED, k - k // 2, d).tolist(),
        "wangni_u": [float(u).hex() for u in spec.uniforms(seed, spec.TAG_WANGNI, 3)],
        "y": [hex(int(v)) for v in y.view(np.uint32)],
    }  # fmt: skip


def dct_case(seed: int, k: int, d: int) -> dict[str, Any]:
    shift, rows, y = ref_dct_encode(golden_x(d), seed, k)
    assert shift == spec.dct_shift(seed, d)
    return {
        "seed": hex(seed), "k": k, "d": d, "shift": shift,
        "sign_bits": first_bits(seed, spec.TAG_SIGNS, d), "rows": rows,
        "y_f64": [repr(v) for v in y], "y_f32": [hex(f32_bits(v)) for v in y],
    }  # fmt: skip


def hblocks_case(seed: int, k: int, d: int) -> dict[str, Any]:
    ref = ref_hblocks_encode([int(v) for v in golden_x(d)], seed, k)
    b = ref["b"]
    return {
        "seed": hex(seed), "k": k, "d": d, "b": b, "shift": ref["shift"],
        "sign_bits": first_bits(seed, spec.TAG_SIGNS, d),
        "sign2_bits": hex(sum(bit << j for j, bit in enumerate(ref["sign2_bits"][:64]))),
        "rows": ref["rows"], "y_f64": [repr(v) for v in ref["y"]],
        "y_f32": [hex(f32_bits(v)) for v in ref["y"]],
    }  # fmt: skip


def blockwise_case(seed: int, k: int, d: int, b: int) -> dict[str, Any]:
    est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d, block_size=b)
    msg = est.encode(np.array(golden_x(d)), seed=seed)
    blocks = -(-d // b)
    return {
        "seed": hex(seed), "k": k, "d": d, "block_size": b, "scheme": msg.scheme,
        "block_seeds": [hex(block_seed(seed, j)) for j in range(blocks)],
        "budgets": ref_block_budgets(k, blocks),
        "y": [hex(int(v)) for v in msg.values.view(np.uint32)],
    }  # fmt: skip


def blockwise_quantized_case(seed: int, k: int, d: int, b: int, value_bits: int, xkind: str
                             ) -> dict[str, Any]:
    """Section 15: the message, and each block as the section 13 message it is."""
    x = np.array(named_x(xkind, d))
    est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d, block_size=b,
                                value_bits=value_bits)
    msg = est.encode(x, seed)
    assert msg.codes is not None and msg.scales is not None
    values = quantizer_input(est, x, seed)
    blocks, budgets = -(-d // b), ref_block_budgets(k, -(-d // b))
    per_block: list[dict[str, Any]] = []
    offset = 0
    for j, kb in enumerate(budgets):
        bseed = block_seed(seed, j)
        part = values[offset : offset + kb]
        codes, scale = quantize("uniform", part, value_bits, bseed)
        assert np.array_equal(codes, msg.codes[offset : offset + kb])
        assert float(scale) == float(msg.scales[j])
        per_block.append({"seed": hex(bseed), "values_f64": [float(v).hex() for v in part],
                          "packed_hex": pack_codes(codes, value_bits).hex(),
                          "scale_bits": hex(f32_bits(float(scale)))})
        offset += kb
    case: dict[str, Any] = {"seed": hex(seed), "k": k, "d": d, "block_size": b,
                            "value_bits": value_bits}
    if xkind != "golden":
        case["x"] = xkind
    case.update({
        "scheme": msg.scheme, "budgets": budgets, "blocks": per_block,
        "value_count": int(msg.codes.size),
        "packed_hex": pack_codes(msg.codes, value_bits).hex(),
        "scales_bits": [hex(int(v)) for v in msg.scales.view(np.uint32)], "bits": msg.bits,
    })  # fmt: skip
    assert len(case["scales_bits"]) == blocks
    return case


def quantizer_input(est: Any, x: np.ndarray, seed: int) -> np.ndarray:
    """What the quantizer rounds: the binary64 values ``_encode`` gives (section 13's v_j)."""
    values, _ = est._encode(x, seed)
    return np.asarray(values, dtype=np.float64)


def check_robust(est: Any, values: np.ndarray, seed: int, codes: np.ndarray, scale: float
                 ) -> None:
    """Codes and scale survive a relative perturbation of ROBUST_REL in every input."""
    rng = np.random.default_rng(seed & 0xFFFFFFFF)  # test-side only: the perturbation signs
    for trial in range(16):
        sign = np.where(rng.random(values.size) < 0.5, -1.0, 1.0) if trial else -np.ones(
            values.size)
        shaken = values * (1.0 + sign * ROBUST_REL)
        c2, s2 = est._quantize(shaken, seed)
        assert np.array_equal(c2, codes) and float(s2) == scale, (
            f"{est!r}: codes or scale change under a {ROBUST_REL:g} relative perturbation")


def quantized_case(name: str, options: dict[str, Any], d: int, xkind: str) -> dict[str, Any]:
    seed = QUANTIZED_SEED
    x = np.array(named_x(xkind, d))
    est = rpsagg.make_estimator(name, n=2, d=d, **options)
    msg = est.encode(x, seed)
    assert msg.codes is not None and msg.scales is not None
    values = quantizer_input(est, x, seed)
    codes, scale = est._quantize(values, seed)
    assert np.array_equal(codes, msg.codes) and float(scale) == float(msg.scales[0])
    if name == "eden" or options.get("projection") == "dct":
        check_robust(est, values, seed, codes, float(scale))
    case: dict[str, Any] = {"scheme": name, "options": options}
    if d != 20 or xkind != "golden":  # the first published cases: d = 20, golden x
        case.update({"d": d, "x": xkind})
    case.update({
        "message_scheme": msg.scheme, "seed": f"0x{seed:016x}",
        "values_f64": [float(v).hex() for v in values],
        "value_bits": msg.value_bits, "value_count": int(msg.codes.size),
        "packed_hex": pack_codes(msg.codes, msg.value_bits).hex(),
        "scale_bits": hex(int(msg.scales.view(np.uint32)[0])), "bits": msg.bits,
    })  # fmt: skip
    return case


def qsgd_norm_case(x_hex: list[str], bits: int) -> dict[str, Any]:
    import math

    seed = QUANTIZED_SEED
    x = np.array([float.fromhex(v) for v in x_hex])
    est = rpsagg.make_estimator("qsgd", n=2, d=x.size, bits=bits)
    msg = est.encode(x, seed)
    assert msg.codes is not None and msg.scales is not None
    sq = ref_sum_of_squares(x.tolist())  # the order the spec states, in plain Python
    assert float(msg.scales[0]) == ref_float32_ceil(math.sqrt(sq))
    if x.size > 2:  # this x tells the orders apart
        others = {ref_float32_ceil(math.sqrt(t)) for t in (
            math.fsum(x * x), float(np.sum(x * x)), float(np.dot(x, x)))}
        assert float(msg.scales[0]) not in others, "the case no longer tells the orders apart"
    return {
        "x": x_hex, "bits": bits, "seed": f"0x{seed:016x}", "sum_sq": sq.hex(),
        "value_bits": msg.value_bits, "value_count": int(msg.codes.size),
        "packed_hex": pack_codes(msg.codes, msg.value_bits).hex(),
        "scale_bits": hex(int(msg.scales.view(np.uint32)[0])),
    }  # fmt: skip


def sparse_case(scheme: str, seed: int, k: int, d: int, kind: str) -> dict[str, Any]:
    x = np.array(named_x(kind, d))
    est = rpsagg.make_estimator(scheme, n=2, k=k, d=d)
    msg = est.encode(x, seed)
    assert msg.indices is not None
    case: dict[str, Any] = {"seed": hex(seed), "k": k, "d": d, "x": kind}
    if scheme == "rand-k-wangni":
        c = ref_wangni_c(x.tolist(), k)
        case["c"] = None if c is None else c.hex()
    case["indices"] = [int(i) for i in msg.indices]
    case["values_f32"] = [hex(int(v)) for v in msg.values.view(np.uint32)]
    return case


def _message(msg: Any) -> dict[str, Any]:
    """An Encoded as the conformance kit's decode requests carry it."""
    out: dict[str, Any] = {}
    if msg.codes is None:
        out["values_f32"] = [hex(int(v)) for v in msg.values.view(np.uint32)]
    else:
        out.update({"packed_hex": pack_codes(msg.codes, msg.value_bits).hex(),
                    "value_bits": msg.value_bits, "value_count": int(msg.codes.size)})
        if ":block=" in msg.scheme:  # section 15: one scale per block
            out["scales_bits"] = [hex(int(v)) for v in msg.scales.view(np.uint32)]
        else:
            out["scale_bits"] = hex(int(msg.scales.view(np.uint32)[0]))
    if msg.indices is not None:
        out["indices"] = [int(i) for i in msg.indices]
    return out


def _job(scheme: str, d: int, k: int | None, value_bits: int = 32, bits: int = 0
         ) -> dict[str, Any]:
    req: dict[str, Any] = {"op": "decode", "scheme": scheme, "d": d,
                           "spec_version": spec.SPEC_VERSION}
    if k is not None:
        req["k"] = k
    if value_bits != 32:
        req["value_bits"] = value_bits
    if bits:
        req["bits"] = bits
    return req


def decode_cases(quantized: list[dict[str, Any]], blockwise: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """What a decoder reads from a message: the quantized cases, the quantized blockwise
    cases, a float sketch, a sparse message, and a scale of -0.0 (accepted: every value is a
    zero), also as a block scale."""
    from rpsagg.quantize import dequantize

    out = []
    for c in quantized:
        d, opts, scheme = c.get("d", 20), c["options"], c["message_scheme"]
        codes = rpsagg.quantize.unpack_codes(bytes.fromhex(c["packed_hex"]), c["value_count"],
                                             c["value_bits"])
        scale = np.array([int(c["scale_bits"], 16)], dtype=np.uint32).view(np.float32)
        book = scheme if scheme in ("eden", "qsgd") else "uniform"
        values = dequantize(book, codes, scale, c["value_bits"])
        req = _job(scheme, d, opts.get("k"), opts.get("value_bits", 32), opts.get("bits", 0))
        req["message"] = {n: c[n] for n in ("packed_hex", "value_bits", "value_count",
                                             "scale_bits")}
        out.append({"request": req,
                    "values_f32": [hex(int(v)) for v in values.view(np.uint32)]})
    for c in blockwise:
        codes = rpsagg.quantize.unpack_codes(bytes.fromhex(c["packed_hex"]), c["value_count"],
                                             c["value_bits"])
        scales = np.array([int(b, 16) for b in c["scales_bits"]], dtype=np.uint32)
        values = dequantize("uniform", codes, scales.view(np.float32), c["value_bits"],
                            c["budgets"])
        req = _job(c["scheme"], c["d"], c["k"], c["value_bits"])
        req["message"] = {n: c[n] for n in ("packed_hex", "value_bits", "value_count",
                                             "scales_bits")}
        out.append({"request": req,
                    "values_f32": [hex(int(v)) for v in values.view(np.uint32)]})
    x = np.array(golden_x(20))
    for scheme, k in (("rand-proj-spatial", 6), ("rand-k-wangni", 6), ("induced", 6)):
        msg = rpsagg.make_estimator(scheme, n=2, k=k, d=20).encode(x, 5)
        req = dict(_job(msg.scheme, 20, k), message=_message(msg))
        out.append({"request": req, "values_f32": req["message"]["values_f32"]})
    req = _job("qsgd", 4, None, bits=2)
    codes = np.array([3, 5, 6, 1], dtype=np.uint32)
    req["message"] = {"packed_hex": pack_codes(codes, 3).hex(), "value_bits": 3,
                      "value_count": 4, "scale_bits": "0x80000000"}  # scale -0.0
    values = dequantize("qsgd", codes, np.array([-0.0], dtype=np.float32), 3)
    assert not np.any(values)
    out.append({"request": req, "values_f32": [hex(int(v)) for v in values.view(np.uint32)]})
    req = _job("rand-proj-spatial:block=4", 8, 4, value_bits=2)  # two blocks of 2 values
    codes = np.array([3, 0, 1, 2], dtype=np.uint32)
    scales = np.array([-0.0, 1.5], dtype=np.float32)
    req["message"] = {"packed_hex": pack_codes(codes, 2).hex(), "value_bits": 2,
                      "value_count": 4, "scales_bits": ["0x80000000", "0x3fc00000"]}
    values = dequantize("uniform", codes, scales, 2, [2, 2])
    assert not np.any(values[:2]) and values[2] == np.float32(-0.5)
    out.append({"request": req, "values_f32": [hex(int(v)) for v in values.view(np.uint32)]})
    return out


def refusal_cases() -> list[dict[str, Any]]:
    """Requests a conforming implementation refuses (section 11): encodes with options or
    inputs the spec rules out, and messages a decoder must not accept. Each is checked here
    to be refused by the library."""
    sys.path.insert(0, str(ROOT / "conformance" / "adapters"))
    from rpsagg_adapter import handle

    x20 = golden_x(20)
    enc = {"op": "encode", "seed": "0x1", "d": 20, "x": x20}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("value_bits 0", {**enc, "scheme": "rand-k", "k": 6, "value_bits": 0}),
        ("value_bits 33", {**enc, "scheme": "rand-k", "k": 6, "value_bits": 33}),
        ("eden bits 3", {**enc, "scheme": "eden", "bits": 3}),
        ("qsgd bits 0", {**enc, "scheme": "qsgd", "bits": 0}),
        ("qsgd bits 17", {**enc, "scheme": "qsgd", "bits": 17}),
        ("k 0", {**enc, "scheme": "rand-proj-spatial", "k": 0}),
        ("k > d", {**enc, "scheme": "rand-k", "k": 21}),
        ("k > d (rand-k-wangni)", {**enc, "scheme": "rand-k-wangni", "k": 21}),
        ("block size 1", {**enc, "scheme": "rand-proj-spatial:block=1", "k": 20}),
        ("block size 3", {**enc, "scheme": "rand-proj-spatial:block=3", "k": 10}),
        ("fewer floats than blocks", {**enc, "scheme": "rand-proj-spatial:block=4", "k": 4}),
        ("seed 2^64", {**enc, "scheme": "rand-k", "k": 6, "seed": "0x10000000000000000"}),
        ("a value beyond binary32", {**enc, "scheme": "rand-k", "k": 20,
                                     "x": [3.5e38] * 20}),
        ("a transform beyond binary64", {**enc, "scheme": "rand-proj-spatial", "k": 6,
                                         "x": [1e308] * 20}),
        ("a uniform scale beyond binary32", {**enc, "scheme": "rand-k", "k": 20,
                                             "value_bits": 4, "x": [3.5e38] * 20}),
        ("a QSGD norm beyond binary32", {**enc, "scheme": "qsgd", "bits": 2, "d": 2,
                                         "x": [3e38, 3e38]}),
        ("Wangni magnitudes summing beyond binary64",
         {**enc, "scheme": "rand-k-wangni", "k": 1, "d": 3, "x": [1e308] * 3}),
        ("a block scale beyond binary32", {**enc, "scheme": "rand-proj-spatial:block=4",
                                           "k": 10, "value_bits": 4, "x": [3e38] * 20}),
    ]
    job = _job("rand-k", 20, 6, value_bits=3)
    msg = {"packed_hex": "748101", "value_bits": 3, "value_count": 6, "scale_bits": "0x40400000"}
    qjob = _job("qsgd", 4, None, bits=2)
    qmsg = {"packed_hex": "ab03", "value_bits": 3, "value_count": 4, "scale_bits": "0x3f800000"}
    fjob = _job("rand-proj-spatial", 20, 6)
    floats = {"values_f32": ["0x3f800000"] * 6}
    wjob = _job("rand-k-wangni", 20, 6)
    decode: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("message bits other than the job's", job, {**msg, "value_bits": 4,
                                                    "packed_hex": "00000000"}),
        ("packed values at 32 bits", _job("rand-k", 20, 6), {
            "packed_hex": "00" * 24, "value_bits": 32, "value_count": 6,
            "scale_bits": "0x3f800000"}),
        ("value_count other than k", job, {**msg, "value_count": 5, "packed_hex": "7401"}),
        ("packed bytes too few for value_count", job, {**msg, "packed_hex": "7481"}),
        ("packed bytes too many for value_count", job, {**msg, "packed_hex": "74810100"}),
        ("non-zero padding bits", job, {**msg, "packed_hex": "748141"}),
        ("a QSGD code above 2s", qjob, {**qmsg, "packed_hex": "eb03"}),
        ("value_count other than d (qsgd)", qjob, {**qmsg, "value_count": 3,
                                                   "packed_hex": "ab01"}),
        ("value_count other than d' (eden)", _job("eden", 20, None, bits=1), {
            "packed_hex": "ffff0f", "value_bits": 1, "value_count": 20,  # d' = 32
            "scale_bits": "0x3f800000"}),
        ("NaN scale", job, {**msg, "scale_bits": "0x7fc00000"}),
        ("infinite scale", job, {**msg, "scale_bits": "0x7f800000"}),
        ("negative scale", job, {**msg, "scale_bits": "0xbf800000"}),
        ("values beyond binary32 (eden)", _job("eden", 4, None, bits=8), {
            "packed_hex": "ffffffff", "value_bits": 8, "value_count": 4,
            "scale_bits": "0x7f7fffff"}),
        ("float values where codes are due", job, floats),
        ("codes where float values are due", fjob, msg),
        ("float count other than k", fjob, {"values_f32": ["0x3f800000"] * 5}),
        ("NaN value", fjob, {"values_f32": ["0x7fc00000"] + ["0x3f800000"] * 5}),
        ("infinite value", fjob, {"values_f32": ["0xff800000"] + ["0x3f800000"] * 5}),
        ("indices where the scheme sends none", fjob, {**floats,
                                                       "indices": [0, 1, 2, 3, 4, 5]}),
        ("no indices where the scheme sends them", wjob, floats),
        ("an index outside [0, d)", wjob, {**floats, "indices": [0, 1, 2, 3, 4, 20]}),
        ("a negative index", wjob, {**floats, "indices": [-1, 1, 2, 3, 4, 5]}),
        ("fewer indices than values", wjob, {**floats, "indices": [0, 1, 2, 3, 4]}),
        ("more values than d (rand-k-wangni)", wjob, {"values_f32": ["0x3f800000"] * 21,
                                                      "indices": [*range(20), 0]}),
    ]
    bjob = _job("rand-proj-spatial:block=4", 8, 4, value_bits=2)  # blocks of 2 values
    bmsg = {"packed_hex": "c9", "value_bits": 2, "value_count": 4,
            "scales_bits": ["0x3f800000", "0x3fc00000"]}
    decode += [
        ("fewer block scales than blocks", bjob, {**bmsg, "scales_bits": ["0x3f800000"]}),
        ("more block scales than blocks", bjob, {**bmsg, "scales_bits": ["0x3f800000"] * 3}),
        ("one scale where block scales are due", bjob, {
            "packed_hex": "c9", "value_bits": 2, "value_count": 4, "scale_bits": "0x3f800000"}),
        ("a non-zero scale beside block scales", bjob, {**bmsg, "scale_bits": "0x3f800000"}),
        ("block scales where one scale is due", job, {
            "packed_hex": "748101", "value_bits": 3, "value_count": 6,
            "scales_bits": ["0x40400000"]}),
        ("a NaN block scale", bjob, {**bmsg, "scales_bits": ["0x3f800000", "0x7fc00000"]}),
        ("an infinite block scale", bjob, {**bmsg, "scales_bits": ["0x7f800000",
                                                                   "0x3f800000"]}),
        ("a negative block scale", bjob, {**bmsg, "scales_bits": ["0x3f800000",
                                                                  "0xbf800000"]}),
        ("block codes where float values are due", _job("rand-proj-spatial:block=4", 8, 4),
         bmsg),
        ("float values where block codes are due", bjob, {"values_f32": ["0x3f800000"] * 4}),
        ("a non-zero scale beside float values", fjob, {**floats, "scale_bits": "0x3f800000"}),
        ("block scales beside float values", bjob, {"values_f32": ["0x3f800000"] * 4,
                                                    "scales_bits": ["0x3f800000"] * 2}),
    ]
    for why, j, m in decode:
        cases.append((why, {**j, "message": m}))
    versions = [
        ("an unknown spec version", fjob, floats, "rpsagg-seed-v9"),
        ("a DCT message claiming v1", _job("rand-proj-spatial:dct", 20, 6), floats,
         "rpsagg-seed-v1"),
        ("a quantized message claiming v2", job, msg, "rpsagg-seed-v2"),
        ("an hblocks message claiming v3", _job("rand-proj-spatial:hblocks", 20, 6), floats,
         "rpsagg-seed-v3"),
        ("a quantized blockwise message claiming v4", bjob, bmsg, "rpsagg-seed-v4"),
    ]
    for why, j, m, version in versions:
        cases.append((why, {**j, "message": m, "spec_version": version}))
    out = []
    for why, req in cases:
        reply = handle(json.loads(json.dumps(req)))
        assert "refused" in reply, f"the library does not refuse {why}: {reply}"
        out.append({"why": why, "request": req})
    return out


def build() -> dict[str, Any]:
    tags = {n: ref_tag(raw) for n, raw in TAGS.items()}
    out: dict[str, Any] = {"spec": spec.SPEC_VERSION, "about": ABOUT}
    out["published_splitmix64"] = PUBLISHED_SPLITMIX64
    out["tags"] = TAGS
    out["keys"] = {
        hex(s): {n: hex(spec.stream_key(s, t)) for n, t in tags.items()} for s in KEY_SEEDS
    }
    out["sign_words"] = {
        hex(s): [hex(int(w)) for w in spec.stream_words(spec.stream_key(s, spec.TAG_SIGNS), 0, 4)]
        for s in KEY_SEEDS
    }
    out["srht_cases"] = [srht_case(*c) for c in SRHT_CASES]
    out["dct_abs_tolerance"] = TOLERANCE
    out["dct_cases"] = [dct_case(*c) for c in DCT_CASES]
    out["round"] = [
        {"client_seed": hex(cs), "nonce": hex(nonce), "client_id": cid, "vector_index": idx,
         "seed": hex(spec.derive_round_seed(cs, nonce, cid, idx))}
        for cs, nonce, cid, idx in ROUND_CASES
    ]  # fmt: skip
    out["quantized_seed"] = f"0x{QUANTIZED_SEED:016x}"
    out["quantized_cases"] = [quantized_case(*c) for c in QUANTIZED_CASES]
    out["hblocks_abs_tolerance"] = TOLERANCE
    out["hblocks_cases"] = [hblocks_case(*c) for c in HBLOCKS_CASES]
    # sections added with the conformance kit (conformance/README.md)
    out["tag_words"] = {
        n: [hex(int(w)) for w in spec.stream_words(spec.stream_key(1, t), 0, 3)]
        for n, t in tags.items()
    }
    out["blockwise_cases"] = [blockwise_case(*c) for c in BLOCKWISE_CASES]
    out["lloyd_max_centroids"] = {
        str(b): [float(c).hex() for c in centroids(b)] for b in EDEN_BITS
    }
    # sections added with the specification of Wangni, Induced, QSGD's norm and refusals
    out["qsgd_norm_cases"] = [qsgd_norm_case(*c) for c in QSGD_NORM_CASES]
    out["wangni_cases"] = [sparse_case("rand-k-wangni", *c) for c in SPARSE_CASES]
    out["induced_cases"] = [sparse_case("induced", *c) for c in SPARSE_CASES]
    # section added with quantized blockwise values (rpsagg-seed-v5)
    out["blockwise_quantized_cases"] = [
        blockwise_quantized_case(*c) for c in BLOCKWISE_QUANTIZED_CASES
    ]
    out["decode_cases"] = decode_cases(out["quantized_cases"], out["blockwise_quantized_cases"])
    out["refusal_cases"] = refusal_cases()
    assert tags["QROUND"] == TAG_QROUND
    return out


def render(vectors: dict[str, Any]) -> str:
    return json.dumps(vectors, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=OUT, help="where to write")
    ap.add_argument("--check", action="store_true",
                    help="compare with --out instead of writing; exit 1 on a difference")
    args = ap.parse_args(argv)
    text = render(build())
    if args.check:
        same = args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'differs from the generator output'}")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
