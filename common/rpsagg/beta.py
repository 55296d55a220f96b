"""The unbiasing scalars beta of the spatial estimators.

:func:`spatial_beta` is Rand-k-Spatial's (exact, from the binomial pmf). :func:`rps_beta`
is Rand-Proj-Spatial's, by the path :func:`beta_path` names: exact for ``c = 0``, the
closed-form free-probability limit (:func:`free_spectral_sum`, with its stated error
:func:`free_error_bound`) for large problems, and otherwise a Monte Carlo estimate
(samples from :func:`spectral_sample` over the client seeds :func:`mc_seeds`) kept in
memory and cached on disk under :func:`cache_dir`. ``docs/math.md`` ("The unbiasing scalar
beta") derives them.
"""

from __future__ import annotations

import contextlib

from rpsagg import _beta, _decode
from rpsagg._beta import (
    BetaEstimate,
    beta_path,
    cache_dir,
    mc_seeds,
    rps_beta,
    spatial_beta,
    spectral_sample,
)
from rpsagg._beta_free import free_error_bound, free_spectral_sum


def cached_estimate(
    n: int, k: int, d_pad: int, c: float, projection: str = "srht"
) -> BetaEstimate | None:
    """Rand-Proj-Spatial's Monte Carlo beta from the disk cache, without computing anything.

    Parameters
    ----------
    n, k, d_pad : int
        Clients, rows per client, and the dimension the projection acts in.
    c : float
        Transform coefficient.
    projection : {"srht", "dct", "hblocks"}

    Returns
    -------
    BetaEstimate or None
        The cached estimate, or None when this machine's cache holds none (or a damaged one).
    """
    return _beta._load(_beta._rps_key(n, k, d_pad, c, projection))


def clear_memory_cache() -> None:
    """Forget the betas this process computed (the disk cache stays), e.g. to time a cold
    :func:`rps_beta`."""
    with _beta._lock:
        _beta._memory.clear()


def one_blas_thread() -> contextlib.AbstractContextManager[object]:
    """A context in which BLAS runs one thread, as the library's own Monte Carlo and Krylov
    solvers do.

    Returns
    -------
    contextlib.AbstractContextManager
        threadpoolctl's limit where the ``rpsagg[blas]`` extra is installed, else a no-op.
    """
    return _decode.one_blas_thread()


__all__ = [
    "BetaEstimate",
    "beta_path",
    "cache_dir",
    "cached_estimate",
    "clear_memory_cache",
    "free_error_bound",
    "free_spectral_sum",
    "mc_seeds",
    "one_blas_thread",
    "rps_beta",
    "spatial_beta",
    "spectral_sample",
]
