"""Seed-to-randomness derivation (wire format ``rpsagg-seed-v5``; earlier versions are subsets).

Everything a client and the server must agree on is derived here from a 64-bit
seed with SplitMix64 in counter mode, using only unsigned 64-bit integer
arithmetic. ``docs/wire-format.md`` is the normative description; this module is
its reference implementation and the golden vectors in ``docs/wire-vectors.json``
pin it down. NumPy ``Generator`` streams are never used for these quantities.
"""

from __future__ import annotations

import importlib
import math
import os
from types import ModuleType

import numpy as np
from numpy.typing import NDArray

from rpsagg._distinct import first_accepted, scratch

# (tests reach the two paths as spec._first_accepted_scatter / _sort)
from rpsagg._distinct import first_accepted_scatter as _first_accepted_scatter  # noqa: F401
from rpsagg._distinct import first_accepted_sort as _first_accepted_sort  # noqa: F401
from rpsagg._versions import (  # noqa: F401  (re-exported: the spec's version ids and rules)
    FEATURE_SPEC,
    QUANTIZED,
    QUANTIZED_BLOCKWISE,
    SPEC_V1,
    SPEC_V2,
    SPEC_V3,
    SPEC_V4,
    SPEC_V5,
    SPEC_VERSION,
    SPEC_VERSIONS,
    SpecTooOld,
    UnknownSpecVersion,
    check_spec_version,
    message_features,
    required_spec,
)


def _load_native() -> ModuleType | None:
    """The compiled kernels (``rpsagg._fast``), unless absent or ``RPSAGG_NATIVE=0``."""
    if os.environ.get("RPSAGG_NATIVE", "1") == "0":
        return None
    try:
        return importlib.import_module("rpsagg._fast")
    except ImportError:
        return None


#: ``rpsagg._fast`` when built (``pip install`` compiles it where a C compiler exists), else
#: None: then every quantity comes from the numpy code below, with identical bits.
NATIVE: ModuleType | None = _load_native()

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


def _tag(name: bytes) -> int:
    """Stream tag: the 8 ASCII bytes of ``name`` read as a big-endian integer."""
    if len(name) != 8:
        raise AssertionError("stream tags are exactly 8 bytes")
    return int.from_bytes(name, "big")


TAG_SIGNS = _tag(b"rpsSIGNS")  # SRHT sign vector D
TAG_ROWS = _tag(b"rpsROWS_")  # SRHT sampled rows E
TAG_RANDK = _tag(b"rpsRANDK")  # Rand-k / Rand-k-Spatial coordinates
TAG_WANGNI = _tag(b"rpsWNGNI")  # Rand-k-Wangni Bernoulli draws
TAG_INDUCED = _tag(b"rpsINDCD")  # Induced compressor's random part
TAG_MCBETA = _tag(b"rpsMCBTA")  # Monte Carlo seeds for beta (server side only)
TAG_MCPROBE = _tag(b"rpsMCPRB")  # Hutchinson probe vectors for beta (server side only)
TAG_BLOCK = _tag(b"rpsBLOCK")  # blockwise SRHT: per-block transform seeds
TAG_ROUND = _tag(b"rpsROUND")  # service: transform seed of a round submission
TAG_SHIFT = _tag(b"rpsSHIFT")  # v2, randomized DCT (and v4's hblocks): the cyclic shift
TAG_SIGN2 = _tag(b"rpsSIGN2")  # v4, hblocks: the signs between the two Hadamard blocks


