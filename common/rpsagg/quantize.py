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

from rpsagg._quantize import CODEBOOKS, dequantize, pack_codes, packed_size, unpack_codes

__all__ = [
    "CODEBOOKS",
    "dequantize",
    "pack_codes",
    "packed_size",
    "unpack_codes",
]
