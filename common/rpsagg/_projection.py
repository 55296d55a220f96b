"""The two seeded projections of Rand-Proj-Spatial and what tells them apart.

* ``"srht"``: the subsampled randomized Hadamard transform on ``x`` zero-padded to ``d'``
  (``rpsagg-seed-v1``; scheme ``rand-proj-spatial``).
* ``"dct"``: the subsampled randomized DCT on ``x`` itself, any ``d`` (``rpsagg-seed-v2``;
  scheme ``rand-proj-spatial:dct``), see :mod:`rpsagg._dct`.

The message scheme of each is named in :mod:`rpsagg._spatial`.

The default (``"auto"``) is the SRHT when ``d`` is a power of two (where the two have the
same estimator error and the SRHT encodes faster) and the DCT otherwise (where the SRHT
pays for its padding); ``docs/performance.md`` has the measurements behind the choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from rpsagg._dct import JointDCT, dct_encode
from rpsagg._srht import JointSRHT, srht_encode
from rpsagg.spec import SPEC_V1, SPEC_V2, padded_dim

FloatArray = NDArray[np.float64]
JointOperator = JointSRHT | JointDCT

PROJECTIONS = ("srht", "dct")
#: The oldest wire-format version that defines each projection.
REQUIRED_SPEC = {"srht": SPEC_V1, "dct": SPEC_V2}


def resolve_projection(projection: str, d: int) -> str:
    """``"srht"`` or ``"dct"`` for the argument ``projection`` (``"auto"`` picks by ``d``)."""
    if projection == "auto":
        return "srht" if d & (d - 1) == 0 else "dct"
    if projection not in PROJECTIONS:
        raise ValueError(
            f"projection must be 'auto', 'srht' or 'dct'; got {projection!r}"
        )
    return projection


def operator_dim(projection: str, d: int) -> int:
    """The dimension the projection acts in: ``d'`` for the SRHT, ``d`` for the DCT."""
    return padded_dim(d) if projection == "srht" else d


def encode(projection: str, x: FloatArray, seed: int, k: int) -> FloatArray:
    """``G x`` (float64, length k) for the projection ``projection`` with ``seed``."""
    if projection == "dct":
        return dct_encode(x, seed, k)
    return srht_encode(x, seed, k, padded_dim(x.shape[0]))


def joint_operator(projection: str, seeds: Sequence[int], k: int, dim: int,
                   threads: int | None = None) -> JointOperator:
    """``A = [G_1; ...; G_n]`` for ``seeds`` in dimension ``dim`` (see :func:`operator_dim`);
    ``threads``: CPU threads of the SRHT's products (the DCT's run on one)."""
    if projection == "dct":
        return JointDCT.from_seeds(seeds, k, dim)
    if projection != "srht":
        raise ValueError(f"unknown projection {projection!r}")
    return JointSRHT.from_seeds(seeds, k, dim, threads=threads)
