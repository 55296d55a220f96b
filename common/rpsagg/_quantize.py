"""Quantized values on the wire: b-bit codes, their packing, and unbiased rounding.

A quantized message sends integer codes of ``value_bits`` bits each (packed, see
:func:`pack_codes`) and a few float32 scales; the decoder turns them back into values
(:func:`dequantize`). Three code books share this machinery:

* ``"uniform"`` (``value_bits`` = b for Rand-k, Rand-k-Spatial, Rand-Proj-Spatial): the
  ``L + 1 = 2^b`` points ``m (2 c - L) / L`` on ``[-m, m]``, ``m`` = the float32 max-abs
  of the values (the message's one scale); values are rounded up or down at random with the
  probabilities that make the rounding unbiased.
* ``"qsgd"`` (QSGD with ``s = 2^bits - 1`` levels, ``value_bits = bits + 1``): the
  ``2 s + 1`` points ``||x|| (c - s) / s``, i.e. sign and level ``|x_j| s / ||x||``
  rounded at random; the scale is ``||x||`` as float32.
* ``"eden"``: the Lloyd-Max centroids of N(0, 1) times the message's scale
  (``rpsagg._eden``); the rounding is deterministic.

The random rounding only happens on the client and never has to be reproduced, but it
draws its uniforms from the spec's integer streams (tag ``rpsQROUND`` in
``docs/wire-format.md``) so that a message is a deterministic function of (x, seed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from rpsagg.spec import _tag, uniforms

FloatArray = NDArray[np.float64]
CodeArray = NDArray[np.uint32]

TAG_QROUND = _tag(b"rpsQRND_")  # stochastic rounding of quantized values (client side only)

#: Code books a quantized message may use.
CODEBOOKS = ("uniform", "qsgd", "eden")


def check_value_bits(value_bits: object) -> int:
    """``value_bits`` as an int in ``[1, 32]`` (32 means plain float32 values)."""
    if isinstance(value_bits, bool) or not isinstance(value_bits, int | np.integer):
        raise ValueError(f"value_bits must be an integer in [1, 32]; got {value_bits!r}")
    if not 1 <= int(value_bits) <= 32:
        raise ValueError(f"value_bits must be in [1, 32]; got {value_bits}")
    return int(value_bits)


def packed_size(count: int, bits: int) -> int:
    """Bytes that ``count`` codes of ``bits`` bits occupy when packed.

    Parameters
    ----------
    count : int
        Number of codes.
    bits : int
        Bits per code, 1 to 32.

    Returns
    -------
    int
        ``ceil(count * bits / 8)``.
    """
    return (count * bits + 7) // 8


def pack_codes(codes: NDArray[np.integer], bits: int) -> bytes:
    """Pack codes (each ``< 2^bits``) into a little-endian bit stream.

    Code ``j`` occupies bits ``j*bits .. j*bits + bits - 1`` of the stream, least
    significant bit first, where bit ``t`` of the stream is bit ``t % 8`` of byte ``t // 8``;
    unused high bits of the last byte are 0. ``docs/wire-format.md`` has an example.

    Parameters
    ----------
    codes : ndarray of unsigned int
        The codes, each below ``2^bits``.
    bits : int
        Bits per code, 1 to 32.

    Returns
    -------
    bytes
        :func:`packed_size` bytes.

    Raises
    ------
    ValueError
        If a code does not fit in ``bits`` bits.
    """
    c = np.ascontiguousarray(codes, dtype="<u4").reshape(-1)
    if bits < 32 and c.size and int(c.max()) >> bits:
        raise ValueError(f"a code does not fit in {bits} bits")
    bitmat = np.unpackbits(c.view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    return bytes(np.packbits(bitmat[:, :bits].reshape(-1), bitorder="little").tobytes())


def unpack_codes(raw: bytes, count: int, bits: int) -> CodeArray:
    """Inverse of :func:`pack_codes`.

    Parameters
    ----------
    raw : bytes
        The packed stream.
    count : int
        Number of codes it holds.
    bits : int
        Bits per code, 1 to 32.

    Returns
    -------
    ndarray of uint32, shape (count,)

    Raises
    ------
    ValueError
        Unless ``raw`` has exactly the bytes of ``count`` codes and zero padding bits.
    """
    if len(raw) != packed_size(count, bits):
        raise ValueError(
            f"{len(raw)} bytes of packed codes; {count} codes of {bits} bits need "
            f"{packed_size(count, bits)}"
        )
    stream = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    if stream[count * bits :].any():
        raise ValueError("packed codes have non-zero padding bits")
    bitmat = np.zeros((count, 32), dtype=np.uint8)
    bitmat[:, :bits] = stream[: count * bits].reshape(count, bits)
    return np.packbits(bitmat, axis=1, bitorder="little").reshape(-1).view("<u4").astype(
        np.uint32
    )


def _stochastic_round(t: FloatArray, top: int, seed: int) -> CodeArray:
    """``floor(t) + Bernoulli(frac(t))`` per entry, clipped to ``[0, top]`` (t in [0, top])."""
    low = np.floor(t)
    frac = t - low
    up = uniforms(seed, TAG_QROUND, t.size) < frac
    return np.clip(low + up, 0, top).astype(np.uint32)


def float32_ceil(value: float) -> np.float32:
    """The least float32 that is ``>= value`` (a scale no value can exceed).

    ``ValueError`` when ``value`` exceeds the largest float32 (or is not finite).
    """
    if not value <= float(np.finfo(np.float32).max):
        raise ValueError("x is too large: its quantization scale overflows float32")
    f = np.float32(value)
    if float(f) < value:
        f = np.nextafter(f, np.float32(np.inf))
    return f


def quantize_uniform(values: FloatArray, bits: int, seed: int) -> tuple[CodeArray, np.float32]:
    """Unbiased b-bit codes of ``values`` on ``[-m, m]`` and the scale ``m`` (float32).

    With ``L = 2^b - 1`` and ``t = L (v + m) / (2 m)`` in ``[0, L]``, the code is ``floor(t)``
    or ``ceil(t)`` with probabilities making ``E[code] = t``, so ``E[dequantize] = v``. The
    variance per value is at most ``(m / L)^2`` (a quarter of the squared grid step 2m/L).
    """
    top = (1 << bits) - 1
    m = float32_ceil(float(np.max(np.abs(values)))) if values.size else np.float32(0.0)
    if m == 0:
        return np.zeros(values.size, dtype=np.uint32), m  # every code decodes to 0
    t = (values + float(m)) * (top / (2.0 * float(m)))
    return _stochastic_round(t, top, seed), m


def sum_of_squares(x: FloatArray) -> float:
    """``x_0^2 + x_1^2 + ...`` in binary64, added strictly left to right.

    Each square is rounded to binary64 (no fused multiply-add), then added to the running
    sum in index order: ``docs/wire-format.md`` section 13 fixes this order for QSGD's
    norm, so that every implementation gets the same scale. (``np.dot`` and ``np.sum``
    add in an order of their own; ``np.cumsum`` is sequential by definition.)

    Parameters
    ----------
    x : ndarray of float64

    Returns
    -------
    float
        The sum (``inf`` when it overflows; 0.0 for an empty ``x``).
    """
    if x.size == 0:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # the caller reports an overflow
        squares = np.multiply(x, x)
        np.cumsum(squares, out=squares)
    return float(squares[-1])


def qsgd_norm(x: FloatArray) -> np.float32:
    """QSGD's scale: ``sqrt`` of :func:`sum_of_squares` rounded up to binary32.

    ``ValueError`` when it exceeds binary32's largest finite value.
    """
    return float32_ceil(float(np.sqrt(sum_of_squares(x))))


def quantize_qsgd(x: FloatArray, s: int, seed: int) -> tuple[CodeArray, np.float32]:
    """QSGD codes ``c = s + sign(x_j) l_j`` with the random level ``l_j`` of ``s |x_j| / ||x||``.

    ``E[l_j] = s |x_j| / ||x||`` exactly when ``||x||`` is the float32 norm sent (rounded
    up, so no ratio exceeds 1; :func:`qsgd_norm`).
    """
    norm = qsgd_norm(x)
    if norm == 0:
        return np.full(x.size, s, dtype=np.uint32), norm
    levels = _stochastic_round(np.abs(x) * (s / float(norm)), s, seed).astype(np.int64)
    signed = np.where(x < 0, -levels, levels)
    return (signed + s).astype(np.uint32), norm


def dequantize(
    codebook: str,
    codes: NDArray[np.integer],
    scales: NDArray[np.floating],
    value_bits: int,
    counts: Sequence[int] | None = None,
) -> NDArray[np.float32]:
    """Values of ``codes`` (float32), computed in float64 and rounded once.

    Parameters
    ----------
    codebook : {"uniform", "qsgd", "eden"}
    codes : ndarray of unsigned int
    scales : ndarray of float32
        One scale (shape ``(1,)``), or one per run of codes when ``counts`` is given.
    value_bits : int
        Bits per code: b for uniform, ``bits + 1`` for QSGD, ``bits`` for EDEN.
    counts : sequence of int, optional
        Codes per scale, in order (blockwise messages: the block budgets ``k_j``, one
        float32 scale per block); they must add up to the number of codes.

    Returns
    -------
    ndarray of float32
        One value per code.
    """
    c = np.asarray(codes, dtype=np.int64)
    scale_arr = np.asarray(scales, dtype=np.float32).astype(np.float64)
    if counts is None:
        if scale_arr.shape != (1,):
            raise ValueError(f"a quantized message has one scale; got {scale_arr.size}")
        scale: float | FloatArray = float(scale_arr[0])
    else:
        if scale_arr.shape != (len(counts),):
            raise ValueError(
                f"a blockwise quantized message has one scale per block ({len(counts)}); "
                f"got {scale_arr.size}"
            )
        if sum(counts) != c.size:
            raise ValueError(f"{c.size} codes for blocks of {sum(counts)} values")
        scale = np.repeat(scale_arr, np.asarray(counts, dtype=np.int64))
    if codebook == "uniform":
        top = (1 << value_bits) - 1
        out = scale * (2.0 * c - top) / top
    elif codebook == "qsgd":
        s = (1 << (value_bits - 1)) - 1
        if c.size and int(c.max()) > 2 * s:
            raise ValueError(f"a QSGD code exceeds 2s = {2 * s}")
        out = scale * (c - s) / s
    elif codebook == "eden":
        from rpsagg._lloyd_max import centroids

        out = scale * centroids(value_bits)[c]
    else:
        raise ValueError(f"unknown codebook {codebook!r}; expected one of {CODEBOOKS}")
    return np.asarray(out).astype(np.float32)
