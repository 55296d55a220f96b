"""The estimators: encode on clients, decode jointly on the server."""

from __future__ import annotations

import copy
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from rpsagg._auto import auto_c
from rpsagg._beta import BetaEstimate, rps_beta, spatial_beta
from rpsagg._decode import DEFAULT_RTOL, SolveInfo, joint_solve
from rpsagg._encoded import Encoded
from rpsagg._projection import (
    SCHEMES,
    encode,
    joint_operator,
    operator_dim,
    resolve_projection,
)
from rpsagg._quantize import check_value_bits, dequantize, quantize_uniform
from rpsagg._transform import Transform, parse_transform
from rpsagg._validation import check_batch, check_dims, check_vector
from rpsagg.spec import (
    TAG_INDUCED,
    TAG_WANGNI,
    check_seed,
    randk_indices,
    sample_distinct,
    uniforms,
)

FloatArray = NDArray[np.float64]

ESTIMATOR_NAMES = (
    "full",
    "rand-k",
    "rand-k-spatial",
    "rand-proj-spatial",
    "rand-k-wangni",
    "induced",
)
#: Quantizer baselines (``bits=``): every coordinate, rotated (EDEN) or not (QSGD), as codes.
QUANTIZER_NAMES = ("eden", "qsgd")
#: Estimators whose k values may be sent as b-bit codes (``value_bits``).
QUANTIZABLE = ("rand-k", "rand-k-spatial", "rand-proj-spatial")
SPATIAL = ("rand-k-spatial", "rand-proj-spatial")


@dataclass(frozen=True)
class DecodeResult:
    """An estimate with the details of how it was obtained.

    Attributes
    ----------
    estimate : ndarray, shape (d,)
        The estimate of the mean.
    n_prime : int
        Number of messages decoded.
    beta : float
        Unbiasing scalar used.
    c : float or None
        Transform coefficient used (spatial schemes).
    solve : SolveInfo or None
        Solver details (Rand-Proj-Spatial).
    seconds : float
        Wall-clock decode time.
    """

    estimate: FloatArray
    n_prime: int
    beta: float
    c: float | None
    solve: SolveInfo | None
    seconds: float


