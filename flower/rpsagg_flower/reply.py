"""A compressed reply as it travels: one packed byte string in one Flower record.

The mod describes a compressed reply as :mod:`rpsagg_flower.records` builds it (the *view*:
an ``ArrayRecord`` of raw arrays, ``values`` or ``codes`` and ``scale``, ``indices``,
``plain/<key>``, and a ``ConfigRecord`` with the seed, nonce, scheme, count, value bits and
the ``zero`` / ``absent`` bitmaps) and sends it packed (:func:`pack_reply`): everything the
server knows already (the arrays' names, shapes and dtypes, which of them are compressed,
how many codes a count makes) is left out, and a 4-byte digest of the model's layout stands
for it. The record that carries the packed bytes in the reply is
:mod:`rpsagg_flower.carrier`'s.

The packed bytes (all integers little-endian; ``varint``: unsigned LEB128, at most 10
bytes)::

    u8      version (2)
    u64     client seed
    u64     the round's nonce
    4 B     the model's layout digest (layout_digest)
    u8      scheme code (SCHEME_CODES); BLOCK_CODE: u8 e follows (the scheme is
            rand-proj-spatial:block=<2^e>); 0: u8 length and the name in UTF-8 follow
    u8      value bits (32: float32 values; else the width of each packed code)
    u8      flags: bit 0 set for per-layer compression (one message per compressed array)
    bitmap  zero, ceil(A / 8) bytes (A: the model's arrays, frozen ones included)
    bitmap  absent, ceil(A / 8) bytes
    varint  m, the messages (1 unless per layer)
    m times u8 parts (bit 0: a sketch, bit 1: with indices) and, with a sketch,
            varint count and, with codes (value bits < 32), varint scales
    m times the sketch's data: count float32 values, or packed_size(count, bits) bytes
            of codes and scales float32 scales; then count int32 indices
    the uncompressed arrays not marked absent, in the model's order, raw little-endian
            in the model's dtype and shape

For the example's CNN (16 arrays, one message) the header is 33 B. rpsagg-flower 0.1's
replies (an ``ArrayRecord`` of the arrays, bundled or apart, beside a ``ConfigRecord``
``rpsagg``) are still read (:func:`rpsagg_flower.carrier.read_reply`).
"""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from rpsagg.quantize import packed_size
from rpsagg.schemes import BLOCK_SCHEME_PREFIX, MESSAGE_SCHEME_CODES
from rpsagg_flower.payload import MARK_ABSENT, MARK_ZERO, Layout, marks_from_bytes, marks_to_bytes
from rpsagg_flower.records import PLAIN_PREFIX, STYPE_RAW
from rpsagg_flower.settings import nonce_from_bytes, nonce_to_bytes

#: The packed format's version, its first byte.
REPLY_VERSION = 2
#: One byte per message scheme (fixed: a code is never reused for another scheme);
#: :data:`BLOCK_CODE` and 0 are followed by more (:func:`_scheme_bytes`).
SCHEME_CODES = MESSAGE_SCHEME_CODES  # the registry's table
#: Scheme code of blockwise Rand-Proj-Spatial, ``rand-proj-spatial:block=<2^e>``: one
#: more byte, ``e``.
BLOCK_CODE = 11
_BLOCK_PREFIX = BLOCK_SCHEME_PREFIX
_SCHEMES = {code: name for name, code in SCHEME_CODES.items()}
_FIXED = struct.Struct("<BQQ4s")  # version, seed, nonce, layout digest
_PER_LAYER, _SKETCH, _INDICES = 1, 1, 2


def layout_digest(layout: Layout) -> bytes:
    """4 bytes of SHA-256 over the model's array keys, shapes and dtypes in record order
    and which arrays are compressed and frozen: a reply packed for another model or
    another split is refused instead of decoded into the wrong arrays."""
    described = [[key, list(shape), np.dtype(dtype).name, bool(c), bool(f)]
                 for key, shape, dtype, c, f in zip(layout.keys, layout.shapes, layout.dtypes,
                                                    layout.compressed, layout.frozen,
                                                    strict=True)]
    text = json.dumps(described, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(text).digest()[:4]


def _varint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"a count must not be negative; got {value}")
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _suffixes(count: object) -> list[str]:
    if isinstance(count, int):
        return [""]
    if isinstance(count, list):
        return [f"/{j}" for j in range(len(count))]
    raise ValueError(f"the reply's count must be an int or a list; got {count!r:.40}")


def _scheme_bytes(scheme: str) -> bytes:
    """The scheme's code (:data:`SCHEME_CODES`) and what follows it."""
    if scheme in SCHEME_CODES:
        return bytes([SCHEME_CODES[scheme]])
    block = scheme.removeprefix(_BLOCK_PREFIX)
    if block != scheme and block.isdigit():
        size = int(block)
        if size >= 2 and not size & (size - 1) and size.bit_length() <= 63:
            return bytes([BLOCK_CODE, size.bit_length() - 1])
    name = scheme.encode("utf-8")
    if len(name) > 255:
        raise ValueError(f"scheme name {scheme!r:.40} is longer than 255 bytes")
    return bytes([0, len(name)]) + name


