"""The seeded projections of Rand-Proj-Spatial and what tells them apart.

* ``"srht"``: the subsampled randomized Hadamard transform on ``x`` zero-padded to ``d'``
  (``rpsagg-seed-v1``; scheme ``rand-proj-spatial``).
* ``"dct"``: the subsampled randomized DCT on ``x`` itself, any ``d`` (``rpsagg-seed-v2``;
  scheme ``rand-proj-spatial:dct``), see :mod:`rpsagg._dct`.
* ``"hblocks"``: two overlapping power-of-two Hadamard blocks on ``x`` itself, any ``d``
  (``rpsagg-seed-v4``; scheme ``rand-proj-spatial:hblocks``), see :mod:`rpsagg._hblocks`.

The message scheme of each is named in :mod:`rpsagg._spatial`.

The default (``"auto"``) is the SRHT when ``d`` is a power of two (nothing to pad; all v1
golden vectors stay valid) and hblocks otherwise: it has the DCT's estimator error (no
padding loss) and encodes at least as fast as the padded SRHT, where the DCT is 2-24x
slower; ``docs/performance.md`` ("Any d") has the measurements behind the choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from rpsagg._dct import JointDCT, dct_encode
from rpsagg._hblocks import JointHBlocks, hblocks_encode
from rpsagg._srht import JointSRHT, srht_encode
from rpsagg.spec import padded_dim

FloatArray = NDArray[np.float64]
JointOperator = JointSRHT | JointDCT | JointHBlocks

PROJECTIONS = ("srht", "dct", "hblocks")


def resolve_projection(projection: str, d: int) -> str:
    """A member of :data:`PROJECTIONS` for the argument ``projection`` (``"auto"`` picks by
    ``d``: the SRHT for a power of two, hblocks otherwise)."""
    if projection == "auto":
        return "srht" if d & (d - 1) == 0 else "hblocks"
    if projection not in PROJECTIONS:
        raise ValueError(
            f"projection must be 'auto', 'srht', 'dct' or 'hblocks'; got {projection!r}"
        )
    return projection


def operator_dim(projection: str, d: int) -> int:
    """The dimension the projection acts in: ``d'`` for the SRHT, ``d`` for the others."""
    return padded_dim(d) if projection == "srht" else d


def encode(projection: str, x: FloatArray, seed: int, k: int) -> FloatArray:
    """``G x`` (float64, length k) for the projection ``projection`` with ``seed``."""
    if projection == "dct":
        return dct_encode(x, seed, k)
    if projection == "hblocks":
        return hblocks_encode(x, seed, k)
    return srht_encode(x, seed, k, padded_dim(x.shape[0]))


def joint_operator(projection: str, seeds: Sequence[int], k: int, dim: int,
                   threads: int | None = None) -> JointOperator:
    """``A = [G_1; ...; G_n]`` for ``seeds`` in dimension ``dim`` (see :func:`operator_dim`);
    ``threads``: CPU threads of the SRHT's products (the others run on one)."""
    if projection == "dct":
        return JointDCT.from_seeds(seeds, k, dim)
    if projection == "hblocks":
        return JointHBlocks.from_seeds(seeds, k, dim)
    if projection != "srht":
        raise ValueError(f"unknown projection {projection!r}")
    return JointSRHT.from_seeds(seeds, k, dim, threads=threads)
