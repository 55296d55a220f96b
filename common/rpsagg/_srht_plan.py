"""How the joint SRHT products are cut up: tiles, groups of tiles, threads and their pools.

The compiled products (``rpsagg._fast``'s ``tile_forward`` / ``tile_adjoint``) transform
tiles of 2^m coordinates (:func:`tile_bits`); the forward product's units are a client over
a group of consecutive tiles (:func:`forward_groups`). Both depend on the shape only, never
on the thread count, so neither do the results. Threads: :func:`default_threads`, a
process-wide pool per thread count (:func:`pool`, rebuilt after ``fork``) and
:func:`split` of a range into contiguous parts.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

# The tile of the compiled products is 2^m coordinates, m = round(log2 k) + _TILE_EXTRA
# clamped to [_TILE_MIN, _TILE_MAX], to at least 2^_TILE_COUNT_BITS tiles and to log2 d'
# (tile_bits).
_TILE_MIN = 7
_TILE_MAX = 16
_TILE_EXTRA = 3
_TILE_COUNT_BITS = 2  # at least 4 tiles where d' >= 2^9, for the adjoint's threads


def tile_bits(k: int, d_pad: int) -> int:
    """``m``, the log2 of the tile the compiled products transform, for ``k`` rows in d'.

    Per client and product the tiles cost about ``d' (m + k / 2^m)`` operations: an FWHT
    of 2^m per tile and the k sampled rows scattered (adjoint) or gathered (forward) once
    per tile. A row costs several butterflies (a parity and an unaligned access), so the
    measured optimum lies a few steps above ``log2 k``: ``m = round(log2 k) + 3`` clamped
    to [7, 16] (docs/scaling.md has the measurements); the tile stays in L2 (at most 2^16
    doubles, 512 KiB). Then ``m <= max(7, log2 d' - 2)``, so that d' >= 2^9 has at least 4
    tiles for the adjoint's threads to share, and ``m <= log2 d'``. ``m`` depends on
    nothing else (not on threads), so neither do the results.

    Parameters
    ----------
    k : int
        Rows per client.
    d_pad : int
        ``d'``, a power of two.

    Returns
    -------
    int
        ``m`` with ``2^m <= d'``.
    """
    log_d = d_pad.bit_length() - 1
    log_k = ((2 * max(k, 1) ** 2).bit_length() - 1) // 2  # round(log2 k), in integers
    want = min(max(log_k + _TILE_EXTRA, _TILE_MIN), _TILE_MAX)
    return min(want, max(_TILE_MIN, log_d - _TILE_COUNT_BITS), log_d)


# The tile forward's units are (client, group of consecutive tiles): up to this many groups,
# while their partial sums (groups x n x k doubles) fit in _FORWARD_GROUP_BYTES.
_FORWARD_GROUPS = 16
_FORWARD_GROUP_BYTES = 64 * 1024 * 1024


def forward_groups(n: int, k: int, tiles: int) -> int:
    """Groups of tiles the compiled forward product splits each client's tiles into.

    The forward's work is cut into ``n x groups`` units (a client over a group of
    consecutive tiles) so that threads share it evenly even when n is not a multiple of
    the thread count or is below it (100 clients on 16 threads: 7 for the busiest thread
    against 6.25 on average; 1600 units: 100 each). Each unit sums its group's tiles in
    order and the groups are added in order, so the result depends on the shape only.

    Parameters
    ----------
    n : int
        Clients.
    k : int
        Rows per client.
    tiles : int
        Tiles per client (``d' / 2^m``).

    Returns
    -------
    int
        At most 16, at most ``tiles``, and at most what keeps the partial sums
        (``groups n k`` doubles) within 64 MiB (at least 1).
    """
    return max(1, min(_FORWARD_GROUPS, tiles, _FORWARD_GROUP_BYTES // max(1, 8 * n * k)))


def default_threads() -> int:
    """Cores this process may run on (its CPU affinity), the decode's default threads."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def forget_pools() -> None:
    """In a forked child the parent's pool threads do not exist: start afresh."""
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


os.register_at_fork(after_in_child=forget_pools)


def pool(threads: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``threads`` workers (kept: a decode calls it every product)."""
    with _pools_lock:
        found = _pools.get(threads)
        if found is None:
            found = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpsagg-fwht")
            _pools[threads] = found
        return found


def split(count: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """``[0, count)`` cut into at most ``parts`` contiguous ranges (bounds multiples of align)."""
    units = -(-count // align)
    parts = max(1, min(parts, units))
    bounds = [min(count, (units * p // parts) * align) for p in range(parts + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]
