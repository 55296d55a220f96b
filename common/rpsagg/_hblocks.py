"""Two overlapping Hadamard blocks: the projection ``"hblocks"`` (wire format ``rpsagg-seed-v4``).

For any ``d`` let ``b = 2^floor(log2 d)`` (the largest power of two ``<= d``) and
``e = d - b`` (``0 <= e < b``). Client ``i`` sends ``G_i x = E_i B_i P_i D_i x`` (``k x d``, no
padding), where

* ``D_i``, ``P_i``, ``E_i`` are the randomized DCT's (:mod:`rpsagg._dct`): ``d`` signs from
  ``rpsSIGNS``, the cyclic shift ``sample_distinct(seed, rpsSHIFT, 1, d)`` and ``k`` distinct
  rows ``sample_distinct(seed, rpsROWS_, k, d)``;
* ``B_i = H_hi D2_i H_lo`` with ``H_lo`` the orthonormal Hadamard transform ``H_b / sqrt(b)``
  on coordinates ``[0, b)`` (identity on ``[b, d)``), ``D2_i`` the ``b - e`` signs of the
  ``rpsSIGN2`` stream on the overlap ``[e, b)`` (identity elsewhere: the coordinates
  ``[b, d)`` already carry independent signs from ``D_i``) and ``H_hi`` the
  orthonormal Hadamard transform on ``[e, d)`` (identity on ``[0, e)``).

``B`` is orthogonal (a product of orthogonal factors), so ``G G^T = I_k`` and
``E[G^T G] = (k/d) I`` as for the DCT. The two blocks cover ``[0, d)`` and overlap on
``[e, b)``; the second signs keep ``H_hi`` from undoing ``H_lo`` on the overlap (where the
blocks coincide, ``H D2 H`` is the two-round randomized Hadamard transform). An encode costs
two FWHTs of length ``b`` (``2 b log2 b`` butterflies, at most the padded SRHT's
``2b log2(2b)``) plus passes over ``d`` values; nothing is padded.

Unbiasedness: as for the DCT, the uniform cyclic shift and the signs make the joint law of
``(G_1, ..., G_n)`` invariant under a common signed cyclic shift of the input, so
``E[T(S)^+ G_i^T G_i]`` is a multiple of the identity and beta is ``d / E[sum_j l_j/T(l_j)]``.

Rows ``r < e`` of ``B`` depend on the ``b`` coordinates of the first block only (every row
on at least ``b > d/2`` inputs); the measured effect on the estimator is nil at the issue's
targets (``docs/performance.md``, "Any d").
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from rpsagg import spec
from rpsagg._dct import (
    DEFAULT_MEMORY_BUDGET,
    JointDCT,
    _shift_into,
    shift_and_sign_columns,
)
from rpsagg._fwht import BATCH_THREADS, fwht
from rpsagg._validation import check_matrix_args
from rpsagg.spec import (
    TAG_ROWS,
    TAG_SIGN2,
    dct_shift,
    sample_distinct,
    sign_bits,
    sign_factors,
)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# The compiled encode (``hb_pipe`` in ``fastc/hbpipe.c``) fuses the passes and runs its own FWHT;
# below this block length the older one-call kernel (``hb_encode``) does the whole encode.
_PIPE_MIN = 16
# From this block length on, with two cores, an encode runs the halves of each FWHT on two
# threads (the caller and the compiled module's helper thread); below it one thread was
# faster (docs/performance.md, "Any d").
_TWO_THREADS_MIN = 1 << 15
# On one thread, from this block length on, fht-cpu's FWHT (where installed) beats the fused
# pipeline's, so the one-thread encode runs the compiled passes around it instead.
_FHT_ONE_THREAD_MIN = 1 << 16
# the cores this process may run on (a process pinned to one core gets no helper thread)
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def block_split(d: int) -> tuple[int, int]:
    """``(b, e)``: the block length ``b = 2^floor(log2 d)`` and the offset ``e = d - b``."""
    if d < 1:
        raise ValueError(f"d must be >= 1; got {d}")
    b = 1 << (int(d).bit_length() - 1)
    return b, d - b


def hblocks_rows(seed: int, k: int, d: int) -> IntArray:
    """The ``k`` rows E samples from the ``d`` rows of ``B P D`` (``rpsROWS_``, bound ``d``)."""
    return sample_distinct(seed, TAG_ROWS, k, d)


_local = threading.local()


def _work(d: int) -> FloatArray:
    """A per-thread float64 buffer of length ``d`` (a fresh one per encode costs page faults)."""
    buf: FloatArray | None = getattr(_local, "buf", None)
    if buf is None or buf.shape[0] != d:
        buf = np.empty(d)
        _local.buf = buf
    return buf


def hblocks_encode(x: FloatArray, seed: int, k: int, threads: int | None = None) -> FloatArray:
    """``G x`` in float64 for the overlapping-blocks Hadamard projection with ``seed``.

    The FWHTs are unnormalized; the scale ``1/sqrt(b)`` of the first is applied to its
    input (in the pass that applies D and P), that of the second to the kept rows ``>= e``.
    The compiled kernels (``rpsagg._fast``) and the numpy code below do the same operations.

    Parameters
    ----------
    x : ndarray of float64, shape (d,)
        The vector (not padded).
    seed : int
        Transform seed.
    k : int
        Rows kept, ``1 <= k <= d``.
    threads : int, optional
        1: every pass on the calling thread. None (default) or 2 or more: from a block
        length of ``2^15`` on, with two or more cores, the halves of each FWHT run on two
        threads (the caller and the compiled module's helper thread). Every path gives the
        same values to rounding; the compiled pipeline gives the same bits on one thread or
        two, and on one thread it runs up to a block of ``2^15`` (from ``2^16`` on, with
        fht-cpu installed, the compiled passes around fht-cpu's FWHT do).

    Returns
    -------
    ndarray of float64, shape (k,)
    """
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1 or None; got {threads}")
    x = np.ascontiguousarray(x, dtype=np.float64)
    d = x.shape[0]
    b, e = block_split(d)
    native = spec.NATIVE
    # a compiled module built before these kernels existed lacks them: numpy then
    if native is None or not hasattr(native, "hb_pipe"):
        native = None
    two = threads != 1 and _CORES >= 2 and b >= _TWO_THREADS_MIN
    if native is not None and two:
        native.hb_wake()  # a sleeping helper wakes while the rows are sampled
    rows = hblocks_rows(seed, k, d)
    out = np.empty(k)
    if native is not None:
        if b < _PIPE_MIN:
            native.hb_encode(x, seed, rows, _work(d), out)
        elif two:
            native.hb_pipe(x, seed, rows, _work(2 * b), out, 2)
        elif b >= _FHT_ONE_THREAD_MIN and BATCH_THREADS:
            w = _work(d)
            native.hb_first(x, seed, w)
            fwht(w[:b], inplace=True)
            native.hb_middle(w, seed)
            fwht(w[e:], inplace=True)
            native.hb_gather(w, rows, out)
        else:
            native.hb_pipe(x, seed, rows, _work(2 * b), out, 1)
        return out
    w = _work(d)
    inv = 1.0 / math.sqrt(b)
    _shift_into(x * sign_factors(seed, d), dct_shift(seed, d), w)
    w[:b] *= inv
    fwht(w[:b], inplace=True)
    w[e:b] *= sign_factors(seed, b - e, tag=TAG_SIGN2)
    fwht(w[e:], inplace=True)
    np.take(w, rows, out=out)
    out[rows >= e] *= inv
    return out


def _fwht_rows(w: FloatArray, lo: int, hi: int) -> None:
    """In-place FWHT of ``w[i, lo:hi]`` for every row i (each a contiguous run)."""
    for i in range(w.shape[0]):
        fwht(w[i, lo:hi], inplace=True)


def _blocks_adjoint(w: FloatArray, signs2: NDArray[np.int8]) -> None:
    """Each row v of ``w`` (shape (m, d), C-contiguous) becomes ``B^T v = H_lo D2 H_hi v``.

    ``signs2`` is (m, b - e) or (b - e,)."""
    d = w.shape[1]
    b, e = block_split(d)
    inv = 1.0 / math.sqrt(b)
    _fwht_rows(w, e, d)
    w[:, e:] *= inv
    w[:, e:b] *= signs2
    _fwht_rows(w, 0, b)
    w[:, :b] *= inv


def _blocks_forward(w: FloatArray, signs2: NDArray[np.int8]) -> None:
    """Each row v of ``w`` (shape (m, d), C-contiguous) becomes ``B v = H_hi D2 H_lo v``."""
    d = w.shape[1]
    b, e = block_split(d)
    inv = 1.0 / math.sqrt(b)
    w[:, :b] *= inv
    _fwht_rows(w, 0, b)
    w[:, e:b] *= signs2
    _fwht_rows(w, e, d)
    w[:, e:] *= inv


def _signs2(seed: int, d: int) -> NDArray[np.int8]:
    """``D2`` of ``seed`` as int8 +-1 (``b - e`` entries, for the overlap ``[e, b)``)."""
    b, e = block_split(d)
    return np.asarray(1 - 2 * sign_bits(seed, b - e, TAG_SIGN2).astype(np.int8), dtype=np.int8)


def hblocks_matrix(seed: int, k: int, d: int) -> FloatArray:
    """The dense ``k x d`` matrix G of the hblocks projection for ``seed`` (tests and interop).

    Parameters
    ----------
    seed : int
        In ``[0, 2^64)``.
    k : int
        Number of rows, ``1 <= k <= d``.
    d : int
        Vector length (no padding).

    Returns
    -------
    ndarray, shape (k, d)
        ``G = E B P D``.
    """
    seed = check_matrix_args(seed, k, d)
    unit = np.zeros((k, d))
    unit[np.arange(k), hblocks_rows(seed, k, d)] = 1.0
    _blocks_adjoint(unit, _signs2(seed, d))  # row p: e_{rows[p]}^T B
    return shift_and_sign_columns(unit, seed, d)  # ... P D


@dataclass(frozen=True, eq=False)
class JointHBlocks(JointDCT):
    """The stacked operator ``A = [G_1; ...; G_n]`` (``nk x d``) of hblocks projections.

    The interface of :class:`~rpsagg._dct.JointDCT` (whose signs, shifts, rows and Gram
    matrix from dense sampled rows it shares); the transform in the middle is ``B``.

    Attributes
    ----------
    signs2 : ndarray of int8, shape (n, b - e)
        The ``D2_i`` (second signs, on the overlap ``[e, b)``).
    """

    signs2: NDArray[np.int8] = field(default_factory=lambda: np.empty((0, 0), np.int8))

    @classmethod
    def from_seeds(
        cls, seeds: Sequence[int], k: int, d: int, memory_budget: int = DEFAULT_MEMORY_BUDGET
    ) -> JointHBlocks:
        """Regenerate every client's transform from its seed."""
        base = JointDCT.from_seeds(seeds, k, d, memory_budget)
        b, e = block_split(d)
        s2 = np.empty((len(seeds), b - e), dtype=np.int8)
        for i, seed in enumerate(seeds):
            s2[i] = _signs2(seed, d)
        return cls(base.signs, base.shifts, base.rows, memory_budget, s2)

    #: the blocks' products work on two float64 arrays of length d per client
    _WORK_PER_CLIENT = 2

    def _mix_rows(self, w: FloatArray, lo: int) -> FloatArray:
        """Rows ``w`` (clients ``lo, lo + 1, ...``) times ``B``, in place."""
        _blocks_forward(w, self.signs2[lo : lo + w.shape[0]])
        return w

    def _unmix_rows(self, w: FloatArray, lo: int) -> FloatArray:
        """Rows ``w`` (clients ``lo, lo + 1, ...``) times ``B^T``, in place."""
        _blocks_adjoint(w, self.signs2[lo : lo + w.shape[0]])
        return w

    def _basis_rows(self, i: int) -> FloatArray:
        """The kept rows of client ``i``'s ``B`` (``E_i B``), (k, d)."""
        k, d = self.k, self.d_pad
        unit = np.zeros((k, d))
        unit[np.arange(k), self.rows[i]] = 1.0
        _blocks_adjoint(unit, self.signs2[i])  # row p: e_{rows[p]}^T B
        return unit
