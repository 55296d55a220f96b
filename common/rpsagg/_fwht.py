"""Fast Walsh-Hadamard transform (unnormalized, Sylvester/natural order).

``fwht(a)`` returns ``a @ H`` along the last axis, where ``H[i, j] =
(-1)^popcount(i & j)``. Three backends, the first available is used:

* ``fht-cpu`` (optional dependency ``rpsagg[fast]``, MIT): SIMD + OpenMP, about 20x
  faster than numpy at d = 2^20 on these machines. It holds the GIL; its own OpenMP threads
  parallelize a batch.
* ``native``: ``fwht_rows`` of the compiled kernels (``rpsagg._fast``), cache-blocked C with
  numpy's butterflies (the same bits; up to three stages per pass on 4-double vectors), as
  fast as fht-cpu up to 2^13 and 1.1-1.2x slower from 2^16 to 2^22 on one core, but without
  the GIL, so threads run it in parallel.
* a vectorized numpy butterfly, always available.

``RPSAGG_FWHT=numpy`` forces the numpy backend, ``RPSAGG_FWHT=native`` the compiled one
(when built); the tests cross-check all three.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

_PARALLEL_MIN = 1 << 18  # elements below which a 2-D transform runs on one thread


def fwht_numpy(a: FloatArray) -> FloatArray:
    """In-place butterfly FWHT along the last axis of a C-contiguous float64 array."""
    n = a.shape[-1]
    if n & (n - 1):
        raise ValueError(f"FWHT length must be a power of two; got {n}")
    flat = a.reshape(-1, n)
    h = 1
    while h < n:
        v = flat.reshape(flat.shape[0], n // (2 * h), 2, h)
        top = v[:, :, 0, :].copy()
        bottom = v[:, :, 1, :]
        v[:, :, 0, :] += bottom
        np.subtract(top, bottom, out=bottom)
        h *= 2
    return a


def _load_fast() -> Callable[..., FloatArray] | None:
    if os.environ.get("RPSAGG_FWHT", "").lower() in ("numpy", "native"):
        return None
    try:
        import fht_cpu
    except ImportError:
        return None

    def fwht_fast(a: FloatArray, threads: int | None = None,
                  min_parallel: int = _PARALLEL_MIN) -> FloatArray:
        n = a.shape[-1]
        if n & (n - 1):
            raise ValueError(f"FWHT length must be a power of two; got {n}")
        if n < 2:
            return a
        if a.ndim == 1:
            fht_cpu.fht_1d_f64(a)
        else:
            flat = a.reshape(-1, n)
            # OpenMP start-up costs more than it saves on small batches
            count = 1 if flat.size < min_parallel else -1 if threads is None else threads
            fht_cpu.fht(flat, axis=-1, inplace=True, num_threads=count)
        return a

    return fwht_fast


def _load_native() -> Callable[[FloatArray], FloatArray] | None:
    from rpsagg import spec

    if os.environ.get("RPSAGG_FWHT", "").lower() == "numpy":
        return None
    native = spec.NATIVE
    if native is None or not hasattr(native, "fwht_rows"):
        return None

    def fwht_native(a: FloatArray) -> FloatArray:
        n = a.shape[-1]
        if n & (n - 1):
            raise ValueError(f"FWHT length must be a power of two; got {n}")
        native.fwht_rows(a.reshape(-1), n)
        return a

    return fwht_native


_FAST = _load_fast()
_NATIVE = _load_native()
BACKEND = "fht-cpu" if _FAST is not None else "native" if _NATIVE is not None else "numpy"
#: True when the backend runs its own threads on a batch (then callers should not split it)
BATCH_THREADS = _FAST is not None


def fwht(a: FloatArray, *, inplace: bool = False, threads: int | None = None,
         min_parallel: int | None = None) -> FloatArray:
    """Unnormalized fast Walsh-Hadamard transform along the last axis.

    Parameters
    ----------
    a : ndarray of float64, shape (..., n)
        ``n`` must be a power of two.
    inplace : bool
        Transform ``a`` itself (it must then be C-contiguous float64).
    threads : int, optional
        OpenMP threads of the fht-cpu backend for a batch (default: all cores for large
        batches); the other backends run on the calling thread.
    min_parallel : int, optional
        Batches of fewer elements run on one thread (default ``2^18``: below it OpenMP's
        start-up cost more than it saved in the decode's passes).

    Returns
    -------
    ndarray
        ``a @ H`` with ``H`` the n x n Sylvester-Hadamard matrix (entries +-1).
    """
    if inplace:
        if a.dtype != np.float64 or not a.flags.c_contiguous:
            raise ValueError("in-place FWHT needs a C-contiguous float64 array")
        out = a
    else:
        out = np.array(a, dtype=np.float64, order="C", copy=True)
    if _FAST is not None:
        if min_parallel is None:
            return _FAST(out, threads)
        return _FAST(out, threads, min_parallel)
    if _NATIVE is not None:
        return _NATIVE(out)
    return fwht_numpy(out)
