"""QSGD (Alistarh et al., NeurIPS 2017): stochastic rounding to s levels of |x_j| / ||x||.

Client: with ``s = 2^bits - 1`` and ``r_j = s |x_j| / ||x||`` (``||x||`` rounded up to the
float32 sent), the level ``l_j`` is ``floor(r_j)`` or ``floor(r_j) + 1``, the latter with
probability ``frac(r_j)``; the message sends the code ``s + sign(x_j) l_j`` in ``bits + 1``
bits per coordinate (sign and level; no Elias coding), the float32 norm and the seed. Server:
``x_hat_j = ||x|| (code_j - s) / s``, averaged over clients.

Unbiased, with variance ``E||x_hat - x||^2 = (||x|| / s)^2 sum_j p_j (1 - p_j)``
(``p_j = frac(r_j)``), which the paper bounds by ``min(d / s^2, sqrt(d) / s) ||x||^2``
(Lemma 3.1).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.typing import NDArray

from rpsagg._encoded import Encoded
from rpsagg._error import per_message_error
from rpsagg._estimator import DecodeResult, Estimator, FloatArray
from rpsagg._quantize import qsgd_norm, quantize_qsgd
from rpsagg._wireprofile import SchemeTraits

QSGD_MAX_BITS = 16


def qsgd_variance(x: FloatArray, bits: int) -> float:
    """Exact ``E||Q(x) - x||^2`` of one client's QSGD message for ``x`` (float32 norm)."""
    s = (1 << bits) - 1
    norm = float(qsgd_norm(x))
    if norm == 0.0:
        return 0.0
    r = np.abs(x) * (s / norm)
    p = r - np.floor(r)
    return float((norm / s) ** 2 * np.sum(p * (1.0 - p)))


class Qsgd(Estimator):
    """QSGD with ``s = 2^bits - 1`` levels: ``(bits + 1) d + 96`` bits per message."""

    name = "qsgd"
    traits = SchemeTraits(name, takes_k=False, takes_bits=True)
    codebook = "qsgd"

    def __init__(self, n: int, d: int, bits: int) -> None:
        super().__init__(n, d, d)
        if isinstance(bits, bool) or not isinstance(bits, int | np.integer):
            raise ValueError(f"qsgd bits must be an integer in [1, {QSGD_MAX_BITS}]; got {bits!r}")
        if not 1 <= bits <= QSGD_MAX_BITS:
            raise ValueError(f"qsgd bits must be in [1, {QSGD_MAX_BITS}]; got {bits}")
        self.bits = int(bits)
        self.levels = (1 << self.bits) - 1
        self.value_bits = self.bits + 1

    @property
    def values_per_message(self) -> int | None:
        return self.d

    def _count(self) -> tuple[int, str]:
        return self.d, "d"

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        return x, None

    def _quantize(self, values: FloatArray, seed: int) -> tuple[NDArray[np.uint32], np.float32]:
        return quantize_qsgd(values, self.levels, seed)

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        total = np.sum([m.values.astype(np.float64) for m in batch], axis=0)
        beta = self._beta(len(batch))
        est = beta * total
        # E||x_hat_i||^2 = ||x_i||^2 + E||x_hat_i - x_i||^2 and the scale is ||x_i|| (float32):
        # ||x_hat_i||^2 - scale^2 is unbiased. Its variance: each squared value takes lo^2 or
        # hi^2 (hi - lo = step = scale/s), about (2 |x_hat_j| step)^2 / 6 on average.
        terms, variances = [], []
        for m in batch:
            v = m.values.astype(np.float64)
            scale = 0.0 if m.scales is None else float(m.scales[0])
            terms.append(float(v @ v) - scale * scale)
            step = scale / self.levels
            variances.append((2.0 / 3.0) * step * step * float(v @ v))
        return DecodeResult(est, len(batch), beta, None, None, 0.0,
                            per_message_error(est, terms, variances))

    def predicted_relative_error(self, r: float) -> float:
        """For Gaussian vectors: ``(d/s^2) E[f (1 - f)] / (1 + R)`` with ``f`` the fractional
        part of ``s |g| / sqrt(d)``, g standard normal (a numerical integral)."""
        from scipy.integrate import quad
        from scipy.stats import norm

        s = self.levels
        scale = s / math.sqrt(self.d)
        if r <= -1.0:
            return math.inf
        if scale > 64.0:  # many levels per unit: the fraction is uniform, E[f(1-f)] = 1/6
            return self.d / (s * s) / 6.0 / (1.0 + r)

        def frac_var(t: float) -> float:
            f = scale * t - math.floor(scale * t)
            return 2.0 * f * (1.0 - f) * float(norm.pdf(t))

        edges = [j / scale for j in range(0, int(8.0 * scale) + 2)]
        total = sum(quad(frac_var, lo, hi)[0] for lo, hi in itertools.pairwise(edges))
        return self.d / (s * s) * total / (1.0 + r)

    def _beta(self, n_prime: int) -> float:
        return 1.0 / n_prime

    def __repr__(self) -> str:
        return f"Qsgd(n={self.n}, d={self.d}, bits={self.bits})"
