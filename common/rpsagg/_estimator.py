"""The estimator interface: encode on clients, decode jointly on the server.

:class:`Estimator` is the base of every scheme (``rpsagg._coordinates``, ``rpsagg._spatial``,
``rpsagg._blockwise``, ``rpsagg._eden``, ``rpsagg._qsgd``); :func:`rpsagg.make_estimator`
(``rpsagg._estimators``, the registry) builds one by name. Each class declares its
:class:`~rpsagg._wireprofile.SchemeTraits`, and every estimator describes its messages
with :attr:`Estimator.wire`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from rpsagg._decode import SolveInfo
from rpsagg._encoded import Encoded
from rpsagg._error import ErrorEstimate
from rpsagg._quantize import check_value_bits, dequantize, quantize_uniform
from rpsagg._validation import check_batch, check_dims, check_vector
from rpsagg._wireprofile import Payload, SchemeTraits, WireProfile
from rpsagg.spec import check_seed, message_features, required_spec

FloatArray = NDArray[np.float64]


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
    error_estimate : ErrorEstimate or None
        The estimated error of this decode from its messages alone
        (:class:`~rpsagg._error.ErrorEstimate`: squared and relative error, their standard
        error, ``||x_bar||^2``); :meth:`Estimator.decode_with_info` always sets it.
    """

    estimate: FloatArray
    n_prime: int
    beta: float
    c: float | None
    solve: SolveInfo | None
    seconds: float
    error_estimate: ErrorEstimate | None = None


class Estimator(ABC):
    """A mean estimator for ``n`` clients with per-client budget ``k`` in dimension ``d``.

    Use :func:`make_estimator` to build one.
    """

    name: str = ""
    #: What the scheme is (options it takes, whether it sends indices); see
    #: :class:`~rpsagg._wireprofile.SchemeTraits`.
    traits: ClassVar[SchemeTraits]
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
        codes, scales = self._quantize_message(values, seed)
        if not np.all(np.isfinite(scales)):
            raise ValueError("x is too large: its quantization scale overflows float32")
        return Encoded(
            self.name, seed, self.k, self.d,
            dequantize(self.codebook, codes, scales, self.value_bits, self.scale_counts),
            indices, value_bits=self.value_bits, codes=codes, scales=scales,
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
        """Like :meth:`decode`, with beta, the transform, solver details and the estimated
        error of the decode (:attr:`DecodeResult.error_estimate`)."""
        wire = self.wire
        batch = check_batch(
            encoded,
            scheme=self.name,
            n=self.n,
            k=self.k,
            d=self.d,
            values_per_message=self.values_per_message,
            value_bits=self.value_bits,
            min_spec=wire.spec_version,
            spec_reason=wire.spec_reason,
            scales_per_message=1 if self.scale_counts is None else len(self.scale_counts),
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
            result.error_estimate,
        )

    def predicted_relative_error(self, r: float) -> float:
        """The relative error ``E||x_hat - x_bar||^2 / ||x_bar||^2`` this configuration is
        predicted to have at correlation ``R = sum_{i != l} <x_i, x_l> / sum_i ||x_i||^2``
        with all n clients (for planning: choosing k, bits; ``docs/error-estimate.md``).

        Parameters
        ----------
        r : float
            The correlation, in ``[-1, n - 1]`` (0: orthogonal vectors, n - 1: identical).

        Returns
        -------
        float

        Raises
        ------
        NotImplementedError
            For the data-adaptive schemes (rand-k-wangni, induced), whose error depends on
            the vectors' shape, not on R alone.
        """
        raise NotImplementedError(
            f"{self.name}: the predicted error depends on the vectors' shape, not on R alone"
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
    def scale_counts(self) -> tuple[int, ...] | None:
        """Values per float32 scale of a quantized message, in order: None for one scale
        (every scheme but blockwise Rand-Proj-Spatial, which has one per block)."""
        return None

    @property
    def values_per_message(self) -> int | None:
        """Number of floats per message (None when it varies)."""
        return self.k

    @property
    def wire(self) -> WireProfile:
        """What this estimator's messages carry (see :class:`~rpsagg._wireprofile.WireProfile`)."""
        count, count_name = self._count()
        projection = str(getattr(self, "projection", ""))
        block_size = int(getattr(self, "block_size", 0))
        # the least version that defines what these messages use (rpsagg.spec.FEATURE_SPEC)
        spec, needs = required_spec(message_features(projection, self.value_bits, block_size))
        transform = getattr(self, "transform", None)
        return WireProfile(
            traits=self.traits, scheme=self.name, d=self.d, max_values=count,
            exact_count=self.values_per_message is not None, count_name=count_name,
            value_bits=self.value_bits, codebook=self.codebook, projection=projection,
            block_size=block_size, spec_version=spec, spec_feature=needs,
            scale_counts=self.scale_counts if self.value_bits < 32 else None,
            transform=None if transform is None else str(transform.label()),
        )  # fmt: skip

    def validate(self, payload: Payload, what: str = "message") -> None:
        """Check one received vector against :attr:`wire` (``ValueError`` saying why not)."""
        self.wire.validate(payload, what)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, k={self.k}, d={self.d}{self._bits_label()})"

    def _bits_label(self) -> str:
        return "" if self.value_bits == 32 else f", value_bits={self.value_bits}"

    # -- implementation --------------------------------------------------------------------
    def _set_value_bits(self, value_bits: int) -> None:
        self.value_bits = check_value_bits(value_bits)

    def _count(self) -> tuple[int, str]:
        """Values per vector (exact, or a bound when ``values_per_message`` is None) and
        what messages call that number."""
        return self.k, "k"

    def _quantize_message(
        self, values: FloatArray, seed: int
    ) -> tuple[NDArray[np.uint32], NDArray[np.float32]]:
        """Codes and scales (value_bits < 32): :meth:`_quantize`'s one scale by default."""
        codes, scale = self._quantize(values, seed)
        return codes, np.array([scale], dtype=np.float32)

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
