#!/usr/bin/env python3
"""The reference adapter: rpsagg itself, answering the conformance runner's requests.

Run with an interpreter that has ``rpsagg`` installed (the project's ``.venv``)::

    python3 conformance/run.py -- .venv/bin/python conformance/adapters/rpsagg_adapter.py

It reads one JSON request per line on stdin and writes one JSON reply per line on stdout
(conformance/README.md). Only rpsagg's public API is used. :func:`handle` answers one request,
so a test can wrap it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

import rpsagg
from rpsagg import check_spec_version, spec
from rpsagg.projections import block_seed
from rpsagg.quantize import centroids, pack_codes, quantize, unpack_codes


def _int(value: Any) -> int:
    """A 64-bit integer sent as a hex string (or a JSON number)."""
    return int(value, 16) if isinstance(value, str) else int(value)


def _tag(name: str) -> int:
    raw = name.encode("ascii")
    if len(raw) != 8:
        raise ValueError(f"a tag is 8 ASCII bytes; got {name!r}")
    return int.from_bytes(raw, "big")


def _estimator(req: dict[str, Any]) -> rpsagg.Estimator:
    """The estimator whose messages carry ``req["scheme"]``."""
    scheme, d = str(req["scheme"]), int(req["d"])
    value_bits = int(req.get("value_bits", 32))
    if scheme in ("eden", "qsgd"):
        return rpsagg.make_estimator(scheme, n=2, d=d, bits=int(req["bits"]))
    base, _, variant = scheme.partition(":")
    opts: dict[str, Any] = {"n": 2, "k": int(req["k"]), "d": d, "value_bits": value_bits}
    if base == "rand-proj-spatial":
        if variant.startswith("block="):
            opts = {**opts, "block_size": int(variant[len("block="):])}
        else:
            opts["projection"] = variant or "srht"
    elif variant:
        raise ValueError(f"unknown scheme {scheme!r}")
    return rpsagg.make_estimator(base, **opts)


@dataclass(frozen=True)
class _Received:
    """One received vector, the shape ``Estimator.validate`` reads."""

    values: np.ndarray
    indices: np.ndarray | None
    codes: np.ndarray | None
    value_bits: int
    scale: float
    scales: np.ndarray | None


def _f32(bits: str) -> float:
    return float(np.array([int(bits, 16)], dtype=np.uint32).view(np.float32)[0])


def _received(message: dict[str, Any]) -> _Received:
    """A decode request's ``message`` as the vector a decoder received."""
    indices = None
    if "indices" in message:
        indices = np.array([int(i) for i in message["indices"]], dtype=np.int64)
    scale = _f32(message["scale_bits"]) if "scale_bits" in message else 0.0
    scales = None
    if "scales_bits" in message:  # section 15: one scale per block
        scales = np.array([_f32(b) for b in message["scales_bits"]], dtype=np.float32)
    if "packed_hex" not in message:  # a scale here is the decoder's to refuse
        bits = np.array([int(b, 16) for b in message.get("values_f32", [])], dtype=np.uint32)
        return _Received(bits.view(np.float32), indices, None, 32, scale, scales)
    value_bits = int(message["value_bits"])
    if not 1 <= value_bits <= 31:
        raise ValueError(f"packed values need value_bits in [1, 31]; got {value_bits}")
    codes = unpack_codes(bytes.fromhex(message["packed_hex"]), int(message["value_count"]),
                         value_bits)
    return _Received(np.zeros(0, dtype=np.float32), indices, codes, value_bits, scale, scales)


def _decode(req: dict[str, Any]) -> dict[str, Any]:
    """The values a message stands for, after the checks a decoder makes."""
    est = _estimator(req)
    check_spec_version(str(req.get("spec_version", rpsagg.SPEC_VERSION)),
                       est.wire.spec_version)
    received = _received(req["message"])
    est.validate(received, "message")
    values = est.wire.values_of(received)
    return {"values_f32": [hex(int(b)) for b in values.view(np.uint32)]}


def _message(codes: Any, scale: Any, bits: int, blockwise: bool = False) -> dict[str, Any]:
    """A quantized message; ``blockwise``: ``scale`` is the blocks' scales (section 15)."""
    scale_bits = [hex(int(b)) for b in np.array(scale, dtype=np.float32).reshape(-1).view(
        np.uint32)]
    return {
        "packed_hex": pack_codes(np.asarray(codes), bits).hex(),
        "value_bits": bits,
        "value_count": int(np.asarray(codes).size),
        **({"scales_bits": scale_bits} if blockwise else {"scale_bits": scale_bits[0]}),
    }


def _encode(req: dict[str, Any]) -> dict[str, Any]:
    est = _estimator(req)
    msg = est.encode(np.array(req["x"], dtype=np.float64), _int(req["seed"]))
    if msg.codes is None:
        out: dict[str, Any] = {"values_f32": [hex(int(b)) for b in msg.values.view(np.uint32)]}
        if msg.indices is not None:
            out["indices"] = [int(i) for i in msg.indices]
        return out
    assert msg.scales is not None
    if est.scale_counts is not None:
        return _message(msg.codes, msg.scales, msg.value_bits, blockwise=True)
    return _message(msg.codes, msg.scales[0], msg.value_bits)


def handle(req: dict[str, Any]) -> dict[str, Any]:
    """The reply to one request: ``{"refused": ...}`` for an encode or decode the library
    refuses, an ``{"error": ...}`` reply for anything it cannot do."""
    op = req.get("op")
    if op == "stream_key":
        return {"key": hex(spec.stream_key(_int(req["seed"]), _tag(req["tag"])))}
    if op == "words":
        words = spec.stream_words(_int(req["key"]), int(req["start"]), int(req["count"]))
        return {"words": [hex(int(w)) for w in words]}
    if op == "bits":
        bits = spec.sign_bits(_int(req["seed"]), int(req["count"]), _tag(req["tag"]))
        return {"bits": hex(sum(int(b) << j for j, b in enumerate(bits)))}
    if op == "sample_distinct":
        values = spec.sample_distinct(_int(req["seed"]), _tag(req["tag"]), int(req["k"]),
                                      int(req["bound"]))
        return {"values": [int(v) for v in values]}
    if op == "uniforms":
        u = spec.uniforms(_int(req["seed"]), _tag(req["tag"]), int(req["count"]))
        return {"values": [float(a).hex() for a in u]}
    if op == "round_seed":
        seed = spec.derive_round_seed(_int(req["client_seed"]), _int(req["nonce"]),
                                      str(req["client_id"]), _int(req["vector_index"]))
        return {"seed": hex(seed)}
    if op == "block_seed":
        return {"seed": hex(block_seed(_int(req["seed"]), int(req["block"])))}
    if op == "centroids":
        return {"values": [float(c).hex() for c in centroids(int(req["bits"]))]}
    if op in ("encode", "decode"):
        try:
            return _encode(req) if op == "encode" else _decode(req)
        except ValueError as exc:  # the library refuses what the spec rules out
            return {"refused": str(exc)}
    if op == "quantize":
        values = [float.fromhex(v) for v in req["values_f64"]]
        codebook, bits = str(req["codebook"]), int(req["bits"])
        codes, scale = quantize(codebook, values, bits, _int(req["seed"]))
        return _message(codes, scale, bits + 1 if codebook == "qsgd" else bits)
    return {"error": f"unknown op {op!r}"}


def main(answer: Any = handle) -> int:
    """Answer requests until stdin ends."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = answer(json.loads(line))
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