class Estimator(ABC):
    """A mean estimator for ``n`` clients with per-client budget ``k`` in dimension ``d``.

    Use :func:`make_estimator` to build one.
    """

    name: str = ""
    # True where every sent value depends on every coordinate of x (so a NaN/Inf in x shows
    # in the output and the input need not be scanned separately).
    _mixes_all_inputs: bool = False
    #: Bits per sent value: 32 sends float32; fewer sends codes (see ``rpsagg._quantize``).
    value_bits: int = 32
    #: The code book of quantized values (``rpsagg._quantize.CODEBOOKS``).
    codebook: str = "uniform"

    def __init__(self, n: int, k: int, d: int) -> None:
        self.n, self.k, self.d = check_dims(n, k, d)

    # -- public API ------------------------------------------------------------------------
    def encode(self, x: ArrayLike, seed: int) -> Encoded:
        """Compress ``x`` with the randomness derived from ``seed``.

        Parameters
        ----------
        x : array_like, shape (d,)
            Finite vector; computed in float64, sent as float32 (or as b-bit codes and a
            float32 scale when ``value_bits < 32``).
        seed : int
            In ``[0, 2^64)``; a fresh one per message.

        Returns
        -------
        Encoded
        """
        vec = check_vector(x, self.d, finite=not self._mixes_all_inputs)
        seed = check_seed(seed)
        values, indices = self._encode(vec, seed)
        if self._mixes_all_inputs and not np.all(np.isfinite(values)):
            check_vector(vec, self.d)  # raises the usual message for NaN/Inf in x
            raise ValueError("x is too large: its transform overflows float64")
        if self.value_bits == 32:
            with np.errstate(over="ignore"):
                sent = values.astype(np.float32)
            if not np.all(np.isfinite(sent)):  # docs/wire-format.md section 7: never send +-inf
                worst = float(np.max(np.abs(values)))
                raise ValueError(
                    f"x is too large: a value to send is {worst:.6g}, beyond binary32's largest "
                    f"finite value {float(np.finfo(np.float32).max):.8g}; scale x down"
                )
            return Encoded(self.name, seed, self.k, self.d, sent, indices)
        codes, scale = self._quantize(values, seed)
        scales = np.array([scale], dtype=np.float32)
        if not np.isfinite(scales[0]):
            raise ValueError("x is too large: its quantization scale overflows float32")
        return Encoded(
            self.name, seed, self.k, self.d,
            dequantize(self.codebook, codes, scales, self.value_bits), indices,
            value_bits=self.value_bits, codes=codes, scales=scales,
        )  # fmt: skip

    def decode(self, encoded: Sequence[Encoded]) -> FloatArray:
        """Unbiased estimate of the mean of the vectors behind ``encoded``.

        Parameters
        ----------
        encoded : sequence of Encoded
            Between 1 and ``n`` messages of this scheme with distinct seeds; beta and the
            transform are those for the number of messages given.

        Returns
        -------
        ndarray, shape (d,)
        """
        return self.decode_with_info(encoded).estimate

    def decode_with_info(self, encoded: Sequence[Encoded]) -> DecodeResult:
        """Like :meth:`decode`, with beta, the transform and solver details."""
        batch = check_batch(
            encoded,
            scheme=self.name,
            n=self.n,
            k=self.k,
            d=self.d,
            values_per_message=self.values_per_message,
            value_bits=self.value_bits,
        )
        start = time.perf_counter()
        result = self._decode(batch)
        return DecodeResult(
            result.estimate,
            result.n_prime,
            result.beta,
            result.c,
            result.solve,
            time.perf_counter() - start,
        )

    @property
    def beta_bar(self) -> float:
        """beta for all ``n`` clients."""
        return self.beta_for(self.n)

    def beta_for(self, n_prime: int) -> float:
        """beta when ``n_prime`` messages (``1 <= n_prime <= n``) are decoded together."""
        if isinstance(n_prime, bool) or not isinstance(n_prime, int | np.integer):
            raise ValueError(f"n_prime must be an integer; got {n_prime!r}")
        if not 1 <= n_prime <= self.n:
            raise ValueError(f"n_prime must be in [1, n] = [1, {self.n}]; got {n_prime}")
        return self._beta(int(n_prime))

    @property
    def values_per_message(self) -> int | None:
        """Number of floats per message (None when it varies)."""
        return self.k

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, k={self.k}, d={self.d}{self._bits_label()})"

    def _bits_label(self) -> str:
        return "" if self.value_bits == 32 else f", value_bits={self.value_bits}"

    # -- implementation --------------------------------------------------------------------
    def _set_value_bits(self, value_bits: int) -> None:
        self.value_bits = check_value_bits(value_bits)

    def _quantize(self, values: FloatArray, seed: int) -> tuple[NDArray[np.uint32], np.float32]:
        """Codes and scale of ``values`` (value_bits < 32): unbiased uniform rounding."""
        return quantize_uniform(values, self.value_bits, seed)

    @abstractmethod
    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        """Values (float64) and indices (or None)."""

    @abstractmethod
    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        """Decode validated messages."""

    @abstractmethod
    def _beta(self, n_prime: int) -> float:
        """beta for ``n_prime`` messages."""


def _sparse_sum(batch: list[Encoded], d: int) -> FloatArray:
    total = np.zeros(d)
    for msg in batch:
        assert msg.indices is not None
        np.add.at(total, msg.indices, msg.values.astype(np.float64))
    return total


class FullEstimator(Estimator):
    """No compression: every client sends its d floats; the decode is the plain mean."""

    name = "full"

    @property
    def values_per_message(self) -> int | None:
        return self.d

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        return x, None

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        total = np.sum([m.values.astype(np.float64) for m in batch], axis=0)
        beta = self._beta(len(batch))
        return DecodeResult(beta * total, len(batch), beta, None, None, 0.0)

    def _beta(self, n_prime: int) -> float:
        return 1.0 / n_prime


class RandK(Estimator):
    """Rand-k: k uniformly chosen coordinates, ``x_hat = d/(n k) sum_i E_i^T E_i x_i``."""

    name = "rand-k"

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
        return DecodeResult(beta * sums, len(batch), beta, None, None, 0.0)

    def _beta(self, n_prime: int) -> float:
        return self.d / (n_prime * self.k)


