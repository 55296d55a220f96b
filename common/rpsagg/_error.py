"""The error of a round, estimated from the messages alone.

For the sketch families (Rand-k, Rand-k-Spatial, Rand-Proj-Spatial) the MSE given the
round's vectors is ``a A + b B`` (:mod:`rpsagg._error_coef`), with ``A = sum_i ||x_i||^2``
and ``B = sum_{i != l} <x_i, x_l>``, both estimated without bias from the sketches
(``D`` the transform's dimension, ``y_i`` the received values, ``A^T y = sum_i G_i^T y_i``)::

    A_hat = (D/k) sum_i ||y_i||^2
    B_hat = (D/k)^2 (||A^T y||^2 - sum_i ||y_i||^2)

so ``a A_hat + b B_hat`` is an unbiased estimate of the MSE and ``(A_hat + B_hat) / n^2`` one
of ``||x_bar||^2``. The decode already computes ``||A^T y||^2`` on its way
(:attr:`rpsagg._decode.SolveInfo.adjoint_sq`), so the estimate costs a few dot products.

Quantized values (``value_bits < 32``, uniform code book) carry rounding noise of variance
``step^2 / 6`` per value on average over the value's place in its cell (step ``2m / L``,
``m`` the message's scale); it inflates ``||y_i||^2`` by that much (removed from A_hat) and
adds ``sum of the noise variances * D (a + 1/n^2) / k`` to the MSE.

The other schemes are unbiased per message and independent across clients, so
``MSE = (1/n^2) sum_i E||x_hat_i - x_i||^2``, each term estimated from its message: QSGD
``||x_hat_i||^2 - scale^2`` (exactly unbiased: the scale is the float32 norm), EDEN
``D_b ||x_hat_i||^2`` (``D_b`` the Lloyd-Max distortion of N(0,1) at b bits), Rand-k-Wangni
``(m - (k - s))^2 / c^2`` (m values read ``1/c``, s are sent exactly;
``E[m] = k - s`` and the error is ``Var(m) / c^2``) and the induced compressor
``(1 - k_r/d) ||v_r||^2`` (its Rand-k part). ``||x_bar||^2`` is then
``||x_hat||^2 - MSE_hat``, unbiased for any unbiased estimator.

The standard error of the estimate is derived in ``docs/error-estimate.md``: for the sketch
families a Wishart model of ``Q_i = (D/k) G_i^T G_i`` (``Cov(u^T Q v, w^T Q z) ~ (1 - p)/k
(<u,w><v,z> + <u,z><v,w>)``, ``p = k/D``) with the per-client quantities replaced by their
estimates; the part of ``A_hat`` uses the sample variance of the squared sent values
(rows are sampled without replacement); for the per-message families the model of each
scheme or, where none is simple, the spread of the per-message terms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rpsagg._encoded import Encoded
from rpsagg._error_coef import ErrorCoefficients

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class ErrorEstimate:
    """The estimated error of one decode, from its messages alone.

    Attributes
    ----------
    squared_error : float
        Estimate of ``E||x_hat - x_bar||^2`` given the round's vectors (unbiased where the
        MSE's form is exact; not clipped, so it can be slightly negative by chance).
    squared_error_stderr : float
        Its standard error (``docs/error-estimate.md``); nan where it cannot be formed.
    mean_norm_squared : float
        Estimate of ``||x_bar||^2``.
    relative_error : float
        ``squared_error / mean_norm_squared`` (nan when the latter is not positive).
    norms : float or None
        ``A_hat``, the estimate of ``sum_i ||x_i||^2`` (sketch families).
    cross : float or None
        ``B_hat``, the estimate of ``sum_{i != l} <x_i, x_l>`` (sketch families).
    quantization : float
        The part of ``squared_error`` due to quantized values.
    method : str
        How the coefficients were obtained (``"exact"``, ``"free"``, ``"mc"``), or
        ``"per-message"``; blocks joined by ``+``.
    """

    squared_error: float
    squared_error_stderr: float
    mean_norm_squared: float
    relative_error: float
    norms: float | None = None
    cross: float | None = None
    quantization: float = 0.0
    method: str = ""

    @property
    def r_hat(self) -> float | None:
        """``cross / norms``: the correlation the sketches show (None where not formed)."""
        if self.norms is None or self.cross is None or self.norms == 0.0:
            return None
        return self.cross / self.norms

    @property
    def relative_error_stderr(self) -> float:
        """``squared_error_stderr / mean_norm_squared`` (nan when not positive)."""
        return _ratio(self.squared_error_stderr, self.mean_norm_squared)

    def as_dict(self) -> dict[str, float | str | None]:
        """The fields (and ``r_hat``, ``relative_error_stderr``) as plain values."""
        return {
            "squared_error": self.squared_error,
            "squared_error_stderr": self.squared_error_stderr,
            "mean_norm_squared": self.mean_norm_squared,
            "relative_error": self.relative_error,
            "relative_error_stderr": self.relative_error_stderr,
            "norms": self.norms, "cross": self.cross, "r_hat": self.r_hat,
            "quantization": self.quantization, "method": self.method,
        }  # fmt: skip


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0.0 and math.isfinite(den) else math.nan


def quantization_variance(msg: Encoded) -> float:
    """The summed rounding-noise variance of a message's values (0 for float32 values).

    Uniform code book: ``step^2 / 6`` per value, ``step = 2m / (2^b - 1)``: the variance
    ``(v - lo)(hi - v)`` of unbiased rounding averaged over the value's place in its cell.
    """
    if msg.value_bits >= 32 or msg.scales is None or msg.codes is None:
        return 0.0
    m = float(np.max(np.abs(msg.scales.astype(np.float64)))) if msg.scales.size else 0.0
    step = 2.0 * m / ((1 << msg.value_bits) - 1)
    return float(msg.codes.size) * step * step / 6.0


def sketch_error(
    y: FloatArray,
    adjoint_sq: float,
    dim: int,
    k: int,
    coef: ErrorCoefficients,
    *,
    qvar: FloatArray | None = None,
    keep: float = 1.0,
) -> ErrorEstimate:
    """The error estimate of a sketch-family decode.

    Parameters
    ----------
    y : ndarray, shape (n', k)
        The received values (float64; dequantized where quantized).
    adjoint_sq : float
        ``||sum_i G_i^T y_i||^2``.
    dim, k : int
        The transform's dimension D and the values per message.
    coef : ErrorCoefficients
        ``a`` and ``b`` for ``n'`` messages.
    qvar : ndarray, shape (n',), optional
        Each message's summed rounding-noise variance (:func:`quantization_variance`).
    keep : float
        Share of the D coordinates the estimate keeps (``d / d'`` for the padded SRHT, whose
        error spreads over the d' coordinates evenly; 1 otherwise).

    Returns
    -------
    ErrorEstimate
    """
    n = y.shape[0]
    scale = dim / k
    y_sq = np.einsum("ij,ij->i", y, y)
    noise = np.zeros(n) if qvar is None else np.asarray(qvar, dtype=np.float64)
    a_i = scale * (y_sq - noise)
    norms = float(a_i.sum())
    cross = scale * scale * (adjoint_sq - float(y_sq.sum()))
    quant = float(noise.sum()) * coef.value_gain(dim, k)
    sq = keep * (coef.squared_error(norms, cross) + quant)
    mean_sq = (norms + cross) / (n * n)
    stderr = keep * math.sqrt(max(0.0, _sketch_variance(y, a_i, norms, cross, dim, k, coef,
                                                          noise)))
    return ErrorEstimate(sq, stderr, mean_sq, _ratio(sq, mean_sq), norms, cross, keep * quant,
                         coef.method)


def _sketch_variance(y: FloatArray, a_i: FloatArray, norms: float, cross: float, dim: int,
                     k: int, coef: ErrorCoefficients, noise: FloatArray | None = None) -> float:
    """``Var(a A_hat + b B_hat)`` under the Wishart model (``docs/error-estimate.md``).

    Quantized values (``noise``: each message's summed rounding variance): the squared
    values no longer show the sketch's spread (at 1 bit every one is the scale squared), so
    ``Var(A_hat_i)`` is the larger of the sample's and the Gaussian model's ``2 (1-p)/k
    A_i^2``, plus the rounding's own ``(D/k)^2 (4 sum_j y_j^2 s^2 + 2 k s^4)`` with ``s^2``
    the per-value rounding variance."""
    a, b = coef.a, coef.b
    p = k / dim
    v = (1.0 - p) / k
    if norms <= 0.0:
        return 0.0
    share = a_i / norms
    c_i = cross * share  # <x_i, X_{-i}>, the cross terms in proportion to the norms
    x_i = np.maximum(0.0, norms + cross - a_i - 2.0 * c_i)  # ||X_{-i}||^2
    # Var(A_hat_i): rows are sampled without replacement from the rotated vector, so the
    # sample variance of the squared values (k >= 2) estimates it without a model
    model = 2.0 * v * a_i * a_i
    if k >= 2:
        sq = y * y
        var_a = (dim * dim) * (1.0 - p) / k * np.var(sq, axis=1, ddof=1)
    else:
        var_a = model
    if noise is not None and np.any(noise > 0):
        s2 = noise / k
        rounding = (dim / k) ** 2 * (4.0 * np.einsum("ij,ij->i", y, y) * s2 + 2.0 * k * s2 * s2)
        var_a = np.maximum(var_a, model) + rounding
    term = (a * a * var_a + v * (8.0 * a * b * a_i * c_i + 4.0 * b * b * (a_i * x_i + c_i * c_i)))
    pairs = 2.0 * b * b * v * v * dim * max(0.0, norms * norms - float(np.sum(a_i * a_i)))
    return float(np.sum(term)) + pairs


def per_message_error(estimate: FloatArray, terms: Sequence[float],
                      variances: Sequence[float] | None = None,
                      method: str = "per-message") -> ErrorEstimate:
    """The error estimate of a scheme whose messages are unbiased and independent.

    Parameters
    ----------
    estimate : ndarray
        The decoded mean.
    terms : sequence of float
        Each message's estimate of ``E||x_hat_i - x_i||^2``.
    variances : sequence of float, optional
        Each term's variance; when None, the spread of the terms across messages stands in
        (conservative where clients differ; nan for one message).
    method : str
        Recorded in :attr:`ErrorEstimate.method`.

    Returns
    -------
    ErrorEstimate
    """
    arr = np.asarray(terms, dtype=np.float64)
    n = arr.size
    sq = float(arr.sum()) / (n * n)
    if variances is not None:
        var = float(np.sum(variances)) / n**4
    elif n >= 2:
        var = float(np.var(arr, ddof=1)) * n / n**4
    else:
        var = math.nan
    mean_sq = float(estimate @ estimate) - sq
    return ErrorEstimate(sq, math.sqrt(var) if var == var else math.nan, mean_sq,
                         _ratio(sq, mean_sq), None, None, 0.0, method)


def combine(parts: Sequence[ErrorEstimate]) -> ErrorEstimate:
    """The error estimate of a decode made of independent parts (blocks): sums."""
    sq = sum(p.squared_error for p in parts)
    var = sum(p.squared_error_stderr ** 2 for p in parts)
    mean_sq = sum(p.mean_norm_squared for p in parts)
    norms = None if any(p.norms is None for p in parts) else sum(p.norms or 0.0 for p in parts)
    cross = None if any(p.cross is None for p in parts) else sum(p.cross or 0.0 for p in parts)
    methods = "+".join(sorted({p.method for p in parts}))
    return ErrorEstimate(sq, math.sqrt(var), mean_sq, _ratio(sq, mean_sq), norms, cross,
                         sum(p.quantization for p in parts), methods)


def zero_error(estimate: FloatArray) -> ErrorEstimate:
    """The error of an exact decode (``full``): zero."""
    mean_sq = float(estimate @ estimate)
    return ErrorEstimate(0.0, 0.0, mean_sq, 0.0 if mean_sq > 0 else math.nan, None, None, 0.0,
                         "exact")
