"""The coordinate-sampling estimators: Full (no compression), Rand-k, Rand-k-Wangni and
the induced compressor. Rand-k-Spatial (``rpsagg._spatial``) shares Rand-k's encoding."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from rpsagg._encoded import Encoded
from rpsagg._error import (
    ErrorEstimate,
    per_message_error,
    quantization_variance,
    sketch_error,
    zero_error,
)
from rpsagg._error_coef import ErrorCoefficients, quantized_relative_extra, randk_coefficients
from rpsagg._estimator import DecodeResult, Estimator, FloatArray
from rpsagg._wireprofile import SchemeTraits
from rpsagg.spec import TAG_INDUCED, TAG_WANGNI, randk_indices, sample_distinct, uniforms


def _sparse_sum(batch: list[Encoded], d: int) -> FloatArray:
    total = np.zeros(d)
    for msg in batch:
        assert msg.indices is not None
        np.add.at(total, msg.indices, msg.values.astype(np.float64))
    return total


class FullEstimator(Estimator):
    """No compression: every client sends its d floats; the decode is the plain mean."""

    name = "full"
    traits = SchemeTraits(name)

    @property
    def values_per_message(self) -> int | None:
        return self.d

    def _count(self) -> tuple[int, str]:
        return self.d, "d"

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        return x, None

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        total = np.sum([m.values.astype(np.float64) for m in batch], axis=0)
        beta = self._beta(len(batch))
        est = beta * total
        return DecodeResult(est, len(batch), beta, None, None, 0.0, zero_error(est))

    def predicted_relative_error(self, r: float) -> float:
        return 0.0

    def _beta(self, n_prime: int) -> float:
        return 1.0 / n_prime


class RandK(Estimator):
    """Rand-k: k uniformly chosen coordinates, ``x_hat = d/(n k) sum_i E_i^T E_i x_i``."""

    name = "rand-k"
    traits = SchemeTraits(name, quantizable=True, supports_r_hat=True)

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        return x[randk_indices(seed, self.k, self.d)], None

    def _scatter(self, batch: list[Encoded]) -> tuple[FloatArray, NDArray[np.int64]]:
        sums = np.zeros(self.d)
        counts = np.zeros(self.d, dtype=np.int64)
        for msg in batch:
            idx = randk_indices(msg.seed, self.k, self.d)
            sums[idx] += msg.values.astype(np.float64)  # indices are distinct per message
            counts[idx] += 1
        return sums, counts

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        sums, _ = self._scatter(batch)
        beta = self._beta(len(batch))
        error = self._sketch_error(batch, sums, randk_coefficients(len(batch), self.k, self.d))
        return DecodeResult(beta * sums, len(batch), beta, None, None, 0.0, error)

    def _sketch_error(self, batch: list[Encoded], sums: FloatArray,
                      coef: ErrorCoefficients) -> ErrorEstimate:
        """The error estimate from the sketches (``sums`` is ``sum_i E_i^T y_i``)."""
        y = np.stack([m.values.astype(np.float64) for m in batch])
        qvar = np.array([quantization_variance(m) for m in batch])
        return sketch_error(y, float(sums @ sums), self.d, self.k, coef, qvar=qvar)

    def _beta(self, n_prime: int) -> float:
        return self.d / (n_prime * self.k)

    def predicted_relative_error(self, r: float) -> float:
        coef = randk_coefficients(self.n, self.k, self.d)
        return coef.relative_error(r) + quantized_relative_extra(coef, self.k, self.value_bits, r)


def wangni_scale(x: FloatArray, k: int) -> float | None:
    """Wangni's ``c``: ``p_j = min(1, c |x_j|)`` has ``sum_j p_j = k``.

    The arithmetic of ``docs/wire-format.md`` section 6: ``a`` the magnitudes sorted
    decreasing, ``S_j = a_{d-1} + ... + a_j`` added in binary64 from the smallest up,
    ``c = (k - j) / S_j`` for the least ``j < k`` with ``a_j ((k - j) / S_j) <= 1`` (j = 0
    when there is none, which only rounding can cause).

    Parameters
    ----------
    x : ndarray of float64, shape (d,)
        Finite.
    k : int
        The expected number of kept coordinates, ``1 <= k <= d``.

    Returns
    -------
    float or None
        ``c``; None when x has at most k non-zero entries (every one of them is kept).

    Raises
    ------
    ValueError
        When the sum of the magnitudes overflows binary64 (``c`` would be 0).
    """
    mag = np.abs(x)
    if int(np.count_nonzero(mag)) <= k:
        return None
    a = mag[np.argsort(-mag, kind="stable")]
    with np.errstate(over="ignore"):  # reported below
        suffix = np.cumsum(a[::-1])[::-1]  # suffix[j] = sum_{i >= j} a_i, smallest first
    if not np.isfinite(suffix[0]):
        raise ValueError("x is too large: the sum of its magnitudes overflows float64")
    j = np.arange(k)
    scale = (k - j) / suffix[:k]
    ok = a[:k] * scale <= 1.0
    first = int(np.argmax(ok))  # j = k-1 satisfies the condition but for rounding
    return float(scale[first])


def wangni_probabilities(x: FloatArray, k: int) -> FloatArray:
    """Keep probabilities ``p_j = min(1, c |x_j|)`` with ``sum_j p_j = k`` (Wangni et al.).

    When x has at most k non-zero entries every one of them is kept (p = 1); ``c`` is
    :func:`wangni_scale`'s.

    Parameters
    ----------
    x : ndarray of float64, shape (d,)
        Finite.
    k : int
        The expected number of kept coordinates, ``1 <= k <= d``.

    Returns
    -------
    ndarray of float64, shape (d,)
    """
    mag = np.abs(x)
    c = wangni_scale(x, k)
    if c is None:
        return (mag > 0).astype(np.float64)
    return np.minimum(1.0, c * mag)


def wangni_error(values: FloatArray, k: int, d: int) -> tuple[float, float]:
    """Estimate of ``E||x_hat_i - x_i||^2`` from one message, and its variance.

    A kept coordinate with ``p_j < 1`` carries ``+-1/c`` (the smallest magnitude sent, the
    same binary32 for all of them), one with ``p_j = 1`` carries ``x_j`` itself and adds no
    error. With ``p_j = c |x_j|`` below 1 the error is
    ``sum_j x_j^2 (1/p_j - 1) = sum_{p_j < 1} p_j (1 - p_j) / c^2 = Var(m) / c^2``, where
    ``m``, the count of kept values at ``1/c``, is a sum of independent Bernoulli(p_j) draws
    whose mean is known exactly: c makes ``sum_j p_j = k``, so ``E[m] = k - s`` with ``s``
    the coordinates sent exactly. Hence ``(m - (k - s))^2 / c^2`` is unbiased. Its variance
    is about ``2 Var(m)^2 / c^4`` (a squared normal deviation), with ``Var(m)`` taken from
    the plug-in ``m (1 - m / d_s)`` (``d_s = d - s``). With at most one value at the
    smallest magnitude and no more than k values, the message is read as one of a vector
    with at most k non-zero coordinates (all kept exactly: error 0).
    """
    if values.size == 0:
        return 0.0, 0.0
    mag = np.abs(values)
    inv_c = float(mag.min())
    m = int(np.count_nonzero(mag == mag.min()))
    s = values.size - m
    if m <= 1 and values.size <= k:
        return 0.0, 0.0
    plug_in = m * (1.0 - min(1.0, m / max(1, d - s)))
    dev = m - (k - s)
    scale = inv_c * inv_c
    return dev * dev * scale, 2.0 * (plug_in * scale) ** 2


class RandKWangni(Estimator):
    """Rand-k-Wangni: keep coordinate j with ``p_j = min(1, c|x_j|)``, send ``x_j / p_j``."""

    name = "rand-k-wangni"
    traits = SchemeTraits(name, sends_indices=True)

    @property
    def values_per_message(self) -> int | None:
        return None

    def _count(self) -> tuple[int, str]:
        return self.d, "d"  # a bound: one value per kept coordinate

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        p = wangni_probabilities(x, self.k)
        u = uniforms(seed, TAG_WANGNI, self.d)
        keep = np.flatnonzero(u < p)
        return x[keep] / p[keep], keep.astype(np.int64)

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        beta = self._beta(len(batch))
        est = beta * _sparse_sum(batch, self.d)
        pairs = [wangni_error(m.values.astype(np.float64), self.k, self.d) for m in batch]
        error = per_message_error(est, [t for t, _ in pairs], [v for _, v in pairs])
        return DecodeResult(est, len(batch), beta, None, None, 0.0, error)

    def _beta(self, n_prime: int) -> float:
        return 1.0 / n_prime


class Induced(Estimator):
    """Induced compressor (Horvath & Richtarik) from Top-k/2 and Rand-k/2.

    Sends the ``k // 2`` largest-magnitude entries, plus ``k - k // 2`` random coordinates of
    the residual ``x - top(x)`` scaled by ``d / (k - k // 2)``; unbiased.
    """

    name = "induced"
    traits = SchemeTraits(name, sends_indices=True)

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        k_top = self.k // 2
        k_rand = self.k - k_top
        top = np.argsort(-np.abs(x), kind="stable")[:k_top].astype(np.int64)
        residual = x.copy()
        residual[top] = 0.0
        rand = sample_distinct(seed, TAG_INDUCED, k_rand, self.d)
        values = np.concatenate([x[top], residual[rand] * (self.d / k_rand)])
        return values, np.concatenate([top, rand])

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        beta = self._beta(len(batch))
        est = beta * _sparse_sum(batch, self.d)
        k_rand = self.k - self.k // 2
        # the Rand-k part: E||v - r||^2 = (d/k_r - 1)||r||^2, ||r||^2 ~ (k_r/d) ||v_r||^2
        terms = []
        for m in batch:
            v = m.values[self.k // 2:].astype(np.float64)
            terms.append((1.0 - k_rand / self.d) * float(v @ v))
        return DecodeResult(est, len(batch), beta, None, None, 0.0, per_message_error(est, terms))

    def _beta(self, n_prime: int) -> float:
        return 1.0 / n_prime
