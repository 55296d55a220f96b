"""Input checks shared by the estimators: each failure names the broken constraint."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from rpsagg._encoded import Encoded
from rpsagg.spec import FEATURE_SPEC, QUANTIZED, SPEC_V1, SPEC_VERSIONS, check_seed


def check_int(name: str, value: object, minimum: int) -> int:
    """An integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def check_dims(n: object, k: object, d: object) -> tuple[int, int, int]:
    """Validate ``n >= 1``, ``d >= 1`` and ``1 <= k <= d``."""
    n_ = check_int("n", n, 1)
    d_ = check_int("d", d, 1)
    k_ = check_int("k", k, 1)
    if k_ > d_:
        raise ValueError(f"k must be in [1, d] = [1, {d_}]; got k={k_}")
    return n_, k_, d_


def check_matrix_args(seed: int, k: int, d: int) -> int:
    """The arguments of a dense projection matrix (``srht_matrix`` and its kin); returns
    the seed as checked by :func:`rpsagg.spec.check_seed`."""
    seed = check_seed(seed)
    if d < 1:
        raise ValueError(f"d must be >= 1; got {d}")
    if not 1 <= k <= d:
        raise ValueError(f"k must be in [1, d]; got k={k}, d={d}")
    return seed


def check_vector(x: ArrayLike, d: int, *, finite: bool = True) -> NDArray[np.float64]:
    """A float64 vector of shape (d,), finite unless ``finite=False`` skips that check.

    Encoders whose every output mixes every input (the SRHT) pass ``finite=False`` and check
    their output instead: a NaN or Inf anywhere in x makes every output non-finite.
    """
    arr = np.asarray(x, dtype=np.float64)
    if arr.shape != (d,):
        raise ValueError(f"x must have shape ({d},); got shape {arr.shape}")
    if not finite:
        return arr
    # One pass, no temporaries: NaN/Inf propagate into the sum; only a huge but finite x whose
    # sum overflows falls through to the exact element-wise check. (Not x @ x: a BLAS dot
    # wakes OpenBLAS's threads, which costs milliseconds on a loaded machine.)
    with np.errstate(over="ignore"):
        total = np.add.reduce(arr)
    if not np.isfinite(total) and not np.all(np.isfinite(arr)):
        raise ValueError("x must be finite (it contains NaN or Inf)")
    return arr


def check_batch(
    encoded: Sequence[Encoded],
    *,
    scheme: str,
    n: int,
    k: int,
    d: int,
    values_per_message: int | None,
    value_bits: int = 32,
    min_spec: str = SPEC_V1,
    scales_per_message: int = 1,
    spec_reason: str = "",
) -> list[Encoded]:
    """Messages that can be decoded together by one estimator.

    Checks: 1 <= count <= n, same scheme/k/d/value bits as the estimator, a spec version
    this decoder implements and no older than ``min_spec`` (the oldest that defines the
    scheme; ``spec_reason`` says why, as ``WireProfile.spec_reason``), distinct seeds, the
    expected number of finite values (and of scales, for quantized messages), and indices
    in range where they are sent.
    """
    batch = list(encoded)
    if not batch:
        raise ValueError("decode needs at least one message")
    if len(batch) > n:
        raise ValueError(f"decode got {len(batch)} messages but the estimator has n={n}")
    seen: set[int] = set()
    for pos, msg in enumerate(batch):
        if not isinstance(msg, Encoded):
            raise ValueError(f"message {pos} is not an Encoded (got {type(msg).__name__})")
        if msg.scheme != scheme:
            raise ValueError(
                f"mixed schemes in one decode: message {pos} is {msg.scheme!r}, expected {scheme!r}"
            )
        if msg.k != k or msg.d != d:
            raise ValueError(
                f"mixed k/d in one decode: message {pos} has k={msg.k}, d={msg.d}; "
                f"expected k={k}, d={d}"
            )
        if msg.spec_version not in SPEC_VERSIONS:
            raise ValueError(
                f"message {pos} uses spec {msg.spec_version!r}; this decoder implements "
                f"{', '.join(SPEC_VERSIONS)}"
            )
        quantized = FEATURE_SPEC[QUANTIZED]
        if msg.codes is not None and SPEC_VERSIONS.index(msg.spec_version) < SPEC_VERSIONS.index(
            quantized
        ):
            raise ValueError(
                f"message {pos} claims {msg.spec_version!r}, which has no {QUANTIZED} "
                f"(they need {quantized!r})"
            )
        if SPEC_VERSIONS.index(msg.spec_version) < SPEC_VERSIONS.index(min_spec):
            why = f": {spec_reason}" if spec_reason else ""
            raise ValueError(
                f"message {pos} claims {msg.spec_version!r}, which has no {scheme!r} (it "
                f"needs {min_spec!r}{why})"
            )
        if msg.scales is not None and msg.scales.size != scales_per_message:
            raise ValueError(
                f"message {pos} has {msg.scales.size} scales; expected {scales_per_message}"
            )
        if msg.value_bits != value_bits:
            raise ValueError(
                f"message {pos} has {msg.value_bits}-bit values; expected {value_bits}-bit"
            )
        seed = check_seed(msg.seed)
        if seed in seen:
            raise ValueError(f"the same seed appears twice in one decode: {seed}")
        seen.add(seed)
        if values_per_message is not None and msg.values.size != values_per_message:
            raise ValueError(
                f"message {pos} has {msg.values.size} values; expected {values_per_message}"
            )
        if not np.all(np.isfinite(msg.values)):
            raise ValueError(f"message {pos} has non-finite values")
        if msg.indices is not None:
            if msg.indices.size != msg.values.size:
                raise ValueError(
                    f"message {pos} has {msg.indices.size} indices for {msg.values.size} values"
                )
            if msg.indices.size and (msg.indices.min() < 0 or msg.indices.max() >= d):
                raise ValueError(f"message {pos} has indices outside [0, d) = [0, {d})")
    return batch