def mix64(z: int) -> int:
    """SplitMix64 output function on a Python integer (mod 2^64)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & MASK64
    return z ^ (z >> 31)


def _mix64_array(
    z: NDArray[np.uint64], tmp: NDArray[np.uint64] | None = None
) -> NDArray[np.uint64]:
    """SplitMix64 output function applied in place to ``z`` (returned); ``tmp`` is scratch."""
    if tmp is None:
        tmp = np.empty_like(z)
    np.right_shift(z, np.uint64(30), out=tmp)
    z ^= tmp
    z *= np.uint64(_MUL1)
    np.right_shift(z, np.uint64(27), out=tmp)
    z ^= tmp
    z *= np.uint64(_MUL2)
    np.right_shift(z, np.uint64(31), out=tmp)
    z ^= tmp
    return z


def stream_key(seed: int, tag: int) -> int:
    """Key of the stream ``tag`` for ``seed``: ``mix64(seed XOR tag)``.

    Raises ``ValueError`` unless ``seed`` is an integer in ``[0, 2^64)`` (no silent
    reduction mod 2^64).
    """
    return mix64(check_seed(seed) ^ tag)


def stream_words(key: int, start: int, count: int) -> NDArray[np.uint64]:
    """Words ``start .. start+count-1`` of the SplitMix64 stream with state ``key``.

    Word ``t`` is ``mix64(key + (t + 1) * GAMMA mod 2^64)``: the ``t``-th output of a
    SplitMix64 generator seeded with ``key``.
    """
    return _stream_words_into(key, start, np.empty(count, dtype=np.uint64))


def _stream_words_into(key: int, start: int, out: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``stream_words(key, start, out.size)`` written into ``out`` with per-thread scratch.

    Every step is in place: at the sizes of an encode (10^4-10^5 words) a fresh temporary
    costs more in page faults than the arithmetic.
    """
    count = out.size
    with np.errstate(over="ignore"):
        np.add(scratch("counter", np.uint64, count, fill_counter=True), np.uint64(start), out=out)
        out *= np.uint64(GAMMA)
        out += np.uint64(key)
        return _mix64_array(out, scratch("mix", np.uint64, count))


def sign_bits(seed: int, d_pad: int, tag: int = TAG_SIGNS) -> NDArray[np.uint8]:
    """Bits ``b_j`` (0 or 1) of the SRHT sign vector, ``D_jj = 1 - 2 b_j``.

    Bit ``j`` is bit ``j mod 64`` (least significant first) of word ``j // 64`` of the
    ``TAG_SIGNS`` stream (of ``tag``'s stream: ``TAG_SIGN2`` gives hblocks' second signs).
    """
    if d_pad < 1:
        raise ValueError(f"d_pad must be >= 1; got {d_pad}")
    nwords = (d_pad + 63) // 64
    words = stream_words(stream_key(seed, tag), 0, nwords)
    as_bytes = words.astype("<u8", copy=False).view(np.uint8)
    return np.unpackbits(as_bytes, bitorder="little")[:d_pad]


