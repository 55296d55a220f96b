"""The seeded projections a client applies, and their joint operators on the server.

A client's message is ``G x`` for a seeded ``k x d'`` projection G: the Subsampled
Randomized Hadamard Transform (:func:`srht_encode`, d' a power of two), the subsampled
randomized DCT (:func:`dct_encode`, any d) or two overlapping Hadamard blocks
(:func:`hblocks_encode`, any d). The server stacks the clients' projections into
``A = [G_1; ...; G_n]`` (:class:`JointSRHT`, :class:`JointDCT`, :class:`JointHBlocks`),
which the joint decode
(:mod:`rpsagg.linalg`) applies matrix-free; :func:`product_path` says whether the
SRHT's products run as the compiled tile kernels or as numpy passes, and :func:`tile_bits`
the tile size they use. The blockwise SRHT
projects each block with its own seed, :func:`block_seed`. The dense matrices (:func:`srht_matrix`,
:func:`dct_matrix`, :func:`hblocks_matrix`) are for tests and interoperability only.

Examples
--------
>>> import numpy as np
>>> from rpsagg.projections import srht_encode, srht_matrix
>>> x = np.arange(16, dtype=np.float64)
>>> bool(np.allclose(srht_encode(x, seed=7, k=4), srht_matrix(7, 4, 16) @ x))
True
"""

from rpsagg._blockwise import AUTO_BLOCK_SIZE, AUTO_BLOCK_THRESHOLD, auto_block_size, block_seed
from rpsagg._dct import JointDCT, dct_encode, dct_matrix
from rpsagg._fwht import BACKEND as FWHT_BACKEND
from rpsagg._fwht import fwht
from rpsagg._hblocks import JointHBlocks, hblocks_encode, hblocks_matrix
from rpsagg._projection import PROJECTIONS
from rpsagg._srht import JointSRHT, product_path, srht_encode, srht_matrix
from rpsagg._srht_plan import tile_bits

__all__ = [
    "AUTO_BLOCK_SIZE",
    "AUTO_BLOCK_THRESHOLD",
    "FWHT_BACKEND",
    "PROJECTIONS",
    "JointDCT",
    "JointHBlocks",
    "JointSRHT",
    "auto_block_size",
    "block_seed",
    "dct_encode",
    "dct_matrix",
    "fwht",
    "hblocks_encode",
    "hblocks_matrix",
    "product_path",
    "srht_encode",
    "srht_matrix",
    "tile_bits",
]
