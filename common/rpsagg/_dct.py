"""Seeded subsampled randomized DCT: the projection ``"dct"`` (wire format ``rpsagg-seed-v2``).

``G_i = E_i C P_i D_i`` (``k x d``, no padding) for client ``i``:

* ``D_i``: ``d`` random signs, the first ``d`` bits of the ``rpsSIGNS`` stream (as the SRHT's);
* ``P_i``: the cyclic shift by ``s_i = sample_distinct(seed, rpsSHIFT, 1, d)``,
  ``(P v)[(j + s) mod d] = v[j]``;
* ``C``: the orthonormal DCT-II of length ``d``,
  ``C[r, m] = sqrt((1 if r == 0 else 2) / d) cos(pi r (2m + 1) / (2d))``;
* ``E_i``: ``k`` distinct rows, ``sample_distinct(seed, rpsROWS_, k, d)``.

``G G^T = I_k`` and ``E[G^T G] = (k/d) I`` as for the SRHT, with ``d`` in place of ``d'``.
Why the shift: the estimator is unbiased only if ``E[T(S)^+ G_i^T G_i]`` is a multiple of the
identity. The SRHT gets that from common sign flips (which make it diagonal) and common
XOR-shifts of the coordinates (which make the diagonal constant). The DCT has no such
coordinate symmetry, so each client adds a uniform cyclic shift: a common shift of all
clients' inputs maps the joint law of ``(G_1, ..., G_n)`` to itself, the expectation commutes
with every signed cyclic shift, and a diagonal matrix that commutes with all cyclic shifts is
``alpha I``. The sum ``docs/math.md`` gives for beta ("The unbiasing scalar beta") then holds
with ``d`` in place of ``d'``.
(Measured without the shift, at (n, k, d) = (5, 6, 30) and (7, 9, 300), the diagonal was
already flat within Monte Carlo error; the shift turns that observation into a guarantee
for every d at the cost of one copy of the vector.)

Every product is O(d log d) through ``scipy.fft`` (any length); nothing forms C except
:func:`dct_matrix` (tests) and the Gram matrix of the exact solver, which is built from the
``nk`` sampled rows only (``nk x d``, in chunks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rpsagg import spec
from rpsagg._srht import JointShape
from rpsagg._validation import check_matrix_args
from rpsagg.spec import (
    TAG_ROWS,
    TAG_SIGNS,
    dct_shift,
    sample_distinct,
    sign_bits,
    sign_factors,
    stream_key,
    write_sign_factors,
)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

DEFAULT_MEMORY_BUDGET = 256 * 1024 * 1024
# The exact solver's Gram matrix costs about (nk)^2 d multiply-adds; above this many the
# matrix-free solver (and beta's Hutchinson estimator) is used instead: about 0.3 s of BLAS
# here, paid once per decode and once per Monte Carlo sample of beta.
EXACT_FLOPS_LIMIT = 2**31
#: products with K a Krylov solve of the Rand-Proj-Spatial systems typically takes (7-21)
KRYLOV_TYPICAL_ITERATIONS = 20
#: Gram matrices of at most this many multiply-adds are built whatever a Krylov solve costs
EXACT_TRIVIAL_FLOPS = 2**24


def dct_rows(seed: int, k: int, d: int) -> IntArray:
    """The ``k`` rows E samples from the ``d`` rows of ``C P D`` (``rpsROWS_``, bound ``d``)."""
    return sample_distinct(seed, TAG_ROWS, k, d)


def _fft() -> object:
    import scipy.fft  # lazily: only encoders of this projection load it

    return scipy.fft


def _shift_into(v: FloatArray, shift: int, out: FloatArray) -> FloatArray:
    """``out[(j + shift) mod d] = v[j]`` along the last axis."""
    d = v.shape[-1]
    out[..., shift:] = v[..., : d - shift]
    out[..., :shift] = v[..., d - shift :]
    return out


def _unshift_into(w: FloatArray, shift: int, out: FloatArray) -> FloatArray:
    """The inverse of :func:`_shift_into`: ``out[j] = w[(j + shift) mod d]``."""
    d = w.shape[-1]
    out[..., : d - shift] = w[..., shift:]
    out[..., d - shift :] = w[..., :shift]
    return out


def dct_encode(x: FloatArray, seed: int, k: int) -> FloatArray:
    """``G x`` in float64 for the randomized DCT with ``seed``.

    Parameters
    ----------
    x : ndarray of float64, shape (d,)
        The vector (not padded).
    seed : int
        Transform seed.
    k : int
        Rows kept.

    Returns
    -------
    ndarray of float64, shape (k,)
    """
    import scipy.fft

    d = x.shape[0]
    v = np.empty(d)
    native = spec.NATIVE
    if native is not None:  # the same bits as the numpy branch, one pass
        native.sign_multiply(np.ascontiguousarray(x, dtype=np.float64),
                             stream_key(seed, TAG_SIGNS), v)
    else:
        np.multiply(x, sign_factors(seed, d), out=v)
    w = _shift_into(v, dct_shift(seed, d), np.empty(d))
    out = scipy.fft.dct(w, type=2, norm="ortho", overwrite_x=True)
    return np.asarray(np.take(out, dct_rows(seed, k, d)))


def _dct_basis_rows(rows: IntArray, d: int) -> FloatArray:
    """``C[rows, :]`` from the closed form, the angle reduced exactly in integers."""
    m = np.arange(d, dtype=np.int64)
    t = (rows[:, None] * (2 * m[None, :] + 1)) % (4 * d)  # < 4d, exact
    out = np.cos((np.pi / (2 * d)) * t.astype(np.float64))
    out *= np.sqrt(2.0 / d)
    out[rows == 0] *= np.sqrt(0.5)
    return np.asarray(out)


def dct_matrix(seed: int, k: int, d: int) -> FloatArray:
    """The dense ``k x d`` matrix G of the randomized DCT for ``seed`` (tests and interop).

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
        ``G = E C P D``.
    """
    seed = check_matrix_args(seed, k, d)
    return shift_and_sign_columns(_dct_basis_rows(dct_rows(seed, k, d), d), seed, d)


def shift_and_sign_columns(rows: FloatArray, seed: int, d: int) -> FloatArray:
    """``R P D`` for ``R`` (k x d, e.g. ``C[rows, :]``): the cyclic shift and the signs of
    ``seed`` applied to the columns, as the randomized DCT and hblocks do."""
    # (R P)[:, j] = R[:, (j + s) mod d]; D multiplies column j by its sign
    shifted = _unshift_into(rows, dct_shift(seed, d), np.empty_like(rows))
    signs = 1.0 - 2.0 * sign_bits(seed, d).astype(np.float64)
    return np.asarray(shifted * signs[None, :])


@dataclass(frozen=True, eq=False)
class JointDCT(JointShape):
    """The stacked operator ``A = [G_1; ...; G_n]`` (``nk x d``) of randomized DCTs.

    The same interface as :class:`~rpsagg._srht.JointSRHT` (``d_pad`` is ``d`` here: the
    dimension the operator acts in), so the solvers and beta use either.

    Attributes
    ----------
    signs : ndarray of int8, shape (n, d)
    shifts : ndarray of int64, shape (n,)
    rows : ndarray of int64, shape (n, k)
    memory_budget : int
        Bytes of float64 work arrays per chunk of clients.
    """

    signs: NDArray[np.int8]
    shifts: IntArray
    rows: IntArray
    memory_budget: int = DEFAULT_MEMORY_BUDGET

    @classmethod
    def from_seeds(
        cls, seeds: Sequence[int], k: int, d: int, memory_budget: int = DEFAULT_MEMORY_BUDGET
    ) -> JointDCT:
        """Regenerate every client's transform from its seed."""
        s = np.empty((len(seeds), d), dtype=np.int8)
        sh = np.empty(len(seeds), dtype=np.int64)
        r = np.empty((len(seeds), k), dtype=np.int64)
        for i, seed in enumerate(seeds):
            write_sign_factors(seed, s[i])
            sh[i] = dct_shift(seed, d)
            r[i] = dct_rows(seed, k, d)
        return cls(s, sh, r, memory_budget)

    def exact_affordable(self) -> bool:
        """Whether the Gram matrix costs at most :data:`EXACT_FLOPS_LIMIT` multiply-adds."""
        nk = self.n * self.k
        return nk * nk * self.d_pad <= EXACT_FLOPS_LIMIT

    def exact_cheaper(self) -> bool:
        """Whether building and factorizing the Gram matrix costs less than a Krylov solve.

        The Gram matrix costs ``(nk)^2 d`` multiply-adds (from the dense sampled rows); a
        Krylov solve about :data:`KRYLOV_TYPICAL_ITERATIONS` products with K, each ``2n``
        transforms of ``d log2 d``. So the exact solver is the cheaper one only while
        ``(nk)^2 <= 2 n log2(d) * KRYLOV_TYPICAL_ITERATIONS`` (nk <= 53 at n = 5,
        d = 20,586), or while the Gram matrix is trivial (at most
        :data:`EXACT_TRIVIAL_FLOPS`, about a millisecond either way: the exact answer
        then). Measured at n = 5, d = 20,586 on 2 cores: exact 13 ms at nk = 100 and 124 ms
        at nk = 500, conjugate gradients 4-5 ms at both.
        """
        nk = self.n * self.k
        if nk * nk * self.d_pad <= EXACT_TRIVIAL_FLOPS:
            return True
        log_d = max(1.0, float(np.log2(self.d_pad)))
        return nk * nk <= 2 * self.n * log_d * KRYLOV_TYPICAL_ITERATIONS

    def _chunk(self, per_client: int) -> int:
        return max(1, min(self.n, self.memory_budget // (8 * per_client)))

    #: float64 work arrays of length d per client in a chunk of the products
    _WORK_PER_CLIENT = 1

    def _mix_rows(self, w: FloatArray, lo: int) -> FloatArray:
        """Rows ``w`` (clients ``lo, lo + 1, ...``) times the middle transform: ``C``."""
        import scipy.fft

        out: FloatArray = scipy.fft.dct(w, type=2, norm="ortho", axis=1, overwrite_x=True)
        return out

    def _unmix_rows(self, w: FloatArray, lo: int) -> FloatArray:
        """Rows ``w`` (clients ``lo, lo + 1, ...``) times the middle transform's transpose:
        ``C^T``."""
        import scipy.fft

        out: FloatArray = scipy.fft.idct(w, type=2, norm="ortho", axis=1, overwrite_x=True)
        return out

    def _basis_rows(self, i: int) -> FloatArray:
        """The kept rows of client ``i``'s middle transform (``C[rows_i, :]``), (k, d)."""
        return _dct_basis_rows(self.rows[i], self.d_pad)

    def adjoint(self, z: FloatArray) -> FloatArray:
        """``A^T z = sum_i G_i^T z_i`` for ``z`` of shape (n, k); returns (d,)."""
        d = self.d_pad
        out = np.zeros(d)
        step = self._chunk(self._WORK_PER_CLIENT * d)
        work = np.empty((step, d))
        tmp = np.empty(d)
        for lo in range(0, self.n, step):
            hi = min(self.n, lo + step)
            w = work[: hi - lo]
            w.fill(0.0)
            np.put_along_axis(w, self.rows[lo:hi], z[lo:hi], axis=1)
            w = self._unmix_rows(w, lo)
            for i in range(hi - lo):
                _unshift_into(w[i], int(self.shifts[lo + i]), tmp)
                tmp *= self.signs[lo + i]
                out += tmp
        return out

    def forward(self, u: FloatArray) -> FloatArray:
        """``A u`` as an (n, k) array: row ``i`` is ``G_i u``."""
        d = self.d_pad
        out = np.empty((self.n, self.k))
        step = self._chunk(self._WORK_PER_CLIENT * d)
        work = np.empty((step, d))
        tmp = np.empty(d)
        for lo in range(0, self.n, step):
            hi = min(self.n, lo + step)
            w = work[: hi - lo]
            for i in range(hi - lo):
                np.multiply(self.signs[lo + i], u, out=tmp)
                _shift_into(tmp, int(self.shifts[lo + i]), w[i])
            t = self._mix_rows(w, lo)
            out[lo:hi] = np.take_along_axis(t, self.rows[lo:hi], axis=1)
        return out

    def _dense_rows(self, lo: int, hi: int) -> FloatArray:
        """``[G_lo; ...; G_{hi-1}]`` densely, shape ((hi - lo) k, d)."""
        d, k = self.d_pad, self.k
        out = np.empty(((hi - lo) * k, d))
        for i in range(lo, hi):
            block = out[(i - lo) * k : (i - lo + 1) * k]
            _unshift_into(self._basis_rows(i), int(self.shifts[i]), block)
            block *= self.signs[i]
        return out

    def gram(self) -> FloatArray:
        """The nk x nk Gram matrix ``K = A A^T`` from the dense sampled rows, in chunks."""
        n, k, d = self.n, self.k, self.d_pad
        gram = np.empty((n * k, n * k))
        step = self._chunk(2 * k * d)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            a_i = self._dense_rows(lo, hi)
            for lo2 in range(lo, n, step):
                hi2 = min(n, lo2 + step)
                a_j = a_i if lo2 == lo else self._dense_rows(lo2, hi2)
                block = a_i @ a_j.T
                gram[lo * k : hi * k, lo2 * k : hi2 * k] = block
                gram[lo2 * k : hi2 * k, lo * k : hi * k] = block.T
        return gram