# Entry b of this table: the 8 int8 factors 1 - 2 bit_j (j = 0..7, least significant
# first) of the byte b, packed in one 8-byte word so that one 1-D take expands 8 signs.
_BYTE_FACTORS = (
    (1 - 2 * np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little"))
    .astype(np.int8)
    .view(np.uint64)
    .reshape(256)
)


def sign_factors(
    seed: int,
    d_pad: int,
    out: NDArray[np.int8] | None = None,
    index_buffer: NDArray[np.intp] | None = None,
    tag: int = TAG_SIGNS,
) -> NDArray[np.int8]:
    """The diagonal of D as int8 ``1 - 2 b_j``, optionally written into ``out``.

    A compiled loop where the kernels are built (:func:`write_sign_factors`), numpy
    otherwise; the same values.

    Parameters
    ----------
    seed : int
        Transform seed.
    d_pad : int
        ``d'``.
    out : ndarray of int8, optional
        C-contiguous with at least ``8 ceil(d'/8)`` entries and 8-byte aligned; the first
        ``d'`` are returned. With ``index_buffer`` (intp, at least ``ceil(d'/8)`` entries)
        it lets a caller reuse its buffers instead of faulting in new pages on every call.
    index_buffer : ndarray of intp, optional
        Scratch space, see ``out``.
    tag : int, optional
        The stream (default ``TAG_SIGNS``; ``TAG_SIGN2`` for hblocks' second signs).

    Returns
    -------
    ndarray of int8, shape (d',)
    """
    if d_pad < 1:
        raise ValueError(f"d_pad must be >= 1; got {d_pad}")
    nbytes = (d_pad + 7) // 8
    if out is None:
        out = np.empty(8 * nbytes, dtype=np.int8)
    elif (
        out.dtype != np.int8
        or not out.flags.c_contiguous
        or out.size < 8 * nbytes
        or out.ctypes.data % 8
    ):
        raise ValueError(f"out must be an aligned C-contiguous int8 array of >= {8 * nbytes}")
    if NATIVE is not None and hasattr(NATIVE, "sign_factors"):
        NATIVE.sign_factors(stream_key(seed, tag), out[:d_pad])
        return out[:d_pad]
    nwords = (d_pad + 63) // 64
    words = _stream_words_into(stream_key(seed, tag), 0, scratch("words", np.uint64, nwords))
    as_bytes = words.astype("<u8", copy=False).view(np.uint8)[:nbytes]
    if index_buffer is None or index_buffer.size < nbytes or index_buffer.dtype != np.intp:
        index_buffer = np.empty(nbytes, dtype=np.intp)
    idx = index_buffer[:nbytes]
    np.copyto(idx, as_bytes)
    np.take(_BYTE_FACTORS, idx, out=out[: 8 * nbytes].view(np.uint64))
    return out[:d_pad]


def write_sign_factors(seed: int, out: NDArray[np.int8], tag: int = TAG_SIGNS) -> None:
    """Write the diagonal of D as int8 ``1 - 2 b_j`` into ``out`` (``d = len(out)``).

    With the compiled kernels the loop runs without the GIL (threads regenerating clients'
    transforms then run in parallel); the values are :func:`sign_factors`' in any case.

    Parameters
    ----------
    seed : int
        Transform seed.
    out : ndarray of int8, shape (d,)
        C-contiguous; every entry is written.
    tag : int, optional
        The stream (default ``TAG_SIGNS``; ``TAG_SIGN2`` for hblocks' second signs).
    """
    if out.dtype != np.int8 or out.ndim != 1 or not out.flags.c_contiguous:
        raise ValueError("out must be a 1-D C-contiguous int8 array")
    if NATIVE is not None and hasattr(NATIVE, "sign_factors"):
        NATIVE.sign_factors(stream_key(seed, tag), out)
        return
    out[:] = sign_factors(seed, out.shape[0], tag=tag)


def signs(seed: int, d_pad: int) -> NDArray[np.float64]:
    """The diagonal of D as float64 +-1."""
    out = sign_bits(seed, d_pad).astype(np.float64)
    out *= -2.0  # in place: 1 - 2 b without two more temporaries of length d'
    out += 1.0
    return out


# The native sampler keeps a bitmap of bound bits (32 MiB at this bound).
_NATIVE_MAX_BOUND = 1 << 28


def sample_distinct(seed: int, tag: int, k: int, bound: int) -> NDArray[np.int64]:
    """``k`` distinct integers from ``[0, bound)``, in order of acceptance.

    Let ``m = ceil(log2(bound))``. Candidate ``t`` is the top ``m`` bits of word ``t``
    of the ``tag`` stream (0 when ``m = 0``). Candidates ``>= bound`` are rejected, as
    are values already accepted; the first ``k`` accepted values, in the order they were
    accepted, are the result. Expected cost grows with ``k`` (about ``k`` words while
    ``k <= bound / 2``), not with ``bound``.
    """
    if bound < 1:
        raise ValueError(f"bound must be >= 1; got {bound}")
    if not 1 <= k <= bound:
        raise ValueError(f"k must be in [1, bound]; got k={k}, bound={bound}")
    key = stream_key(seed, tag)
    if NATIVE is not None and bound <= _NATIVE_MAX_BOUND:
        # sequential rejection sampling with a bitmap of seen values: no sort, no table
        out = np.empty(k, dtype=np.int64)
        NATIVE.sample_distinct(key, k, bound, out)
        return out
    m = (bound - 1).bit_length()
    # First batch: the expected number of words for k distinct accepted values, plus 10%.
    # (Any batch size gives the same result; this one usually needs a single pass.)
    expected = (1 << m) * (math.log(bound + 0.5) - math.log(bound - k + 0.5))
    batch = int(1.1 * expected) + 64
    drawn = np.empty(0, dtype=np.uint64)
    while True:
        # The first batch lives in scratch space (it is consumed before the next call).
        cand = (
            _stream_words_into(key, 0, scratch("words", np.uint64, batch))
            if not drawn.size
            else stream_words(key, drawn.size, batch)
        )
        if m:
            cand >>= np.uint64(64 - m)
        else:
            cand[:] = 0
        drawn = np.concatenate([drawn, cand]) if drawn.size else cand
        first = first_accepted(drawn, bound, m)
        if first.size >= k:
            return drawn[first[:k]].astype(np.int64)
        batch = drawn.size  # double the prefix and try again


def uniforms(seed: int, tag: int, count: int) -> NDArray[np.float64]:
    """``count`` uniforms in [0, 1): ``(word_t >> 11) * 2^-53`` of the ``tag`` stream."""
    words = stream_words(stream_key(seed, tag), 0, count)
    return (words >> np.uint64(11)).astype(np.float64) * (2.0**-53)


def srht_rows(seed: int, k: int, d_pad: int) -> NDArray[np.int64]:
    """The ``k`` rows E samples from the ``d_pad`` rows of H D."""
    return sample_distinct(seed, TAG_ROWS, k, d_pad)


def dct_shift(seed: int, d: int) -> int:
    """The cyclic shift of the randomized DCT (v2): ``sample_distinct(seed, rpsSHIFT, 1, d)``."""
    return int(sample_distinct(seed, TAG_SHIFT, 1, d)[0])


def randk_indices(seed: int, k: int, d: int) -> NDArray[np.int64]:
    """The ``k`` coordinates Rand-k (and Rand-k-Spatial) sends."""
    return sample_distinct(seed, TAG_RANDK, k, d)


def client_id_word(client_id: str) -> int:
    """The first 8 bytes (big-endian) of SHA-256 of the UTF-8 client id."""
    import hashlib

    return int.from_bytes(hashlib.sha256(client_id.encode("utf-8")).digest()[:8], "big")


def derive_round_seed(client_seed: int, nonce: int, client_id: str, vector_index: int = 0) -> int:
    """Transform seed of one vector of a service submission.

    ``mix64(mix64(mix64(mix64(client_seed XOR TAG_ROUND) XOR nonce) XOR id_word) XOR index)``
    where ``id_word`` is :func:`client_id_word`. The client picks ``client_seed`` at random;
    the server's round ``nonce`` and the client id are mixed in, so no client can choose its
    projection, and each of the ``m`` vectors of a submission gets its own seed.
    """
    if not isinstance(client_id, str):
        raise ValueError(f"client_id must be a str; got {type(client_id).__name__}")
    z = mix64((check_seed(client_seed, "client_seed") ^ TAG_ROUND) & MASK64)
    z = mix64(z ^ check_seed(nonce, "nonce"))
    z = mix64(z ^ client_id_word(client_id))
    return mix64(z ^ check_seed(vector_index, "vector_index"))


def padded_dim(d: int) -> int:
    """``d'``: the smallest power of two ``>= d`` (``d >= 1``)."""
    if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1:
        raise ValueError(f"d must be an integer >= 1; got {d!r}")
    return 1 << (int(d) - 1).bit_length()


def check_seed(seed: object, name: str = "seed") -> int:
    """Validate a 64-bit word (a seed by default): an integer in ``[0, 2^64)``."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"{name} must be an integer in [0, 2^64); got {type(seed).__name__}")
    value = int(seed)
    if not 0 <= value <= MASK64:
        raise ValueError(f"{name} must be in [0, 2^64); got {value}")
    return value
