"""The plain-Python reference of docs/wire-format.md and the inputs of its test vectors.

Standard library only (no numpy, no rpsagg), so that it reads as the document does and any
implementation can be checked against it. One module serves three users:
``scripts/gen-wire-vectors.py`` (writes docs/wire-vectors.json from the library and these
references), the tests (``tests/unit/test_spec.py``, ``test_dct.py``, ``test_hblocks.py``, ... check
the library against them) and the conformance runner (``conformance/run.py``, the inputs of
the cases). Import it with ``conformance/`` on ``sys.path``: ``import wire_reference``.
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Any

MASK64 = (1 << 64) - 1
REF_GAMMA = 0x9E3779B97F4A7C15


# -- the inputs of the vectors -----------------------------------------------------------------
def golden_x(d: int) -> list[float]:
    """The fixed input of the golden encodings: ``x_j = (j mod 7) - 3``."""
    return [float((j % 7) - 3) for j in range(d)]


def named_x(kind: str, d: int) -> list[float]:
    """The input a case names in its ``"x"``: "golden" (:func:`golden_x`), "zero", and the
    inputs of the sparse cases: "squares" ``(j^2 mod 23) - 11``, "spike" (golden with
    ``x_0 = 100``), "sparse" (three non-zero coordinates at the end)."""
    if kind == "golden":
        return golden_x(d)
    if kind == "zero":
        return [0.0] * d
    if kind == "squares":
        return [float((j * j) % 23 - 11) for j in range(d)]
    if kind == "spike":
        return [100.0, *golden_x(d)[1:]]
    if kind == "sparse":
        return [0.0] * (d - 3) + [2.5, -1.0, 0.5]
    raise ValueError(f"unknown input {kind!r}")


def f32_bits(value: float) -> int:
    """Bit pattern of ``value`` rounded to the nearest float32."""
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


# -- streams (sections 2 and 3) ----------------------------------------------------------------
def ref_mix64(z: int) -> int:
    """SplitMix64's output function (finalizer)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64(state: int) -> tuple[int, int]:
    """One step of the sequential SplitMix64 generator: ``(new_state, output)``."""
    state = (state + REF_GAMMA) & MASK64
    return state, ref_mix64(state)


def ref_tag(name: str) -> int:
    """The 8 ASCII bytes of a stream name as a big-endian integer."""
    raw = name.encode("ascii")
    assert len(raw) == 8
    return int.from_bytes(raw, "big")


def ref_key(seed: int, name: str) -> int:
    return ref_mix64(seed ^ ref_tag(name))


def ref_words(key: int, count: int) -> list[int]:
    """The first ``count`` outputs of a SplitMix64 generator whose state is ``key``."""
    out = []
    state = key
    for _ in range(count):
        state, word = splitmix64(state)
        out.append(word)
    return out