def pack_reply(arrays: ArrayRecord, meta: ConfigRecord, layout: Layout) -> bytes:
    """The packed bytes of a compressed reply's view (``arrays``: raw arrays; ``meta``: its
    description) for a model of ``layout``.

    ``ValueError`` when the view does not fit the layout: an array it does not describe,
    an uncompressed array of another dtype or shape, a malformed entry."""
    try:
        seed, nonce = nonce_from_bytes(meta["seed"]), nonce_from_bytes(meta["nonce"])
        scheme, count, bits = meta["scheme"], meta["count"], meta["value-bits"]
        marks = [meta[MARK_ZERO], meta[MARK_ABSENT]]
    except KeyError as exc:
        raise ValueError(f"the reply lacks {exc.args[0]!r}") from None
    if not (isinstance(scheme, str) and isinstance(bits, int) and 1 <= bits <= 32):
        raise ValueError(f"the reply's scheme {scheme!r:.40} or value bits {bits!r} is "
                         f"malformed")
    zero = marks_from_bytes(marks[0], len(layout.keys), MARK_ZERO)
    absent = marks_from_bytes(marks[1], len(layout.keys), MARK_ABSENT)
    head = bytearray(_FIXED.pack(REPLY_VERSION, seed, nonce, layout_digest(layout)))
    head += _scheme_bytes(scheme)
    suffixes = _suffixes(count)
    counts = count if isinstance(count, list) else [count]
    head += bytes([bits, _PER_LAYER if isinstance(count, list) else 0])
    head += marks_to_bytes(zero) + marks_to_bytes(absent) + _varint(len(suffixes))
    data: list[bytes] = []
    used: set[str] = set()

    def take(key: str, dtype: str, size: int) -> None:
        if key not in arrays:
            raise ValueError(f"the reply lacks the array {key!r}")
        arr = arrays[key]
        if arr.stype != STYPE_RAW or arr.dtype != dtype or len(arr.data) != size:
            raise ValueError(f"array {key!r} is not {size} B of raw {dtype}")
        data.append(arr.data)
        used.add(key)

    for suffix, n in zip(suffixes, counts, strict=True):
        if not isinstance(n, int):
            raise ValueError(f"the reply's count {n!r:.40} is not an int")
        sketch = "values" + suffix in arrays or "codes" + suffix in arrays
        indexed = "indices" + suffix in arrays
        if not sketch:
            head.append(0)
            continue
        head.append(_SKETCH | (_INDICES if indexed else 0))
        head += _varint(n)
        if bits == 32:
            take("values" + suffix, "float32", 4 * n)
        else:
            scales = arrays.get("scale" + suffix)
            if scales is None or len(scales.data) % 4:
                raise ValueError(f"the reply lacks whole float32 scales {'scale' + suffix!r}")
            head += _varint(len(scales.data) // 4)
            take("codes" + suffix, "uint8", packed_size(n, bits))
            take("scale" + suffix, "float32", len(scales.data))
        if indexed:
            take("indices" + suffix, "int32", 4 * n)
    for key, shape, dtype in layout.plain_arrays(absent):
        plain = PLAIN_PREFIX + key
        if plain not in arrays:
            raise ValueError(f"the reply lacks the uncompressed array {key!r}")
        arr = arrays[plain]
        if arr.stype != STYPE_RAW or arr.dtype != str(dtype) or tuple(arr.shape) != shape:
            raise ValueError(f"uncompressed array {key!r} is not raw {dtype}{list(shape)}")
        take(plain, str(dtype), np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))
    extra = [key for key in arrays if key not in used]
    if extra:
        raise ValueError(f"the reply has arrays the packed format does not describe: {extra}")
    return bytes(head) + b"".join(data)


