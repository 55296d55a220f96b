#!/usr/bin/env python3
"""Deliberately wrong adapters for the conformance runner (tests/unit/test_conformance.py).

``broken_adapter.py MISTAKE`` answers like conformance/adapters/rpsagg_adapter.py except for
one mistake an implementer could plausibly make reading docs/wire-format.md; the runner must
fail it. The mistakes are points a reader found ambiguous, and a few classic ones.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance" / "adapters"))

import rpsagg_adapter

from rpsagg import _quantize, spec
from rpsagg.quantize import quantize

handle = rpsagg_adapter.handle


def sorted_rows(req: dict[str, Any]) -> dict[str, Any]:
    """sample_distinct's result sorted (the spec keeps the order of first acceptance)."""
    reply = handle(req)
    if req["op"] == "sample_distinct":
        reply["values"] = sorted(reply["values"])
    return reply


def little_endian_tags(req: dict[str, Any]) -> dict[str, Any]:
    """Tags read as little-endian integers."""
    if req["op"] == "stream_key":
        tag = int.from_bytes(req["tag"].encode(), "little")
        return {"key": hex(spec.mix64(int(req["seed"], 16) ^ tag))}
    return handle(req)


def binary32_quantizer_input(req: dict[str, Any]) -> dict[str, Any]:
    """v_j taken as the binary32 value that would otherwise be sent, not the binary64 one."""
    if req["op"] == "quantize" and req["codebook"] == "uniform":
        v = np.array([float.fromhex(a) for a in req["values_f64"]]).astype(np.float32)
        req = dict(req, values_f64=[float(a).hex() for a in v.astype(np.float64)])
    return handle(req)


def rounding_keyed_by_another_seed(req: dict[str, Any]) -> dict[str, Any]:
    """The rpsQRND_ stream keyed by another seed than the message's (here: seed + 1)."""
    if req["op"] in ("quantize", "encode") and "seed" in req:
        real = _quantize.uniforms

        def shifted(seed: int, tag: int, count: int) -> Any:
            return real((seed + 1) & spec.MASK64, tag, count)

        _quantize.uniforms = shifted
        try:
            return handle(req)
        finally:
            _quantize.uniforms = real
    return handle(req)


def scale_rounded_to_nearest(req: dict[str, Any]) -> dict[str, Any]:
    """The uniform and QSGD scale rounded to the nearest binary32 instead of up."""
    real = _quantize.float32_ceil
    _quantize.float32_ceil = lambda value: np.float32(value)
    try:
        return handle(req)
    finally:
        _quantize.float32_ceil = real


def eden_scale_rounded_up(req: dict[str, Any]) -> dict[str, Any]:
    """EDEN's scale rounded up to binary32 (the spec: to nearest)."""
    if req["op"] == "quantize" and req["codebook"] == "eden":
        z = np.array([float.fromhex(a) for a in req["values_f64"]])
        codes, _ = quantize("eden", z, int(req["bits"]), 0)
        exact = 0.0  # the binary64 scale, rounded up below
        if np.dot(z, z) > 0:
            q = rpsagg_adapter.centroids(int(req["bits"]))[codes]
            exact = float(np.dot(z, z)) / float(np.dot(z, q))
        return rpsagg_adapter._message(codes, _quantize.float32_ceil(exact), int(req["bits"]))
    return handle(req)


