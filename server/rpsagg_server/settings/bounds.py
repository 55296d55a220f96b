"""The ranges settings must keep to, from where their values go.

A setting that reaches a protobuf field, a SQLite integer or a deadline is checked against
that range when the server starts (a flag: one line, exit 2) and when a job is created
(``POST /api/jobs``: ``400``), so that no value accepted there fails later, at every
``GetRound`` or at the first decode:

- ``n``, ``k``, ``d``, ``k_min``, ``k_max``, ``block_size``, ``min_clients`` and ``m`` (the
  ``mean_vectors`` or kmeans ``centroids``) are ``uint32`` fields of ``JoinReply`` and
  ``RoundInfo``: at most :data:`UINT32_MAX`;
- ``rounds`` is ``RoundInfo.total_rounds`` (``uint64``) and the round ids are SQLite integers
  (signed 64 bits): at most :data:`INT64_MAX`, as is every other integer setting;
- ``max_request_bytes`` is gRPC's message size option, a C ``int``: at most
  :data:`INT32_MAX`;
- durations in seconds (:data:`SECONDS`) end in deadlines sent as ``int64`` Unix
  milliseconds (``RoundInfo.deadline_unix_ms``) or kept by the event loop: at most
  :data:`MAX_SECONDS` (2^53 s), which keeps any deadline before the year 10,000 in range;
- every number is finite.
"""

from __future__ import annotations

import math

#: the largest value of a protobuf ``uint32`` field
UINT32_MAX = 2**32 - 1
#: the largest C ``int`` (gRPC's message size options)
INT32_MAX = 2**31 - 1
#: the largest SQLite integer (and protobuf ``int64``)
INT64_MAX = 2**63 - 1
#: the largest integer up to which every integer is exact as a ``double``
DOUBLE_EXACT = 2**53
#: the longest duration in seconds: a deadline ``time.time() + it`` stays a whole number of
#: seconds as a ``double``, and in milliseconds it fits an ``int64`` until the year 10,000
#: (2^53 s + that date is 9.01e18 ms, below 2^63 - 1 = 9.22e18 with room for rounding)
MAX_SECONDS = float(DOUBLE_EXACT)

#: the integer settings held to a range narrower than :data:`INT64_MAX`
INT_BOUNDS: dict[str, int] = {
    **dict.fromkeys(("n", "k", "d", "k_min", "k_max", "block_size", "min_clients",
                     "mean_vectors", "centroids", "max_d", "bits", "value_bits"), UINT32_MAX),
    "max_request_bytes": INT32_MAX,
}
#: the settings that are durations in seconds
SECONDS = frozenset({"round_timeout", "drain", "linger", "http_header_timeout",
                     "grpc_handshake_timeout", "grpc_idle_timeout"})


def check_range(name: str, value: object) -> None:
    """Refuse an integer or a finite float setting outside its range (bools, strings and
    non-finite floats pass: :func:`check_finite` takes the last).

    Parameters
    ----------
    name : str
        The setting's name (``round_timeout``); messages spell it as the flag.
    value : object
        Its value.

    Raises
    ------
    ValueError
        One line naming the flag, the bound and the value.
    """
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        top = INT_BOUNDS.get(name, INT64_MAX)
        if abs(value) > top:
            raise ValueError(f"{flag} must be at most {top} in magnitude (what its field "
                             f"holds); got {_short(value)}")
    elif isinstance(value, float) and name in SECONDS and MAX_SECONDS < abs(value) < math.inf:
        raise ValueError(f"{flag} must be at most 2^53 = {MAX_SECONDS:.0f} seconds (a "
                         f"deadline in int64 milliseconds); got {value:g}")


def check_finite(name: str, value: object) -> None:
    """Refuse a float setting that is not finite (``ValueError``, one line)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"--{name.replace('_', '-')} must be a finite number; got {value}")


def _short(value: int) -> str:
    """An integer as its digits, or a huge one as its power of two (one short line)."""
    bits = value.bit_length()
    return str(value) if bits <= 64 else f"{'-' if value < 0 else ''}about 2^{bits - 1}"
