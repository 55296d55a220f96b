"""First occurrences among drawn candidates: the vectorised core of ``spec.sample_distinct``,
and the per-thread scratch arrays of the stream code.

``sample_distinct`` draws candidates in batches; the first ``k`` distinct ones below the bound,
in draw order, are its result. :func:`first_accepted` finds their positions in a batch, by a
scatter into a table (linear) or by one sort, with identical results (``tests/unit/test_spec.py``
checks both against the plain-Python reference).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

_scratch_local = threading.local()
_SCRATCH_MAX = 1 << 22  # entries; larger requests get a fresh array


def scratch(name: str, dtype: type, size: int, *, fill_counter: bool = False) -> NDArray[Any]:
    """A per-thread array of ``size`` entries kept between calls (contents undefined unless
    ``fill_counter``, which makes it ``1, 2, ..., size``)."""
    kept: NDArray[Any] | None = None if size > _SCRATCH_MAX else getattr(_scratch_local, name, None)
    if kept is None or kept.size < size:
        fresh: NDArray[Any] = np.empty(size if size > _SCRATCH_MAX else max(size, 1024), dtype)
        if fill_counter:
            fresh[:] = np.arange(1, fresh.size + 1, dtype=dtype)
        if size > _SCRATCH_MAX:  # not worth keeping per thread
            return fresh
        kept = fresh
        setattr(_scratch_local, name, kept)
    return kept[:size]


# The scatter path of first_accepted keeps one int32 "first position" table of length
# ``bound`` per thread; above this bound (16 MiB of table) the sort path is used instead.
_SCATTER_MAX_BOUND = 1 << 22
# Below this many candidates one small sort is as fast as touching the table.
_SCATTER_MIN_DRAWN = 2048
_INT32_MAX = np.int32(2**31 - 1)


def first_accepted(drawn: NDArray[np.uint64], bound: int, m: int) -> NDArray[np.int64]:
    """Sorted positions of the first occurrence of each distinct candidate ``< bound``.

    Two implementations with identical results (``tests/unit/test_spec.py`` checks both against
    the plain-Python reference): a scatter into a per-thread table indexed by value, linear
    in ``drawn.size`` (used for large draws), and one sort of packed (value, position) keys.
    """
    if drawn.size >= _SCATTER_MIN_DRAWN and bound <= _SCATTER_MAX_BOUND:
        return first_accepted_scatter(drawn, bound)
    return first_accepted_sort(drawn, bound, m)


def first_accepted_scatter(drawn: NDArray[np.uint64], bound: int) -> NDArray[np.int64]:
    """Scatter version: ``table[v]`` becomes the least position holding value ``v``."""
    if drawn.size >= 2**31 - 1:  # positions must fit the int32 table
        raise ValueError("too many candidates for the scatter path")
    table = scratch("table", np.int32, bound)
    positions = np.arange(drawn.size, dtype=np.int32)
    values = drawn.view(np.int64)  # candidates are < 2^m <= 2^63
    if bound & (bound - 1):  # not a power of two: drop the rejected candidates
        keep = drawn < np.uint64(bound)
        positions = positions[keep]
        values = values[keep]
    # Only the entries of values present are read below, so only those are reset.
    table[values] = _INT32_MAX
    np.minimum.at(table, values, positions)  # unbuffered: duplicates keep the minimum
    first = positions[table[values] == positions]  # increasing, as positions is
    return first.astype(np.int64)


def first_accepted_sort(drawn: NDArray[np.uint64], bound: int, m: int) -> NDArray[np.int64]:
    """Sort version: one sort of (value, position) keys, then the first of each run."""
    valid = np.flatnonzero(drawn < np.uint64(bound))
    pbits = max(1, (drawn.size - 1).bit_length())
    if m + pbits > 64:  # keys do not fit in 64 bits (not reachable for realistic d')
        _, first = np.unique(drawn[valid], return_index=True)
        return np.sort(valid[first])
    # One unstable sort of (value, position) packed into a uint64 orders the candidates by
    # value and, within a value, by position; the first of each run is its first occurrence.
    packed = (drawn[valid] << np.uint64(pbits)) | valid.astype(np.uint64)
    packed.sort()
    values = packed >> np.uint64(pbits)
    is_first = np.empty(values.size, dtype=bool)
    is_first[:1] = True
    np.not_equal(values[1:], values[:-1], out=is_first[1:])
    positions = (packed[is_first] & np.uint64((1 << pbits) - 1)).astype(np.int64)
    positions.sort()
    return positions
