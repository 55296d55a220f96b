"""What an estimator's messages carry, and the check of one message against it.

Every estimator class declares its :class:`SchemeTraits` (what the scheme is, before any
estimator is built: which options it takes, whether it sends indices); every estimator
describes its messages with a :class:`WireProfile` (``Estimator.wire``: the scheme string,
the number of values per vector, the bits per value, the code book, the projection, the
oldest wire format that defines them). A server validates a received vector with
:meth:`WireProfile.validate`, sizes its requests with :attr:`WireProfile.max_values`, and
announces ``(spec_version, projection, block_size)`` to its clients; nothing outside the
estimator registry (``rpsagg._estimators``) matches scheme names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from rpsagg._quantize import dequantize
from rpsagg._versions import QUANTIZED, QUANTIZED_BLOCKWISE


@dataclass(frozen=True)
class SchemeTraits:
    """What a scheme (an ``--estimator`` name) is, before any estimator is built.

    Attributes
    ----------
    name : str
        The name :func:`~rpsagg.make_estimator` takes (``--estimator``).
    takes_k : bool
        The scheme has a per-client budget ``k`` (False: it sends every coordinate, and
        ``bits`` sets its size).
    takes_bits : bool
        ``bits=`` (bits per coordinate) is the scheme's size option.
    quantizable : bool
        ``value_bits < 32`` sends the k values as b-bit codes.
    takes_transform : bool
        The decoder applies a transform T (``transform=``, ``prior_r=``).
    takes_projection : bool
        A seeded projection (``projection=``, ``block_size=``, device and thread decode).
    sends_indices : bool
        Messages carry the coordinates of their values.
    supports_r_hat : bool
        The inter-client correlation can be estimated from the messages
        (:func:`~rpsagg.estimate_correlation`).
    """

    name: str
    takes_k: bool = True
    takes_bits: bool = False
    quantizable: bool = False
    takes_transform: bool = False
    takes_projection: bool = False
    sends_indices: bool = False
    supports_r_hat: bool = False


class Payload(Protocol):
    """One received vector (``rpsagg_wire.v1.serde.VectorPayload`` has this shape)."""

    @property
    def values(self) -> NDArray[np.float32]: ...

    @property
    def indices(self) -> NDArray[np.int64] | None: ...

    @property
    def codes(self) -> NDArray[np.uint32] | None: ...

    @property
    def value_bits(self) -> int: ...

    @property
    def scale(self) -> float: ...

    @property
    def scales(self) -> NDArray[np.float32] | None: ...


@dataclass(frozen=True)
class WireProfile:
    """What one estimator's messages carry (``Estimator.wire``).

    Attributes
    ----------
    traits : SchemeTraits
        The scheme's traits (its ``name`` is the ``--estimator`` name).
    scheme : str
        The message scheme (``rand-proj-spatial:dct``, ``rand-proj-spatial:block=256``, ...).
    d : int
        Dimension of the vectors (indices are in ``[0, d)``).
    max_values : int
        Values per vector: exactly this many, or at most this many when not
        ``exact_count``.
    exact_count : bool
        Whether every vector has exactly ``max_values`` values.
    count_name : str
        What ``max_values`` is called in messages: ``"k"``, ``"d"`` or ``"d'"``.
    value_bits : int
        Bits per sent value: 32 (float32) or the width of the codes.
    codebook : str
        The code book of quantized values (``rpsagg._quantize.CODEBOOKS``).
    projection : str
        ``"srht"``, ``"dct"`` or ``"hblocks"`` for a seeded projection, ``""`` for schemes
        without one.
    block_size : int
        Blockwise block size, 0 when not blockwise.
    spec_version : str
        The oldest wire format that defines these messages
        (:func:`rpsagg.spec.required_spec` of what they use).
    spec_feature : str
        What in these messages needs ``spec_version`` (a key of
        :data:`rpsagg.spec.FEATURE_SPEC`: the projection, ``"quantized values"``,
        ``"quantized blockwise values"``; ``""`` for a v1 message without a projection).
    transform : str or None
        Label of the decoder's transform T, None for schemes without one.
    scale_counts : tuple of int or None
        Quantized blockwise messages: the values of each block (``k_j``), which share one
        float32 scale per block (``Payload.scales``); None where a quantized message has
        the one ``Payload.scale`` (and for float32 values).
    """

    traits: SchemeTraits
    scheme: str
    d: int
    max_values: int
    exact_count: bool
    count_name: str
    value_bits: int
    codebook: str
    projection: str
    block_size: int
    spec_version: str
    transform: str | None
    scale_counts: tuple[int, ...] | None = None
    spec_feature: str = ""

    @property
    def sends_indices(self) -> bool:
        """Whether vectors carry the coordinates of their values."""
        return self.traits.sends_indices

    @property
    def spec_reason(self) -> str:
        """Why these messages need :attr:`spec_version`, naming :attr:`spec_feature` (what a
        refusal of an older claim says)."""
        feature = self.spec_feature
        if feature == QUANTIZED:
            what = f"{feature} ({self.value_bits}-bit codes of {self.scheme}) are"
        elif feature == QUANTIZED_BLOCKWISE:
            what = (f"{feature} ({self.value_bits}-bit codes of {self.scheme}, one scale per "
                    "block) are")
        elif feature:
            what = f"projection {feature!r} is"
        else:
            what = "these messages are"
        return f"{what} defined from {self.spec_version} on"

    @property
    def supports_r_hat(self) -> bool:
        """Whether R can be estimated from these messages."""
        return self.traits.supports_r_hat

    def values_of(self, payload: Payload) -> NDArray[np.float32]:
        """The values ``payload`` sends: its float32 values, or its codes decoded with its
        scale and this scheme's code book (``ValueError`` for codes outside the code book)."""
        if payload.codes is None:
            return payload.values
        if self.scale_counts is None:
            return dequantize(self.codebook, payload.codes,
                              np.array([payload.scale], np.float32), payload.value_bits)
        scales = np.zeros(0, np.float32) if payload.scales is None else payload.scales
        return dequantize(self.codebook, payload.codes, scales, payload.value_bits,
                          self.scale_counts)

    def validate(self, payload: Payload, what: str = "message") -> None:
        """Check that ``payload`` is a vector these messages can carry.

        Checks the bits per value, the value count, finite values (codes inside the code
        book, a finite non-negative scale, or one per block for blockwise messages; no
        scale beside float32 values) and,
        where the scheme sends them, one index in ``[0, d)`` per value.

        Parameters
        ----------
        payload : Payload
        what : str
            How the messages name the vector (e.g. ``"vectors[0]"``).

        Raises
        ------
        ValueError
            Saying which constraint ``what`` breaks.
        """
        name = self.traits.name
        if payload.value_bits != self.value_bits:
            raise ValueError(f"{what} sends {payload.value_bits}-bit values; this job's "
                             f"{name} sends {self.value_bits}-bit values")
        codes = payload.codes
        count = int(payload.values.size if codes is None else codes.size)
        if self.exact_count and count != self.max_values:
            raise ValueError(f"{what} has {count} values; expected "
                             f"{self.count_name}={self.max_values}")
        if not self.exact_count and count > self.max_values:
            raise ValueError(f"{what} has {count} values; at most "
                             f"{self.count_name}={self.max_values}")
        scales = payload.scales
        if codes is not None:
            if self.scale_counts is None:
                if scales is not None:
                    raise ValueError(f"{what} carries block scales but {self.scheme} sends "
                                     "one scale")
                if not (math.isfinite(payload.scale) and payload.scale >= 0):
                    raise ValueError(
                        f"{what}.scale must be finite and >= 0; got {payload.scale}")
            else:
                blocks = len(self.scale_counts)
                got = 0 if scales is None else int(scales.size)
                if got != blocks:
                    raise ValueError(f"{what} has {got} block scales; {self.scheme} sends "
                                     f"one per block ({blocks})")
                if payload.scale != 0:
                    raise ValueError(f"{what}.scale must be 0 beside block scales; got "
                                     f"{payload.scale}")
                assert scales is not None
                bad = ~(np.isfinite(scales) & (scales >= 0))
                if bad.any():
                    raise ValueError(f"{what}.scales must be finite and >= 0; got "
                                     f"{float(scales[np.argmax(bad)])}")
            try:
                with np.errstate(over="ignore"):  # an overflow is reported below
                    values = self.values_of(payload)
            except ValueError as exc:
                raise ValueError(f"{what}: {exc}") from None
            if not np.all(np.isfinite(values)):
                raise ValueError(f"{what}'s values overflow float32")
        else:
            if scales is not None:
                raise ValueError(f"{what} carries block scales but no codes")
            if payload.scale != 0:
                raise ValueError(f"{what}.scale must be 0 for float32 values (a scale goes "
                                 f"with codes); got {payload.scale}")
            if not np.all(np.isfinite(payload.values)):
                raise ValueError(f"{what}.values contains NaN or Inf")
        indices = payload.indices
        if not self.sends_indices:
            if indices is not None:
                raise ValueError(f"{what} carries indices but {name} sends none")
            return
        if indices is None:
            if count:
                raise ValueError(f"{what} needs indices for {name}")
            return
        if indices.size != count:
            raise ValueError(f"{what} has {indices.size} indices for {count} values")
        if indices.size and (indices.min() < 0 or indices.max() >= self.d):
            raise ValueError(f"{what} has indices outside [0, d) = [0, {self.d})")