def ref_bits(seed: int, name: str, count: int) -> list[int]:
    """Bits 0 .. count-1 of the stream ``name`` (bit j: bit j mod 64 of word j // 64)."""
    words = ref_words(ref_key(seed, name), (count + 63) // 64)
    return [(words[j // 64] >> (j % 64)) & 1 for j in range(count)]


def ref_sign_bits(seed: int, d_pad: int) -> list[int]:
    return ref_bits(seed, "rpsSIGNS", d_pad)


def ref_sample_distinct(seed: int, name: str, k: int, bound: int) -> list[int]:
    """Rejection sampling on the top m bits of successive words, first-accepted order."""
    m = (bound - 1).bit_length()
    state = ref_key(seed, name)
    out: list[int] = []
    seen: set[int] = set()
    while len(out) < k:
        state, word = splitmix64(state)
        cand = word >> (64 - m) if m else 0
        if cand < bound and cand not in seen:
            seen.add(cand)
            out.append(cand)
    return out


def ref_uniforms(seed: int, name: str, count: int) -> list[float]:
    return [(w >> 11) * 2.0**-53 for w in ref_words(ref_key(seed, name), count)]


def ref_round_seed(client_seed: int, nonce: int, client_id: str, index: int) -> int:
    id_word = int.from_bytes(hashlib.sha256(client_id.encode("utf-8")).digest()[:8], "big")
    z = ref_mix64(client_seed ^ ref_tag("rpsROUND"))
    z = ref_mix64(z ^ nonce)
    z = ref_mix64(z ^ id_word)
    return ref_mix64(z ^ index)


# -- the sketches: SRHT (section 4), DCT (section 12), hblocks (section 14) -----------------
def ref_fwht(v: list[Any]) -> list[Any]:
    """Sylvester-order Walsh-Hadamard transform by butterflies on a Python list."""
    a = list(v)
    h = 1
    while h < len(a):
        for i in range(0, len(a), 2 * h):
            for j in range(i, i + h):
                a[j], a[j + h] = a[j] + a[j + h], a[j] - a[j + h]
        h *= 2
    return a


def ref_encode(x: list[float], seed: int, k: int) -> list[float]:
    """float64 ``(1/sqrt(d')) (H D x_pad)[rows]``; exact up to the final division when x
    holds small integers (the transform is then computed in exact integer arithmetic)."""
    d_pad = 1 << (len(x) - 1).bit_length()
    xs = list(x) + [0] * (d_pad - len(x))
    if all(float(v).is_integer() for v in xs):
        xs = [int(v) for v in xs]
    bits = ref_sign_bits(seed, d_pad)
    t = ref_fwht([-v if b else v for v, b in zip(xs, bits, strict=True)])
    rows = ref_sample_distinct(seed, "rpsROWS_", k, d_pad)
    return [t[r] / math.sqrt(d_pad) for r in rows]


def ref_dct_encode(x: list[float], seed: int, k: int) -> tuple[int, list[int], list[float]]:
    """Shift, rows and binary64 sketch of section 12, in plain Python (``math.fsum`` sums)."""
    d = len(x)
    bits = ref_sign_bits(seed, d)
    shift = ref_sample_distinct(seed, "rpsSHIFT", 1, d)[0]
    w = [0.0] * d
    for j in range(d):
        w[(j + shift) % d] = -x[j] if bits[j] else x[j]
    rows = ref_sample_distinct(seed, "rpsROWS_", k, d)
    out = []
    for r in rows:
        scale = math.sqrt((1.0 if r == 0 else 2.0) / d)
        angle = math.pi / (2 * d)
        terms = (w[m] * math.cos(angle * ((r * (2 * m + 1)) % (4 * d))) for m in range(d))
        out.append(scale * math.fsum(terms))
    return shift, rows, out


def ref_hblocks_encode(x: list[int], seed: int, k: int) -> dict[str, Any]:
    """Section 14 in plain Python for integer x: every sum exact, one rounding per value."""
    d = len(x)
    b = 1 << (d.bit_length() - 1)
    e = d - b
    bits = ref_sign_bits(seed, d)
    shift = ref_sample_distinct(seed, "rpsSHIFT", 1, d)[0]
    w = [0] * d
    for j in range(d):
        w[(j + shift) % d] = -x[j] if bits[j] else x[j]
    t = ref_fwht(w[:b])  # sqrt(b) * (H_lo w)[0:b]
    bits2 = ref_bits(seed, "rpsSIGN2", b - e)
    # the second block's input is u / sqrt(b) + v with integer u (the overlap, signed by
    # D2) and v (the raw part w[b:d]); its FWHT is (fwht(u) + sqrt(b) fwht(v)) / sqrt(b)
    u = [-t[e + j] if bits2[j] else t[e + j] for j in range(b - e)] + [0] * e
    v = [0] * (b - e) + w[b:]
    fu, fv = ref_fwht(u), ref_fwht(v)
    rows = ref_sample_distinct(seed, "rpsROWS_", k, d)
    root = math.sqrt(b)
    y = [t[r] / root if r < e else (fu[r - e] + root * fv[r - e]) / b for r in rows]
    return {"b": b, "shift": shift, "rows": rows, "sign2_bits": bits2, "y": y}


def ref_block_budgets(k: int, blocks: int) -> list[int]:
    """Section 15: floats per block, ``k // B`` plus one for the first ``k % B`` blocks."""
    return [k // blocks + (1 if j < k % blocks else 0) for j in range(blocks)]


# -- Rand-k-Wangni and Induced (sections 5 and 6) ----------------------------------------------
def ref_wangni_c(x: list[float], k: int) -> float | None:
    """Section 6: c from the magnitudes sorted decreasing and their suffix sums."""
    a = sorted((abs(v) for v in x), reverse=True)
    if sum(1 for v in a if v) <= k:
        return None
    suffix = [0.0] * len(a)
    running = 0.0
    for j in range(len(a) - 1, -1, -1):  # from the smallest up
        running += a[j]
        suffix[j] = running
    for j in range(k):
        c = (k - j) / suffix[j]
        if a[j] * c <= 1.0:
            return c
    return k / suffix[0]


def ref_wangni_encode(x: list[float], seed: int, k: int) -> tuple[list[int], list[int]]:
    c = ref_wangni_c(x, k)
    p = [(1.0 if v else 0.0) if c is None else min(1.0, c * abs(v)) for v in x]
    u = ref_uniforms(seed, "rpsWNGNI", len(x))
    keep = [j for j in range(len(x)) if u[j] < p[j]]
    return keep, [f32_bits(x[j] / p[j]) for j in keep]


def ref_induced_encode(x: list[float], seed: int, k: int) -> tuple[list[int], list[int]]:
    d, k_top = len(x), k // 2
    k_rand = k - k_top
    top = sorted(range(d), key=lambda j: (-abs(x[j]), j))[:k_top]
    residual = [0.0 if j in top else v for j, v in enumerate(x)]
    rand = ref_sample_distinct(seed, "rpsINDCD", k_rand, d)
    scale = d / k_rand
    values = [x[j] for j in top] + [residual[j] * scale for j in rand]
    return top + rand, [f32_bits(v) for v in values]


# -- QSGD's norm (section 13) ------------------------------------------------------------------
def ref_sum_of_squares(x: list[float]) -> float:
    """``x_0^2 + x_1^2 + ...`` in binary64, added strictly left to right."""
    running = 0.0
    for v in x:
        running += v * v
    return running


def ref_float32_ceil(value: float) -> float:
    """The least binary32 value ``>= value`` (finite, non-negative ``value``)."""
    f = struct.unpack("<f", struct.pack("<f", value))[0]
    if f < value:
        f = struct.unpack("<f", struct.pack("<I", f32_bits(f) + 1))[0]
    return float(f)