class _Reader:
    """Reads a packed reply front to back; ``ValueError`` when it ends early."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int, what: str) -> bytes:
        if size > len(self.data) - self.at:
            raise ValueError(f"the compressed reply ends {size - (len(self.data) - self.at)} B "
                             f"early, in {what}")
        out = self.data[self.at : self.at + size]
        self.at += size
        return out

    def byte(self, what: str) -> int:
        return self.take(1, what)[0]

    def varint(self, what: str) -> int:
        value = 0
        for shift in range(0, 70, 7):
            b = self.byte(what)
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
        raise ValueError(f"the compressed reply's {what} is not a varint of at most 10 bytes")


def _raw(data: bytes, dtype: str, shape: tuple[int, ...]) -> Array:
    return Array(dtype=dtype, shape=shape, stype=STYPE_RAW, data=data)


def unpack_reply(packed: bytes, layout: Layout) -> tuple[ArrayRecord, ConfigRecord]:
    """The view of a packed reply (:func:`pack_reply`) for a model of ``layout``: its raw
    arrays and its description, which :mod:`rpsagg_flower.records`'s readers check against
    the round.

    ``ValueError`` naming the fault for bytes that are not such a reply: another version,
    another model's layout, an unknown scheme code, malformed bitmaps, bytes missing or
    left over."""
    if not isinstance(packed, bytes):
        raise ValueError(f"the compressed reply is {type(packed).__name__}, not bytes")
    if len(packed) < _FIXED.size:
        raise ValueError(f"the compressed reply is {len(packed)} B, shorter than its "
                         f"{_FIXED.size}-byte start")
    version, seed, nonce, digest = _FIXED.unpack_from(packed)
    if version != REPLY_VERSION:
        raise ValueError(f"the compressed reply is format version {version}; this server reads "
                         f"version {REPLY_VERSION} (and rpsagg-flower 0.1's records)")
    if digest != layout_digest(layout):
        raise ValueError("the compressed reply was packed for another model: its layout digest "
                         f"{digest.hex()} is not the model's {layout_digest(layout).hex()} "
                         "(array keys, shapes, dtypes or the compressed/frozen split differ)")
    read = _Reader(packed)
    read.at = _FIXED.size
    code = read.byte("the scheme code")
    if code == BLOCK_CODE:
        scheme = f"{_BLOCK_PREFIX}{1 << read.byte('the block size')}"
    elif code:
        if code not in _SCHEMES:
            raise ValueError(f"the compressed reply has the unknown scheme code {code}")
        scheme = _SCHEMES[code]
    else:
        try:
            scheme = read.take(read.byte("the scheme"), "the scheme").decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("the compressed reply's scheme name is not UTF-8") from None
    bits, flags = read.byte("the value bits"), read.byte("the flags")
    if not 1 <= bits <= 32 or flags & ~_PER_LAYER:
        raise ValueError(f"the compressed reply has {bits} value bits and flags {flags:#x}")
    size = (len(layout.keys) + 7) // 8
    zero, absent = read.take(size, "the zero bitmap"), read.take(size, "the absent bitmap")
    gone = marks_from_bytes(absent, len(layout.keys), MARK_ABSENT)
    marks_from_bytes(zero, len(layout.keys), MARK_ZERO)
    m = read.varint("the message count")
    if m > len(layout.keys) or (not flags & _PER_LAYER and m != 1):
        raise ValueError(f"the compressed reply has {m} messages for a model of "
                         f"{len(layout.keys)} arrays ({'per layer' if flags else 'one'})")
    parts = []
    for j in range(m):
        what = f"message {j}'s description"
        kind = read.byte(what)
        if kind & ~(_SKETCH | _INDICES) or kind == _INDICES:
            raise ValueError(f"the compressed reply's message {j} has parts {kind:#x}")
        count = read.varint(what) if kind else 0
        scales = read.varint(what) if kind and bits < 32 else 0
        parts.append((kind, count, scales))
    out: dict[str, Array] = {}
    for j, (kind, count, scales) in enumerate(parts):
        if not kind:
            continue
        suffix = f"/{j}" if flags & _PER_LAYER else ""
        what = f"message {j}"
        if bits == 32:
            out["values" + suffix] = _raw(read.take(4 * count, what), "float32", (count,))
        else:
            codes = packed_size(count, bits)
            out["codes" + suffix] = _raw(read.take(codes, what), "uint8", (codes,))
            out["scale" + suffix] = _raw(read.take(4 * scales, what), "float32", (scales,))
        if kind & _INDICES:
            out["indices" + suffix] = _raw(read.take(4 * count, what), "int32", (count,))
    for key, shape, dtype in layout.plain_arrays(gone):
        nbytes = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
        out[PLAIN_PREFIX + key] = _raw(read.take(nbytes, f"uncompressed array {key!r}"),
                                       str(dtype), shape)
    if read.at != len(packed):
        raise ValueError(f"the compressed reply has {len(packed) - read.at} B past its end")
    counts = [c for _, c, _ in parts]
    meta = ConfigRecord({
        "seed": nonce_to_bytes(seed), "nonce": nonce_to_bytes(nonce), "scheme": scheme,
        "count": counts if flags & _PER_LAYER else counts[0], "value-bits": bits,
        MARK_ZERO: zero, MARK_ABSENT: absent,
    })
    return ArrayRecord(out), meta


__all__ = [
    "BLOCK_CODE",
    "REPLY_VERSION",
    "SCHEME_CODES",
    "layout_digest",
    "pack_reply",
    "unpack_reply",
]