def qsgd_zero_codes(req: dict[str, Any]) -> dict[str, Any]:
    """x = 0 under QSGD sent as codes 0 (the spec: code s, the level 0)."""
    reply = handle(req)
    if req["op"] == "encode" and req["scheme"] == "qsgd" and not any(req["x"]):
        count = int(reply["value_count"])
        reply["packed_hex"] = bytes(-(-count * int(reply["value_bits"]) // 8)).hex()
    return reply


def dct_off_by_1e5(req: dict[str, Any]) -> dict[str, Any]:
    """The DCT sketch 1e-5 relative off (the tolerance is 1e-6 * max(1, ||x||))."""
    reply = handle(req)
    if req["op"] == "encode" and "values_f32" in reply and req["scheme"].endswith(":dct"):
        v = np.array([int(b, 16) for b in reply["values_f32"]], dtype=np.uint32).view(np.float32)
        v = (v.astype(np.float64) * (1 + 1e-5)).astype(np.float32)
        reply["values_f32"] = [hex(int(b)) for b in v.view(np.uint32)]
    return reply


def hblocks_without_second_signs(req: dict[str, Any]) -> dict[str, Any]:
    """hblocks with the rpsSIGN2 signs left out."""
    if req["op"] == "bits" and req["tag"] == "rpsSIGN2":
        return {"bits": "0x0"}
    return handle(req)


def block_seed_without_inner_mix(req: dict[str, Any]) -> dict[str, Any]:
    """block_seed as mix64(seed ^ tag ^ j) instead of mix64(mix64(seed ^ tag) ^ j)."""
    if req["op"] == "block_seed":
        seed = int(req["seed"], 16)
        return {"seed": hex(spec.mix64(seed ^ spec.TAG_BLOCK ^ int(req["block"])))}
    return handle(req)


def _blockwise_quantized(req: dict[str, Any], one_scale: bool) -> dict[str, Any]:
    """A section 15 encode gone wrong: every block quantized with the message's seed (the
    spec: the block's seed), or all k values on one grid (the spec: a scale per block)."""
    est = rpsagg_adapter._estimator(req)
    seed = int(req["seed"], 16)
    values, _ = est._encode(np.array(req["x"], dtype=np.float64), seed)
    counts = est.scale_counts
    assert counts is not None
    bits = est.value_bits
    if one_scale:
        codes, scale = quantize("uniform", values, bits, seed)
        scales = np.full(len(counts), scale, dtype=np.float32)
    else:
        parts = []
        offset = 0
        for kb in counts:
            parts.append(quantize("uniform", values[offset : offset + kb], bits, seed))
            offset += kb
        codes = np.concatenate([c for c, _ in parts])
        scales = np.array([m for _, m in parts], dtype=np.float32)
    return rpsagg_adapter._message(codes, scales, bits, blockwise=True)


def _is_blockwise_quantized_encode(req: dict[str, Any]) -> bool:
    return (req["op"] == "encode" and ":block=" in str(req.get("scheme"))
            and int(req.get("value_bits", 32)) < 32)


def block_rounding_keyed_by_the_message_seed(req: dict[str, Any]) -> dict[str, Any]:
    """Quantized blockwise: each block's rpsQRND_ stream keyed by the message's seed."""
    if _is_blockwise_quantized_encode(req):
        try:
            return _blockwise_quantized(req, one_scale=False)
        except ValueError as exc:
            return {"refused": str(exc)}
    return handle(req)


def one_scale_for_all_blocks(req: dict[str, Any]) -> dict[str, Any]:
    """Quantized blockwise: the k values quantized as one section 13 message (one grid),
    its scale repeated for every block."""
    if _is_blockwise_quantized_encode(req):
        try:
            return _blockwise_quantized(req, one_scale=True)
        except ValueError as exc:
            return {"refused": str(exc)}
    return handle(req)


def centroid_table_off_by_an_ulp(req: dict[str, Any]) -> dict[str, Any]:
    """EDEN's 4-bit table with its largest centroid one ulp off."""
    reply = handle(req)
    if req["op"] == "centroids" and req["bits"] == 4:
        last = float.fromhex(reply["values"][-1])
        reply["values"][-1] = float(np.nextafter(last, 0.0)).hex()
    return reply


def qsgd_norm_by_dot(req: dict[str, Any]) -> dict[str, Any]:
    """QSGD's sum of squares in BLAS's order (np.dot), not left to right."""
    real = _quantize.sum_of_squares
    _quantize.sum_of_squares = lambda x: float(np.dot(x, x))
    try:
        return handle(req)
    finally:
        _quantize.sum_of_squares = real


def induced_ties_to_the_higher_index(req: dict[str, Any]) -> dict[str, Any]:
    """Induced's top k/2 with ties in |x_j| broken towards the higher index."""
    if req["op"] != "encode" or req["scheme"] != "induced":
        return handle(req)
    x, k, d = np.array(req["x"], dtype=np.float64), int(req["k"]), int(req["d"])
    k_top, k_rand = k // 2, k - k // 2
    top = sorted(range(d), key=lambda j: (-abs(x[j]), -j))[:k_top]
    residual = x.copy()
    residual[top] = 0.0
    rand = [int(j) for j in spec.sample_distinct(int(req["seed"], 16), spec.TAG_INDUCED,
                                                 k_rand, d)]
    values = np.concatenate([x[top], residual[rand] * (d / k_rand)]).astype(np.float32)
    return {"values_f32": [hex(int(b)) for b in values.view(np.uint32)],
            "indices": [int(j) for j in top] + rand}


def never_refuses(req: dict[str, Any]) -> dict[str, Any]:
    """Accepts whatever it is given: a refusal becomes an empty message."""
    reply = handle(req)
    return {"values_f32": []} if "refused" in reply else reply


def exits_early(req: dict[str, Any]) -> dict[str, Any]:
    """The implementation crashes on the first encode."""
    if req["op"] == "encode":
        sys.exit(3)
    return handle(req)


MISTAKES = {f.__name__: f for f in (
    sorted_rows, little_endian_tags, binary32_quantizer_input, rounding_keyed_by_another_seed,
    scale_rounded_to_nearest, eden_scale_rounded_up, qsgd_zero_codes,
    dct_off_by_1e5, hblocks_without_second_signs, block_seed_without_inner_mix,
    block_rounding_keyed_by_the_message_seed, one_scale_for_all_blocks,
    centroid_table_off_by_an_ulp, qsgd_norm_by_dot, induced_ties_to_the_higher_index,
    never_refuses, exits_early,
)}  # fmt: skip

if __name__ == "__main__":
    sys.exit(rpsagg_adapter.main(MISTAKES[sys.argv[1]]))
