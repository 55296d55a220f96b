"""The message a client sends: a seed, k values (float32 or b-bit codes), and the scheme."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rpsagg.spec import SPEC_VERSION


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
    value_bits : int
        32: ``values`` are sent as float32. Below 32 (and for EDEN and QSGD): the values are
        sent as ``codes`` of ``value_bits`` bits each plus the float32 ``scales``, and
        ``values`` holds what those decode to (``rpsagg._quantize.dequantize``).
    codes : ndarray of uint32 or None
        The integer codes of a quantized message (one per value). Read-only.
    scales : ndarray of float32 or None
        The float32 scale(s) of a quantized message. Read-only.
    """

    scheme: str
    seed: int
    k: int
    d: int
    values: NDArray[np.float32]
    indices: NDArray[np.int64] | None = None
    spec_version: str = SPEC_VERSION
    value_bits: int = 32
    codes: NDArray[np.uint32] | None = None
    scales: NDArray[np.float32] | None = None

    def __post_init__(self) -> None:
        values = np.array(self.values, dtype=np.float32, copy=True).reshape(-1)
        values.setflags(write=False)
        object.__setattr__(self, "values", values)
        if self.indices is not None:
            indices = np.array(self.indices, dtype=np.int64, copy=True).reshape(-1)
            indices.setflags(write=False)
            object.__setattr__(self, "indices", indices)
        if (self.value_bits < 32) != (self.codes is not None) or (self.codes is None) != (
            self.scales is None
        ):
            raise ValueError("a quantized message (value_bits < 32) needs codes and scales")
        for name, dtype in (("codes", np.uint32), ("scales", np.float32)):
            arr = getattr(self, name)
            if arr is not None:
                arr = np.array(arr, dtype=dtype, copy=True).reshape(-1)
                arr.setflags(write=False)
                object.__setattr__(self, name, arr)
        if self.codes is not None and self.codes.size != values.size:
            raise ValueError(f"{self.codes.size} codes for {values.size} values")

    @property
    def quantized(self) -> bool:
        """Whether the values travel as codes (``value_bits < 32``)."""
        return self.codes is not None

    @property
    def bits(self) -> int:
        """Size of the message's content in bits: the 64-bit seed, indices (32 bits each),
        and the values: 32 bits each, or ``value_bits`` per code plus 32 per scale."""
        n_idx = 0 if self.indices is None else int(self.indices.size)
        if self.scales is None:
            value_bits = 32 * int(self.values.size)
        else:
            value_bits = self.value_bits * int(self.values.size) + 32 * int(self.scales.size)
        return 64 + 32 * n_idx + value_bits

    @property
    def payload_bytes(self) -> int:
        """Bytes of the seed, indices (int32 on the wire) and values: 4 per float32, or the
        packed codes (``ceil(value_bits * count / 8)``) plus 4 per scale."""
        n_idx = 0 if self.indices is None else int(self.indices.size)
        if self.scales is None:
            values = 4 * int(self.values.size)
        else:
            values = (self.value_bits * int(self.values.size) + 7) // 8 + 4 * self.scales.size
        return 8 + 4 * n_idx + int(values)
