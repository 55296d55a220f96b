"""EDEN (Vargaftik et al., ICML 2022): randomized Hadamard rotation + Lloyd-Max rounding.

Client: pad x to ``d' = 2^ceil(log2 d)``, rotate ``z = H D x / sqrt(d')`` (D: the SRHT's
sign vector from the seed's ``rpsSIGNS`` stream, so the server regenerates it), round every
coordinate of ``u = z sqrt(d') / ||z||`` to the nearest centroid ``q_j`` of the ``2^b``-level
Lloyd-Max quantizer of N(0, 1), and send the b-bit centroid indices and the float32 scale
``S = ||x||^2 / <z, q>``. Server: ``x_hat_i = D H (S q) / sqrt(d')``, the mean of the
``x_hat_i`` is the estimate. At b = 1 this is DRIVE's unbiased variant (sign quantization).

EDEN's scale makes ``<x_hat, x> = ||x||^2`` exactly and the estimate unbiased for a uniformly
random rotation; with the randomized Hadamard rotation (as in the paper's experiments) the
rotated coordinates are close to N(0, ||x||^2 / d') for all but adversarial inputs, and the
vNMSE ``E||x_hat - x||^2 / ||x||^2`` is ``D / (1 - D)`` for large d (D = the quantizer's
distortion): 0.5708 (= pi/2 - 1), 0.1331, 0.00959 and 4.1e-5 at 1, 2, 4 and 8 bits.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from rpsagg._encoded import Encoded
from rpsagg._error import per_message_error
from rpsagg._estimator import DecodeResult, Estimator, FloatArray
from rpsagg._fwht import fwht
from rpsagg._lloyd_max import EDEN_BITS, boundaries, centroids, distortion
from rpsagg._wireprofile import SchemeTraits
from rpsagg.spec import padded_dim, sign_factors


def rotate(x: FloatArray, seed: int, d_pad: int) -> FloatArray:
    """``H D x / sqrt(d')`` with x zero-padded to ``d_pad`` (an orthogonal map)."""
    v = np.zeros(d_pad)
    v[: x.shape[0]] = x
    v *= sign_factors(seed, d_pad)
    fwht(v, inplace=True)
    v /= np.sqrt(d_pad)
    return v


def unrotate_sum(z: FloatArray, seeds: list[int]) -> FloatArray:
    """``sum_i D_i H z_i / sqrt(d')`` for the rows ``z_i`` of ``z`` (the inverse rotations)."""
    work = np.ascontiguousarray(z, dtype=np.float64).copy()
    d_pad = work.shape[1]
    fwht(work, inplace=True)
    for i, seed in enumerate(seeds):
        work[i] *= sign_factors(seed, d_pad)
    return np.asarray(work.sum(axis=0) / np.sqrt(d_pad))


def eden_quantize(z: FloatArray, bits: int) -> tuple[NDArray[np.uint32], np.float32]:
    """EDEN's codes and scale for the rotated vector ``z`` (``docs/wire-format.md`` section 13).

    The norm comes from ``z`` (in binary64, ``sq = <z, z>``, equal to ``||x||^2`` up to
    rounding: the rotation is orthogonal); ``u = z (sqrt(d') / sqrt(sq))`` is rounded to the
    nearest centroid (a tie to the lower one) and the scale ``sq / <z, q>`` to the nearest
    binary32. ``z = 0`` gives codes 0 and scale 0 (every value decodes to zero).

    Parameters
    ----------
    z : ndarray of float64, shape (d',)
        ``H D x / sqrt(d')``.
    bits : int
        1, 2, 4 or 8.

    Returns
    -------
    codes : ndarray of uint32, shape (d',)
    scale : numpy.float32

    Raises
    ------
    ValueError
        When the scale overflows binary32.
    """
    with np.errstate(over="ignore"):  # an overflow is reported below
        sq = float(np.dot(z, z))  # = ||x||^2 (the rotation is orthogonal)
    if sq == 0.0:
        return np.zeros(z.size, dtype=np.uint32), np.float32(0.0)
    u = z * (np.sqrt(z.size) / np.sqrt(sq))
    codes = np.searchsorted(boundaries(bits), u).astype(np.uint32)
    # every q_j has the sign of z_j (or z_j = 0), so <z, q> > 0
    inner = float(np.dot(z, centroids(bits)[codes]))
    scale = sq / inner
    if not scale <= float(np.finfo(np.float32).max):  # also catches sq = inf
        raise ValueError("x is too large: its quantization scale overflows float32")
    return codes, np.float32(scale)


class Eden(Estimator):
    """EDEN with ``bits`` in {1, 2, 4, 8} per coordinate of the padded rotated vector.

    A message sends ``d'`` codes of ``bits`` bits, one float32 scale and the seed:
    ``bits * d' + 96`` bits.
    """

    name = "eden"
    traits = SchemeTraits(name, takes_k=False, takes_bits=True)
    codebook = "eden"
    _mixes_all_inputs = True

    def __init__(self, n: int, d: int, bits: int) -> None:
        super().__init__(n, d, d)
        if isinstance(bits, bool) or bits not in EDEN_BITS:
            raise ValueError(f"eden bits must be one of {EDEN_BITS}; got {bits!r}")
        self.value_bits = int(bits)
        self.d_pad = padded_dim(self.d)

    @property
    def values_per_message(self) -> int | None:
        return self.d_pad

    def _count(self) -> tuple[int, str]:
        return self.d_pad, "d'"

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        return rotate(x, seed, self.d_pad), None

    def _quantize(self, values: FloatArray, seed: int) -> tuple[NDArray[np.uint32], np.float32]:
        return eden_quantize(values, self.value_bits)

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        z = np.stack([m.values.astype(np.float64) for m in batch])
        total = unrotate_sum(z, [m.seed for m in batch])
        beta = self._beta(len(batch))
        est = beta * total[: self.d]
        # ||z_hat||^2 = ||x||^2 / (1 - D_b) in expectation and the error is ||z_hat||^2 -
        # ||x||^2 (<z_hat, z> = ||x||^2 by the unbiased scale): D_b ||z_hat||^2 per message;
        # the padded rotation spreads it over d' coordinates, d of them kept
        keep = self.d / self.d_pad
        terms = [keep * distortion(self.value_bits) * float(row @ row) for row in z]
        return DecodeResult(est, len(batch), beta, None, None, 0.0,
                            per_message_error(est, terms))

    def predicted_relative_error(self, r: float) -> float:
        """``vNMSE / (1 + R)`` with EDEN's ``vNMSE = D_b / (1 - D_b)`` (Gaussian limit)."""
        dist = distortion(self.value_bits)
        return math.inf if r <= -1.0 else dist / (1.0 - dist) / (1.0 + r) * self.d / self.d_pad

    def _beta(self, n_prime: int) -> float:
        return 1.0 / n_prime

    def __repr__(self) -> str:
        return f"Eden(n={self.n}, d={self.d}, bits={self.value_bits})"
