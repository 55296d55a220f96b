"""Quantized values on the wire: b-bit codes, their packing and their code books.

The public face of the quantized-values machinery (``value_bits`` of Rand-k,
Rand-k-Spatial and Rand-Proj-Spatial, and the EDEN and QSGD baselines). The wire serde
(``rpsagg_wire.v1.serde``) packs and unpacks the codes with :func:`pack_codes` and
:func:`unpack_codes`; the server turns them back into values with :func:`dequantize`.
``docs/wire-format.md`` ("Quantized values") specifies the bit layout and the code books.

Examples
--------
>>> import numpy as np
>>> from rpsagg.quantize import pack_codes, packed_size, unpack_codes
>>> raw = pack_codes(np.array([1, 2, 3]), bits=2)
>>> len(raw) == packed_size(3, 2)
True
>>> unpack_codes(raw, 3, 2).tolist()
[1, 2, 3]
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from rpsagg._lloyd_max import EDEN_BITS
from rpsagg._lloyd_max import centroids as _centroids
from rpsagg._quantize import (
    CODEBOOKS,
    TAG_QROUND,
    dequantize,
    pack_codes,
    packed_size,
    quantize_qsgd,
    quantize_uniform,
    unpack_codes,
)
from rpsagg.spec import check_seed

__all__ = [
    "CODEBOOKS",
    "EDEN_BITS",
    "TAG_QROUND",
    "centroids",
    "dequantize",
    "pack_codes",
    "packed_size",
    "quantize",
    "unpack_codes",
]


def centroids(bits: int) -> NDArray[np.float64]:
    """EDEN's ``2^bits`` Lloyd-Max centroids of N(0, 1), increasing (code ``c`` is entry ``c``).

    Parameters
    ----------
    bits : int
        One of :data:`EDEN_BITS`.

    Returns
    -------
    ndarray of float64, shape (2**bits,)
        A copy of the table of ``docs/wire-vectors.json`` (``lloyd_max_centroids``).
    """
    return np.array(_centroids(bits))


def quantize(
    codebook: str, values: ArrayLike, bits: int, seed: int
) -> tuple[NDArray[np.uint32], np.float32]:
    """Codes and scale of a message's quantizer input (``docs/wire-format.md`` section 13).

    Parameters
    ----------
    codebook : {"uniform", "qsgd", "eden"}
    values : array_like of float64
        The quantizer's input: the binary64 values the scheme would otherwise send as
        binary32 (``uniform``), x itself (``qsgd``) or the rotated ``z`` (``eden``).
    bits : int
        ``value_bits`` for ``uniform``; the scheme's ``bits`` for ``qsgd`` (``s = 2^bits -
        1`` levels) and ``eden``.
    seed : int
        The message's seed (the one its projection or coordinates come from); it keys the
        stochastic rounding stream ``rpsQRND_``. Unused by ``eden``.

    Returns
    -------
    codes : ndarray of uint32
    scale : numpy.float32
    """
    v = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    seed = check_seed(seed)
    if codebook == "uniform":
        return quantize_uniform(v, bits, seed)
    if codebook == "qsgd":
        return quantize_qsgd(v, (1 << bits) - 1, seed)
    if codebook == "eden":
        from rpsagg._eden import eden_quantize

        return eden_quantize(v, bits)
    raise ValueError(f"unknown codebook {codebook!r}; expected one of {CODEBOOKS}")