class _SpatialMixin:
    transform: Transform

    def _init_transform(self, transform: str | float, n: int, prior_r: float | None) -> None:
        self.transform = parse_transform(transform, n, prior_r)

    def with_prior(self, prior_r: float | None) -> Self:
        """A copy whose ``transform="auto"`` uses the prior correlation ``prior_r``."""
        if self.transform.kind != "auto":
            raise ValueError("with_prior needs an estimator built with transform='auto'")
        other = copy.copy(self)
        other.transform = parse_transform("auto", self.transform.n, prior_r)
        return other


class RandKSpatial(RandK, _SpatialMixin):
    """Rand-k-Spatial: Rand-k's encoding, ``x_hat(j) = beta / T(M_j) sum_{i sent j} x_i(j)``."""

    name = "rand-k-spatial"

    def __init__(
        self, n: int, k: int, d: int, transform: str | float = "avg", prior_r: float | None = None
    ) -> None:
        super().__init__(n, k, d)
        self._init_transform(transform, self.n, prior_r)

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        sums, counts = self._scatter(batch)
        n_prime = len(batch)
        c = self.transform.c_for(n_prime)
        beta = self._beta(n_prime)
        t = (1.0 - c) + c * counts
        est = np.where(counts > 0, beta * sums / np.where(counts > 0, t, 1.0), 0.0)
        return DecodeResult(est, n_prime, beta, c, None, 0.0)

    def _beta(self, n_prime: int) -> float:
        return spatial_beta(n_prime, self.k, self.d, self.transform.c_for(n_prime))

    def __repr__(self) -> str:
        return (
            f"RandKSpatial(n={self.n}, k={self.k}, d={self.d}, T={self.transform.label()}"
            f"{self._bits_label()})"
        )


