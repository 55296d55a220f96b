"""Decoding a closed round (runs in a worker thread, off the event loop).

Pure functions of the committed submissions: rebuild every message's transform seed with
``derive_round_seed(client_seed, nonce, client_id, j)``, decode each of the ``m`` vectors
jointly (each decode also estimates its own error from the messages), estimate R from
the sketches, and in evaluation mode compare with the true mean
and with what Rand-k and Rand-k-Spatial(avg) would have given on the same vectors.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rpsagg import (
    DecodeResult,
    Encoded,
    Estimator,
    RandK,
    RandKSpatial,
    VectorCorrelationTracker,
)
from rpsagg.quantize import dequantize
from rpsagg.schemes import message_codebook
from rpsagg.spec import derive_round_seed
from rpsagg_server.readmodel.views import EstimatedError
from rpsagg_wire.v1.serde import Submission, VectorPayload

log = logging.getLogger("rpsagg.server")
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class DecodeOptions:
    """Where and how rounds are decoded (``--decode-*`` flags, ``--ray-address``)."""

    device: str | None = None
    threads: int | None = None
    backend: str = "local"
    ray_address: str | None = None

    @classmethod
    def from_config(cls, cfg: object) -> DecodeOptions:
        """The options of a :class:`~rpsagg_server.settings.serverconfig.ServerConfig`."""
        return cls(
            getattr(cfg, "decode_device", None),
            getattr(cfg, "decode_threads", None),
            getattr(cfg, "decode_backend", "local"),
            getattr(cfg, "ray_address", None),
        )

    def apply(self, estimator: Estimator) -> Estimator:
        """A copy of ``estimator`` with the device and thread options (or itself)."""
        if self.device is not None:
            with_device = getattr(estimator, "with_device", None)
            if with_device is None:
                raise ValueError(f"{estimator.name} has no device decode")
            estimator = with_device(self.device)
        if self.threads is not None:
            with_threads = getattr(estimator, "with_threads", None)
            if with_threads is not None:
                estimator = with_threads(self.threads)
        return estimator


@dataclass(frozen=True)
class DecodeOutcome:
    """What a round's decode produced.

    Attributes
    ----------
    estimate : ndarray, shape (m, d)
    n_prime : int
    beta, c : float
        beta and transform coefficient (c is NaN for non-spatial schemes); of vector 0.
    seconds : float
        Wall-clock time of the whole decode (all m vectors).
    r_hat : float
        Correlation estimated from vector 0's sketches (NaN when the scheme has none).
    eval_errors : tuple of four floats or None
        Squared errors of the estimate, Rand-k and Rand-k-Spatial(avg), summed over m, then
        ``||x_bar||^2`` summed over m (what relative errors divide by). Rounds stored by
        earlier versions have only the first three.
    estimated_error : EstimatedError or None
        The error estimated from the messages, summed over the m vectors (every mode); None
        for rounds stored by versions that did not record it.
    """

    estimate: FloatArray
    n_prime: int
    beta: float
    c: float
    seconds: float
    r_hat: float
    eval_errors: tuple[float, ...] | None
    estimated_error: EstimatedError | None = None


def _scales(v: VectorPayload, counts: Sequence[int] | None) -> NDArray[np.float32]:
    """A quantized vector's scales: its one ``scale``, or its block scales (``counts``: the
    values per block of a blockwise job)."""
    if counts is None:
        return np.array([v.scale], np.float32)
    return np.zeros(0, np.float32) if v.scales is None else v.scales


def payload_values(v: VectorPayload, codebook: str,
                   counts: Sequence[int] | None = None) -> NDArray[np.float32]:
    """The values a vector sends: its float32 values, or its codes decoded with its scale
    (with one scale per block where ``counts``, the values per block, is given;
    ``ValueError`` for codes outside the code book)."""
    if v.codes is None:
        return v.values
    return dequantize(codebook, v.codes, _scales(v, counts), v.value_bits, counts)


def messages(
    subs: Sequence[Submission], nonce: int, scheme: str, k: int, d: int, j: int,
    counts: Sequence[int] | None = None,
) -> list[Encoded]:
    """The ``Encoded`` messages of vector ``j`` of every submission, in the given order.

    ``counts``: the values per block scale of a blockwise job's quantized vectors
    (``WireProfile.scale_counts``); None where a quantized vector has one scale.
    """
    out = []
    codebook = message_codebook(scheme)
    for s in subs:
        v = s.vectors[j]
        seed = derive_round_seed(s.client_seed, nonce, s.client_id, j)
        if v.codes is None:
            out.append(Encoded(scheme, seed, k, d, v.values, v.indices))
        else:
            out.append(Encoded(scheme, seed, k, d, payload_values(v, codebook, counts),
                               v.indices, value_bits=v.value_bits, codes=v.codes,
                               scales=_scales(v, counts)))
    return out


def shadow_errors(
    refs: FloatArray, seeds: Sequence[Sequence[int]], n: int, k: int, d: int
) -> tuple[float, float]:
    """Squared errors Rand-k and Rand-k-Spatial(avg) would have had.

    Parameters
    ----------
    refs : ndarray, shape (n', m, d)
        The raw vectors.
    seeds : sequence of sequences
        ``seeds[i][j]``: the transform seed of client i's vector j (reused for the shadows).
    """
    rand_k = RandK(n, k, d)
    spatial = RandKSpatial(n, k, d, transform="avg")
    err_k = err_s = 0.0
    for j in range(refs.shape[1]):
        truth = refs[:, j].mean(axis=0)
        for est, acc in ((rand_k, 0), (spatial, 1)):
            msgs = [est.encode(refs[i, j], seeds[i][j]) for i in range(refs.shape[0])]
            e = est.decode(msgs) - truth
            if acc == 0:
                err_k += float(e @ e)
            else:
                err_s += float(e @ e)
    return err_k, err_s


def per_vector(estimator: Estimator, priors: Sequence[float | None] | None,
               m: int) -> list[Estimator]:
    """Vector j's estimator: ``estimator`` with the prior ``priors[j]`` where its transform is
    ``auto`` (``--transform auto`` with a scheme that has no transform decodes as before)."""
    transform = getattr(estimator, "transform", None)
    if priors is None or transform is None or transform.kind != "auto":
        return [estimator] * m
    return [estimator.with_prior(p) for p in priors]  # type: ignore[attr-defined]


def decode_round(
    estimator: Estimator,
    subs: Sequence[Submission],
    nonce: int,
    m: int,
    *,
    tracker: VectorCorrelationTracker | None,
    evaluate: bool,
    options: DecodeOptions | None = None,
    priors: Sequence[float | None] | None = None,
) -> DecodeOutcome:
    """Decode one round's submissions (already validated, sorted by client index).

    ``tracker`` (transform=auto) is updated with this round's R_hat of every vector.
    ``priors`` (transform=auto): vector j is decoded with ``estimator.with_prior(priors[j])``
    (None, or an estimator without a transform: every vector with ``estimator``).
    ``options``: device, threads and backend (local, or Ray tasks) of the decode. The
    outcome's ``beta``, ``c`` and ``r_hat`` are vector 0's; its ``estimated_error`` sums the
    m vectors' (:meth:`~rpsagg_server.readmodel.views.EstimatedError.of_slots`).
    """
    start = time.perf_counter()
    options = options or DecodeOptions()
    if priors is not None and len(priors) != m:
        raise ValueError(f"{len(priors)} priors for {m} vectors")
    estimators = [options.apply(e) for e in per_vector(estimator, priors, m)]
    estimator = estimators[0]
    n, k, d = estimator.n, estimator.k, estimator.d
    wire = estimator.wire
    batches = [messages(subs, nonce, wire.scheme, k, d, j, wire.scale_counts)
               for j in range(m)]
    results = decode_batches(estimators, batches, options)
    beta, c = results[0].beta, math.nan if results[0].c is None else results[0].c
    if wire.supports_r_hat:
        r_hat = sketch_r_hat(batches, tracker)
    else:
        r_hat = decoded_r_hat(results, batches, tracker)
    estimate = np.stack([info.estimate for info in results])
    # the shadows run Rand-k and Rand-k-Spatial at the job's k; schemes without a k
    # (EDEN, QSGD: every coordinate) have none
    shadows = wire.traits.takes_k
    errors = evaluation_errors(estimate, subs, nonce, n, k, d, shadows) if evaluate else None
    estimated = EstimatedError.of_slots([info.error_estimate for info in results])
    return DecodeOutcome(estimate, len(subs), beta, c, time.perf_counter() - start, r_hat, errors,
                         estimated)


def decode_batches(estimators: Sequence[Estimator], batches: list[list[Encoded]],
                   options: DecodeOptions) -> list[DecodeResult]:
    """Decode vector j's ``batches[j]`` with ``estimators[j]``: here, or on the Ray cluster
    of ``options`` (``backend="ray"``); results in order."""
    if options.backend == "ray":
        from rpsagg_server.decode import raydecode

        raydecode.connect(options.ray_address)
        return raydecode.decode_vectors(estimators, batches)
    return [e.decode_with_info(batch) for e, batch in zip(estimators, batches, strict=True)]


def sketch_r_hat(batches: Sequence[Sequence[Encoded]],
                 tracker: VectorCorrelationTracker | None) -> float:
    """Vector 0's R_hat from the messages' sketches (:func:`~rpsagg.estimate_correlation`);
    ``tracker`` (transform=auto) is updated with every vector's."""
    if tracker is not None:
        return tracker.update(batches)[0]
    from rpsagg import estimate_correlation

    return estimate_correlation(batches[0])


def decoded_r_hat(results: Sequence[DecodeResult], batches: Sequence[Sequence[Encoded]],
                  tracker: VectorCorrelationTracker | None) -> float:
    """Vector 0's R_hat from the decodes' own error estimates, for schemes whose messages
    :func:`~rpsagg.estimate_correlation` does not take (blockwise Rand-Proj-Spatial: the
    sum over blocks of each block's cross and norm terms,
    :attr:`rpsagg.ErrorEstimate.r_hat`); ``tracker`` folds in every vector's. NaN (and
    nothing folded) when a decode forms none (EDEN, QSGD, ...)."""
    found = [None if r.error_estimate is None else r.error_estimate.r_hat for r in results]
    r_hats = [r for r in found if r is not None]
    if not r_hats or len(r_hats) != len(found):
        return math.nan
    if tracker is not None:
        tracker.fold(r_hats, [len(batch) for batch in batches])
    return r_hats[0]


def evaluation_errors(
    estimate: FloatArray, subs: Sequence[Submission], nonce: int, n: int, k: int, d: int,
    shadows: bool = True,
) -> tuple[float, float, float, float]:
    """Squared errors of the estimate, Rand-k and Rand-k-Spatial(avg) against the references,
    and ``||x_bar||^2`` (what the relative errors divide by). ``shadows=False`` (EDEN, QSGD:
    no k to compare at) leaves the two shadow errors NaN.

    Best-effort: each is NaN when it cannot be computed (an overflow, a shadow decode that
    refuses its input); evaluation never fails the round or touches its estimate.
    """
    m = estimate.shape[0]
    nan = math.nan
    try:
        refs = np.stack([np.stack([v.reference for v in s.vectors]) for s in subs])  # type: ignore[misc]
        with np.errstate(over="ignore", invalid="ignore"):
            truth = refs.mean(axis=0)
            err = float(np.sum((estimate - truth) ** 2))
    except (ValueError, TypeError, FloatingPointError, ArithmeticError):
        log.warning("evaluation: squared error not computable", exc_info=True)
        return nan, nan, nan, nan
    err_k = err_s = nan
    try:
        if shadows:
            seeds = [[derive_round_seed(s.client_seed, nonce, s.client_id, j)
                      for j in range(m)] for s in subs]
            with np.errstate(over="ignore", invalid="ignore"):
                err_k, err_s = shadow_errors(refs, seeds, n, k, d)
    except (ValueError, TypeError, FloatingPointError, ArithmeticError):
        log.warning("evaluation: shadow errors not computable", exc_info=True)
        err_k = err_s = nan
    with np.errstate(over="ignore", invalid="ignore"):
        truth_sq = float(np.sum(truth ** 2))
    return (_finite_or_nan(err), _finite_or_nan(err_k), _finite_or_nan(err_s),
            _finite_or_nan(truth_sq))


def _finite_or_nan(x: float) -> float:
    return x if math.isfinite(x) else math.nan
