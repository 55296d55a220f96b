"""The message a client sends: a seed, k float32 values, and what identifies the scheme."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rpsagg._spec import SPEC_VERSION


@dataclass(frozen=True, eq=False)
class Encoded:
    """One client's compressed vector.

    Attributes
    ----------
    scheme : str
        Estimator name (``"rand-proj-spatial"``, ``"rand-k"``, ...).
    seed : int
        The 64-bit seed from which the decoder regenerates the transform.
    k : int
        Per-client budget the estimator was built with.
    d : int
        Length of the original vector.
    values : ndarray of float32
        The floats sent: ``k`` of them for the SRHT and Rand-k family, a variable count
        for Rand-k-Wangni, ``d`` for ``"full"``. Read-only.
    indices : ndarray of int64 or None
        Coordinates of ``values`` for the schemes that send them (Wangni, Induced).
    spec_version : str
        Version of the seed-to-transform derivation (``docs/wire-format.md``).
    """

    scheme: str
    seed: int
    k: int
    d: int
    values: NDArray[np.float32]
    indices: NDArray[np.int64] | None = None
    spec_version: str = SPEC_VERSION

    def __post_init__(self) -> None:
        values = np.array(self.values, dtype=np.float32, copy=True).reshape(-1)
        values.setflags(write=False)
        object.__setattr__(self, "values", values)
        if self.indices is not None:
            indices = np.array(self.indices, dtype=np.int64, copy=True).reshape(-1)
            indices.setflags(write=False)
            object.__setattr__(self, "indices", indices)

    @property
    def payload_bytes(self) -> int:
        """Bytes of values (float32) and indices (int32 on the wire) plus the 8-byte seed."""
        n_idx = 0 if self.indices is None else int(self.indices.size)
        return 8 + 4 * int(self.values.size) + 4 * n_idx