class RandProjSpatial(Estimator, _SpatialMixin):
    """Rand-Proj-Spatial with a seeded projection: ``x_hat = beta T(S)^+ sum_i G_i^T y_i``.

    Parameters
    ----------
    n, k, d : int
        Clients, per-client budget, dimension.
    transform : {"avg", "max", "one", "auto"} or float
        T; a float R in [0, n-1] selects corr(R). ``auto`` with a prior takes the c of
        :func:`rpsagg._auto.auto_c` (continuous; kept away from 1 where nk is close to d').
    prior_r : float, optional
        Prior correlation for ``transform="auto"``.
    method : {"auto", "exact", "cg"}
        Joint solver.
    rtol : float
        Relative residual target of the matrix-free solver.
    projection : {"auto", "srht", "dct"}
        ``"srht"``: the SRHT on x zero-padded to ``d' = 2^ceil(log2 d)`` (scheme
        ``rand-proj-spatial``); ``"dct"``: the subsampled randomized DCT on x itself (scheme
        ``rand-proj-spatial:dct``, wire format ``rpsagg-seed-v2``); ``"auto"``: the SRHT when
        d is a power of two, the DCT otherwise.
    device : str, optional
        Decode on this PyTorch device (``"cuda"``, ``"cuda:1"``, ``"cpu"``; needs the
        ``rpsagg[torch]`` extra) in float64; None (default) decodes with numpy. Encode is
        always numpy. The device decode is for the SRHT projection.
    threads : int, optional
        CPU threads of the numpy SRHT decode (default: every core this process may use);
        the estimate does not depend on it, bit for bit.
    """

    name = "rand-proj-spatial"
    _mixes_all_inputs = True

    def __init__(
        self,
        n: int,
        k: int,
        d: int,
        transform: str | float = "avg",
        prior_r: float | None = None,
        method: str = "auto",
        rtol: float = DEFAULT_RTOL,
        projection: str = "auto",
        device: str | None = None,
        threads: int | None = None,
    ) -> None:
        super().__init__(n, k, d)
        self._init_transform(transform, self.n, prior_r)
        if threads is not None and (isinstance(threads, bool) or int(threads) < 1):
            raise ValueError(f"threads must be an integer >= 1; got {threads!r}")
        self.threads = None if threads is None else int(threads)
        if device is not None:
            from rpsagg._torch import resolve_device

            device = str(resolve_device(device))
        if method not in ("auto", "exact", "cg"):
            raise ValueError(f"method must be 'auto', 'exact' or 'cg'; got {method!r}")
        if not 0 < rtol < 1:
            raise ValueError(f"rtol must be in (0, 1); got {rtol}")
        self.method = method
        self.rtol = rtol
        self.projection = resolve_projection(projection, self.d)
        self.name = SCHEMES[self.projection]
        #: The dimension the projection acts in: d' (SRHT, padded) or d (DCT).
        self.d_pad = operator_dim(self.projection, self.d)
        if device is not None and self.projection != "srht":
            raise ValueError(f"device decoding supports the SRHT projection; this estimator "
                             f"uses {self.projection!r} (d = {self.d}); pass projection='srht' "
                             "to decode on a device")
        self.device = device

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        return encode(self.projection, x, seed, self.k), None

    def _decode(self, batch: list[Encoded], beta: float | None = None) -> DecodeResult:
        """Decode; ``beta`` (from :meth:`beta_for`) may be given by a caller that computed
        it once for several decodes (the Ray backend passes it to its tasks)."""
        n_prime = len(batch)
        seeds = [m.seed for m in batch]
        y = np.stack([m.values.astype(np.float64) for m in batch])
        c = self._c_for(n_prime)
        if self.device is not None:
            from rpsagg._torch import device_joint_solve

            xt, info = device_joint_solve(seeds, y, self.k, self.d_pad, c, device=self.device,
                                          method=self.method, rtol=self.rtol)
        else:
            op = joint_operator(self.projection, seeds, self.k, self.d_pad,
                                threads=self.threads)
            xt, info = joint_solve(op, y, c, method=self.method, rtol=self.rtol)
        beta = self._beta(n_prime) if beta is None else beta
        return DecodeResult(beta * xt[: self.d], n_prime, beta, c, info, 0.0)

    def _c_for(self, n_prime: int) -> float:
        """c of T for ``n_prime`` messages.

        ``auto`` with a prior: :func:`rpsagg._auto.auto_c` of the prior's correlation
        fraction at ``n_prime`` clients, a pure function of ``(n', k, d', R)``, so a server
        that persisted the prior derives the same c; otherwise :meth:`Transform.c_for`.
        """
        t = self.transform
        if t.kind == "auto" and t.r is not None and n_prime > 1:
            frac = min(1.0, max(0.0, t.r / (t.n - 1))) if t.n > 1 else 0.0
            return auto_c(n_prime, self.k, self.d_pad, frac * (n_prime - 1))
        return t.c_for(n_prime)

    def _beta(self, n_prime: int) -> float:
        return self._beta_estimate(n_prime).beta

    def _beta_estimate(self, n_prime: int) -> BetaEstimate:
        c = self._c_for(n_prime)
        return rps_beta(n_prime, self.k, self.d_pad, c, projection=self.projection)

    def with_device(self, device: str | None) -> Self:
        """A copy that decodes on ``device`` (a PyTorch device, or None for numpy)."""
        other = copy.copy(self)
        if device is not None:
            from rpsagg._torch import resolve_device

            device = str(resolve_device(device))
        other.device = device
        return other

    def with_threads(self, threads: int | None) -> Self:
        """A copy whose numpy decode runs ``threads`` threads (None: every core)."""
        if threads is not None and (isinstance(threads, bool) or int(threads) < 1):
            raise ValueError(f"threads must be an integer >= 1; got {threads!r}")
        other = copy.copy(self)
        other.threads = None if threads is None else int(threads)
        return other

    def beta_details(self, n_prime: int | None = None) -> BetaEstimate:
        """The :class:`~rpsagg._beta.BetaEstimate` behind ``beta_for(n_prime)``."""
        n_prime = self.n if n_prime is None else n_prime
        self.beta_for(n_prime)  # validates n_prime
        return self._beta_estimate(n_prime)

    def __repr__(self) -> str:
        return (
            f"RandProjSpatial(n={self.n}, k={self.k}, d={self.d}, T={self.transform.label()}, "
            f"projection={self.projection}{self._bits_label()})"
        )


