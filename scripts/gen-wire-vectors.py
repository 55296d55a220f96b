#!/usr/bin/env python3
"""Write docs/wire-vectors.json: the test vectors of docs/wire-format.md.

Run from the repository root with the project's venv: ``.venv/bin/python
scripts/gen-wire-vectors.py`` (``--out PATH`` writes elsewhere; ``--check`` compares with
the committed file and exits 1 on a difference). ``tests/test_wire_vectors.py`` regenerates
the file and compares it byte for byte, so a change to a number produced by the spec shows
as a diff of this file.

Every value comes from the library (``rpsagg``), and the sketches' reference values from the
plain-Python re-implementations of the document in ``tests/test_spec.py``,
``tests/test_dct.py`` and ``tests/test_hblocks.py`` (which also check the library against
them). Quantized cases whose projection is not bit-exact across implementations (the DCT) and
EDEN (whose sums have no defined order) are checked here to be robust: perturbing every
quantizer input by ``ROBUST_REL`` relative, in several sign patterns, leaves the codes and the
scale unchanged, so any implementation within that of the reference reproduces them bit for
bit.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import struct
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "common"))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from test_dct import ref_dct_encode  # noqa: E402
from test_hblocks import ref_hblocks_encode  # noqa: E402

import rpsagg  # noqa: E402
from rpsagg import spec  # noqa: E402
from rpsagg._blockwise import block_budgets, block_seed  # noqa: E402
from rpsagg._lloyd_max import EDEN_BITS, centroids  # noqa: E402
from rpsagg._quantize import TAG_QROUND, pack_codes  # noqa: E402

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
    "codes and scale must match exactly."
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
]


def golden_x(d: int) -> list[float]:
    return [float((j % 7) - 3) for j in range(d)]


def f32_bits(value: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


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
    ref = ref_hblocks_encode([(j % 7) - 3 for j in range(d)], seed, k)
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
        "budgets": block_budgets(k, blocks),
        "y": [hex(int(v)) for v in msg.values.view(np.uint32)],
    }  # fmt: skip


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
    x = np.array(golden_x(d) if xkind == "golden" else [0.0] * d)
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


def build() -> dict[str, Any]:
    tags = {n: spec._tag(raw.encode()) for n, raw in TAGS.items()}
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