def wangni_probabilities(x: FloatArray, k: int) -> FloatArray:
    """Keep probabilities ``p_j = min(1, c |x_j|)`` with ``sum_j p_j = k`` (Wangni et al.).

    When x has at most k non-zero entries every one of them is kept (p = 1).
    """
    mag = np.abs(x)
    nnz = int(np.count_nonzero(mag))
    if nnz <= k:
        return (mag > 0).astype(np.float64)
    order = np.argsort(-mag, kind="stable")
    a = mag[order]
    suffix = np.cumsum(a[::-1])[::-1]  # suffix[j] = sum_{i >= j} a_i
    j = np.arange(k)
    scale = (k - j) / suffix[:k]
    ok = a[:k] * scale <= 1.0
    first = int(np.argmax(ok))  # j = k-1 always satisfies the condition when nnz > k
    c = scale[first]
    return np.minimum(1.0, c * mag)


class RandKWangni(Estimator):
    """Rand-k-Wangni: keep coordinate j with ``p_j = min(1, c|x_j|)``, send ``x_j / p_j``."""

    name = "rand-k-wangni"

    @property
    def values_per_message(self) -> int | None:
        return None

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        p = wangni_probabilities(x, self.k)
        u = uniforms(seed, TAG_WANGNI, self.d)
        keep = np.flatnonzero(u < p)
        return x[keep] / p[keep], keep.astype(np.int64)

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        beta = self._beta(len(batch))
        return DecodeResult(beta * _sparse_sum(batch, self.d), len(batch), beta, None, None, 0.0)

    def _beta(self, n_prime: int) -> float:
        return 1.0 / n_prime


class Induced(Estimator):
    """Induced compressor (Horvath & Richtarik) from Top-k/2 and Rand-k/2.

    Sends the ``k // 2`` largest-magnitude entries, plus ``k - k // 2`` random coordinates of
    the residual ``x - top(x)`` scaled by ``d / (k - k // 2)``; unbiased.
    """

    name = "induced"

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
        return DecodeResult(beta * _sparse_sum(batch, self.d), len(batch), beta, None, None, 0.0)

    def _beta(self, n_prime: int) -> float:
        return 1.0 / n_prime


def make_estimator(
    name: str,
    *,
    n: int,
    k: int | None = None,
    d: int,
    transform: str | float = "avg",
    prior_r: float | None = None,
    method: str = "auto",
    rtol: float = DEFAULT_RTOL,
    block_size: int | None = None,
    bits: int | None = None,
    value_bits: int = 32,
    projection: str = "auto",
    device: str | None = None,
    threads: int | None = None,
) -> Estimator:
    """Build an estimator by name.

    Parameters
    ----------
    name : str
        ``"full"``, ``"rand-k"``, ``"rand-k-spatial"``, ``"rand-proj-spatial"``,
        ``"rand-k-wangni"``, ``"induced"``, ``"eden"`` or ``"qsgd"``.
    n, k, d : int
        Number of clients (``>= 1``), per-client budget (``1 <= k <= d``; not used by
        ``"eden"`` and ``"qsgd"``, which send every coordinate), dimension.
    transform : {"avg", "max", "one", "auto"} or float
        Spatial schemes only. A float R in ``[0, n-1]`` is the corr(R) transform;
        ``"auto"`` uses corr(``prior_r``), or avg while there is no prior.
    prior_r : float, optional
        Prior correlation for ``transform="auto"`` (e.g. a smoothed
        :func:`estimate_correlation` of earlier rounds); clipped to ``[0, n-1]``.
    method : {"auto", "exact", "cg"}
        Rand-Proj-Spatial's joint solver.
    rtol : float
        Relative residual target of the matrix-free solver.
    block_size : int, optional
        Rand-Proj-Spatial only: a power of two; encode and decode each block of
        ``block_size`` coordinates independently (for very large d; see
        ``docs/performance.md``). The message scheme becomes
        ``rand-proj-spatial:block=<block_size>``.
    bits : int, optional
        ``"eden"`` (1, 2, 4 or 8 bits per coordinate of the rotated vector) and ``"qsgd"``
        (``s = 2^bits - 1`` levels plus a sign bit, bits in [1, 16]) only; required there.
    value_bits : int
        ``"rand-k"``, ``"rand-k-spatial"`` and ``"rand-proj-spatial"``: bits per sent value
        (1..32); below 32 the k values are sent as unbiased stochastically rounded b-bit
        codes with one float32 scale per message (``rpsagg._quantize``).
    projection : {"auto", "srht", "dct"}
        Rand-Proj-Spatial only: the seeded projection (see :class:`RandProjSpatial`;
        ``"auto"``: the SRHT when d is a power of two, the randomized DCT otherwise). The
        blockwise estimator always uses the SRHT.
    device : str, optional
        Rand-Proj-Spatial only: decode on this PyTorch device (``"cuda"``, ``"cpu"``;
        the ``rpsagg[torch]`` extra). None (default): numpy.
    threads : int, optional
        Rand-Proj-Spatial only: CPU threads of the numpy decode (default: all cores).

    Returns
    -------
    Estimator
    """
    if name in ("eden", "qsgd"):
        if transform != "avg" or prior_r is not None or block_size is not None or (
            projection != "auto" or device is not None or threads is not None
        ):
            raise ValueError(
                f"transform, prior_r, block_size, projection, device and threads do not apply "
                f"to {name!r}"
            )
        if value_bits != 32:
            raise ValueError(f"{name!r} takes bits=, not value_bits=")
        if bits is None:
            raise ValueError(f"{name!r} needs bits=")
        if k is not None and k != d:
            raise ValueError(f"{name!r} sends every coordinate; leave k out (or k = d)")
        if name == "eden":
            from rpsagg._eden import Eden

            return Eden(n, d, bits)
        from rpsagg._qsgd import Qsgd

        return Qsgd(n, d, bits)
    if bits is not None:
        raise ValueError(f"bits applies to 'eden' and 'qsgd'; use value_bits for {name!r}")
    if k is None:
        raise ValueError(f"{name!r} needs k=")
    if value_bits != 32 and name not in (*QUANTIZABLE, SCHEMES["dct"]):
        raise ValueError(f"value_bits applies to {', '.join(QUANTIZABLE)}, not {name!r}")
    est = _make_float_estimator(
        name, n, k, d, transform, prior_r, method, rtol, block_size, projection, device, threads
    )
    if value_bits != 32:
        if block_size is not None:
            raise ValueError("value_bits is not supported with block_size")
        est._set_value_bits(value_bits)
    return est


def _make_float_estimator(
    name: str,
    n: int,
    k: int,
    d: int,
    transform: str | float,
    prior_r: float | None,
    method: str,
    rtol: float,
    block_size: int | None,
    projection: str,
    device: str | None,
    threads: int | None,
) -> Estimator:
    if name == SCHEMES["dct"]:  # the message scheme names its projection
        name, projection = "rand-proj-spatial", resolve_projection("dct", d)
    if projection != "auto" and name != "rand-proj-spatial":
        raise ValueError(f"projection applies to rand-proj-spatial only, not {name!r}")
    if block_size is not None:
        if name != "rand-proj-spatial":
            raise ValueError(f"block_size applies to rand-proj-spatial only, not {name!r}")
        if projection not in ("auto", "srht"):
            raise ValueError(
                f"the blockwise estimator uses the SRHT; got projection={projection!r}"
            )
        from rpsagg._blockwise import BlockwiseRandProjSpatial

        return BlockwiseRandProjSpatial(
            n, k, d, block_size, transform, prior_r, method, rtol, device=device,
            threads=threads,
        )
    if name == "rand-proj-spatial":
        return RandProjSpatial(n, k, d, transform, prior_r, method, rtol, projection,
                               device=device, threads=threads)
    if device is not None or threads is not None:
        raise ValueError(f"device and threads apply to rand-proj-spatial only, not {name!r}")
    if name == "rand-k-spatial":
        return RandKSpatial(n, k, d, transform, prior_r)
    if transform != "avg" or prior_r is not None:
        raise ValueError(f"transform applies to the spatial estimators only, not {name!r}")
    simple: dict[str, type[Estimator]] = {
        "full": FullEstimator,
        "rand-k": RandK,
        "rand-k-wangni": RandKWangni,
        "induced": Induced,
    }
    if name not in simple:
        raise ValueError(
            f"unknown estimator {name!r}; expected one of "
            f"{', '.join(ESTIMATOR_NAMES + QUANTIZER_NAMES)}"
        )
    return simple[name](n, k, d)
