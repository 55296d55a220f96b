"""Seeded Subsampled Randomized Hadamard Transforms and their joint operators.

``G_i = (1/sqrt(d')) E_i H D_i`` for client ``i``; ``A = [G_1; ...; G_n]`` (nk x d').
Nothing here forms H or a d' x d' matrix: every product goes through the FWHT (of d', or
of tiles of 2^m coordinates in the compiled products).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rpsagg import _fwht, spec
from rpsagg._fwht import fwht
from rpsagg._srht_plan import default_threads, forward_groups, tile_bits
from rpsagg._srht_plan import pool as _pool
from rpsagg._srht_plan import split as _split
from rpsagg.spec import (
    TAG_SIGNS,
    padded_dim,
    sign_factors,
    signs,
    srht_rows,
    stream_key,
    write_sign_factors,
)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# Work arrays of shape (clients, d') are processed in chunks of at most this many bytes.
DEFAULT_MEMORY_BUDGET = 256 * 1024 * 1024


_workspace = threading.local()


def _work_buffer(d_pad: int) -> FloatArray:
    """A per-thread float64 buffer of length d', reused by encodes.

    A fresh array of this size costs a page fault per 4 KiB on every encode, which is more
    than the arithmetic at d' = 2^20.
    """
    buf: FloatArray | None = getattr(_workspace, "buf", None)
    if buf is None or buf.shape[0] != d_pad:
        buf = np.empty(d_pad)
        _workspace.buf = buf
    return buf


def _sign_buffers(d_pad: int) -> tuple[NDArray[np.int8], NDArray[np.intp]]:
    """Per-thread buffers of :func:`sign_factors` for the numpy sign multiply: int8 of
    ``8 ceil(d'/8)`` entries and intp of ``ceil(d'/8)`` (sign-table indices)."""
    nbytes = (d_pad + 7) // 8
    bufs: tuple[NDArray[np.int8], NDArray[np.intp]] | None = getattr(_workspace, "signs", None)
    if bufs is None or bufs[1].shape[0] != nbytes:
        bufs = (np.empty(8 * nbytes, dtype=np.int8), np.empty(nbytes, np.intp))
        _workspace.signs = bufs
    return bufs


def srht_encode(x: FloatArray, seed: int, k: int, d_pad: int | None = None) -> FloatArray:
    """``G x`` in float64 for the SRHT with ``seed``.

    Parameters
    ----------
    x : ndarray of float64, shape (d,)
        The vector; zero-padded to ``d_pad`` here.
    seed : int
        Transform seed.
    k : int
        Rows kept.
    d_pad : int, optional
        ``d'`` (default ``len(x)``, which must then be a power of two).

    Returns
    -------
    ndarray of float64, shape (k,)
    """
    d = x.shape[0]
    d_pad = d if d_pad is None else d_pad
    v = _work_buffer(d_pad)
    native = spec.NATIVE
    if native is not None:  # the same bits from compiled loops (one pass, no temporaries)
        native.sign_multiply(np.ascontiguousarray(x, dtype=np.float64),
                             stream_key(seed, TAG_SIGNS), v)
    else:
        # D as int8 +-1 factors: x * (+-1) is exact, written straight into the work buffer
        factors = sign_factors(seed, d_pad, *_sign_buffers(d_pad))
        np.multiply(x, factors[:d], out=v[:d])
        v[d:] = 0.0
    rows = srht_rows(seed, k, d_pad)
    if d_pad < _SPLIT_MIN or _CORES < 2:
        fwht(v, inplace=True)
        out = np.take(v, rows)
        out /= np.sqrt(d_pad)
        return out
    fwht(v.reshape(2, d_pad // 2), inplace=True)  # the halves, as one batch on two cores
    return _last_stage(v, rows)


# From this d' on, an encode transforms the two halves of its vector on two cores.
_SPLIT_MIN = 1 << 18
_CORES = os.cpu_count() or 1


def _last_stage(v: FloatArray, rows: IntArray) -> FloatArray:
    """Rows ``rows`` of ``H v / sqrt(d')`` from v holding the FWHTs of its two halves.

    In Sylvester order ``H_2h = [[H_h, H_h], [H_h, -H_h]]``, so with ``a = H_h v[:h]`` and
    ``b = H_h v[h:]`` row ``r`` is ``a[r] + b[r]`` for ``r < h`` and ``a[r-h] - b[r-h]``
    otherwise: the last butterfly stage, evaluated only at the k rows kept.
    """
    scale = float(np.sqrt(v.shape[0]))
    native = spec.NATIVE
    if native is not None:
        out = np.empty(rows.shape[0])
        native.last_stage(v, rows, scale, out)
        return out
    half = v.shape[0] // 2
    low = rows & (half - 1)
    out = np.take(v[:half], low)
    other = np.take(v[half:], low)
    np.negative(other, out=other, where=rows >= half)
    out += other
    out /= scale
    return out


def srht_matrix(seed: int, k: int, d: int) -> FloatArray:
    """The dense ``k x d'`` matrix G of the SRHT for ``seed`` (tests and interop only).

    Parameters
    ----------
    seed : int
        In ``[0, 2^64)``.
    k : int
        Number of rows, ``1 <= k <= d``.
    d : int
        Vector length; ``d' = 2^ceil(log2 d)`` columns.

    Returns
    -------
    ndarray, shape (k, d')
        ``G = (1/sqrt(d')) E H D`` with ``H[r, j] = (-1)^popcount(r & j)``.
    """
    from rpsagg._validation import check_matrix_args

    seed = check_matrix_args(seed, k, d)
    d_pad = padded_dim(d)
    rows = srht_rows(seed, k, d_pad)
    cols = np.arange(d_pad, dtype=np.int64)
    parity = np.bitwise_count(rows[:, None] & cols[None, :]) & 1
    h_rows = 1.0 - 2.0 * parity.astype(np.float64)
    return np.asarray(h_rows * signs(seed, d_pad)[None, :] / np.sqrt(d_pad))


#: How :meth:`JointSRHT.forward` / :meth:`JointSRHT.adjoint` should run: ``"tiles"`` (the
#: compiled tile kernels ``tile_forward`` / ``tile_adjoint`` of ``rpsagg._fast``, when built)
#: or ``"passes"`` (numpy passes over an n x d' work array and the FWHT backend).
#: ``RPSAGG_PRODUCTS=passes`` picks the latter (benchmarks); :func:`product_path` says
#: which runs.
PRODUCTS = "passes" if os.environ.get("RPSAGG_PRODUCTS", "").lower() == "passes" else "tiles"


def product_path() -> str:
    """How the joint SRHT products run in this process.

    Returns
    -------
    str
        ``"tiles"`` when :data:`PRODUCTS` asks for them and the compiled kernels are
        loaded (``rpsagg.spec.NATIVE``), else ``"passes"``.
    """
    native = spec.NATIVE
    if PRODUCTS == "tiles" and native is not None and hasattr(native, "tile_adjoint"):
        return "tiles"
    return "passes"


class JointShape:
    """``n``, ``k`` and ``d_pad`` of a joint operator, read from its ``rows`` (n x k) and
    ``signs`` (n x d_pad) arrays: shared by the SRHT, the randomized DCT and the torch twin.
    """

    rows: Any
    signs: Any

    @property
    def n(self) -> int:
        """Clients (messages) in the operator."""
        return int(self.rows.shape[0])

    @property
    def k(self) -> int:
        """Rows per client."""
        return int(self.rows.shape[1])

    @property
    def d_pad(self) -> int:
        """The dimension the operator acts in: d' for the SRHT, d for the randomized DCT."""
        return int(self.signs.shape[1])


@dataclass(frozen=True, eq=False)
class JointSRHT(JointShape):
    """The stacked operator ``A = [G_1; ...; G_n]`` for a set of client seeds.

    Products (:func:`product_path`): with the compiled kernels, ``forward`` and ``adjoint`` run
    by tiles of ``2^m`` output coordinates (:func:`tile_bits`): per tile and client, an
    FWHT of ``2^m`` doubles in cache and the k sampled rows with the tile's parity signs,
    without any n x d' work array. Without them (``RPSAGG_NATIVE=0``, no C compiler), numpy
    passes over chunks of clients and the FWHT backend.

    Memory: the signs are held as int8 (n d' bytes). The tile products add two tiles
    (at most 1 MiB) per thread and the forward's partial sums (:func:`forward_groups`,
    at most 64 MiB); the numpy passes work on chunks of clients whose float64
    work arrays fit in ``memory_budget`` bytes. Peak memory is about ``n d' +
    memory_budget`` bytes at most, whatever n is.

    Threads: with ``threads > 1`` each product is split between that many threads; the
    tile kernels and numpy's element-wise loops release the GIL. The tile adjoint splits
    the tiles, the tile forward its (client, group of tiles) units; the numpy passes split
    rows of the chunk before the FWHT and columns for the adjoint's sum (fht-cpu, which
    holds the GIL, parallelizes the chunk's batch with its own OpenMP threads). Either way
    every output element is computed by the same operations in the same order whatever
    the thread count: the result is bit for bit that of ``threads=1``.

    Attributes
    ----------
    signs : ndarray of int8, shape (n, d')
        Diagonals of the ``D_i`` (+1 or -1).
    rows : ndarray of int64, shape (n, k)
        Rows sampled by each client.
    memory_budget : int
        Bytes of float64 work arrays per chunk of clients (the numpy passes and
        :meth:`gram`; the tile products need none).
    threads : int
        Threads per product (1: the calling thread only).
    tile_log2 : int or None
        ``m``, the log2 of the compiled products' tile, where a measurement wants to choose
        it (``bench/bench_tiles.py``); None (default): :func:`tile_bits` of k and d'. Other
        values change the products' bits by an ulp, never their value.
    """

    signs: NDArray[np.int8]
    rows: IntArray
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    threads: int = 1
    tile_log2: int | None = None

    def __post_init__(self) -> None:
        log_d = self.d_pad.bit_length() - 1
        if self.tile_log2 is not None and not 1 <= self.tile_log2 <= log_d:
            raise ValueError(f"tile_log2 must be in [1, log2 d' = {log_d}]; got "
                             f"{self.tile_log2}")

    @classmethod
    def from_seeds(
        cls,
        seeds: Sequence[int],
        k: int,
        d_pad: int,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        threads: int | None = 1,
    ) -> JointSRHT:
        """Regenerate every client's transform from its seed (``threads`` at a time;
        None: :func:`default_threads`)."""
        threads = default_threads() if threads is None else int(threads)
        if threads < 1:
            raise ValueError(f"threads must be >= 1; got {threads}")
        s = np.empty((len(seeds), d_pad), dtype=np.int8)
        r = np.empty((len(seeds), k), dtype=np.int64)

        def one(i: int) -> None:
            write_sign_factors(seeds[i], s[i])  # without the GIL where compiled
            r[i] = srht_rows(seeds[i], k, d_pad)

        if threads == 1 or len(seeds) < 2:
            for i in range(len(seeds)):
                one(i)
        else:
            list(_pool(threads).map(one, range(len(seeds))))
        return cls(s, r, memory_budget, threads)

    def _chunk(self) -> int:
        return max(1, min(self.n, self.memory_budget // (8 * self.d_pad)))

    def _run(self, fn: Callable[[int, int], None], count: int, align: int = 1) -> None:
        """``fn(a, b)`` over ``[0, count)`` cut into ranges, one per thread."""
        ranges = _split(count, self.threads, align)
        if len(ranges) == 1:
            fn(*ranges[0])
            return
        futures = [_pool(self.threads).submit(fn, a, b) for a, b in ranges]
        for f in futures:
            f.result()  # re-raises a worker's exception

    def _fwht_rows(self, w: FloatArray) -> None:
        if _fwht.BATCH_THREADS or self.threads == 1 or w.shape[0] == 1:
            fwht(w, inplace=True, threads=self.threads)
        else:

            def part(a: int, b: int) -> None:
                fwht(w[a:b], inplace=True)

            self._run(part, w.shape[0])

    def _tile_args(self) -> tuple[IntArray, NDArray[np.int8], int, float]:
        rows = np.ascontiguousarray(self.rows, dtype=np.int64)
        signs = np.ascontiguousarray(self.signs, dtype=np.int8)
        m = tile_bits(self.k, self.d_pad) if self.tile_log2 is None else self.tile_log2
        return rows, signs, m, 1.0 / float(np.sqrt(self.d_pad))

    def _adjoint_tiles(self, z: FloatArray) -> FloatArray:
        native = spec.NATIVE
        assert native is not None
        rows, signs, m, scale = self._tile_args()
        z = np.ascontiguousarray(z, dtype=np.float64)
        if z.shape != rows.shape:
            raise ValueError(f"z must have shape {rows.shape}; got {z.shape}")
        out = np.empty(self.d_pad)

        def tiles(a: int, b: int) -> None:
            native.tile_adjoint(z, rows, signs, self.k, m, a, b, scale, out)

        self._run(tiles, self.d_pad >> m)
        return out

    def _forward_tiles(self, u: FloatArray) -> FloatArray:
        native = spec.NATIVE
        assert native is not None
        rows, signs, m, scale = self._tile_args()
        u = np.ascontiguousarray(u, dtype=np.float64)
        if u.shape != (self.d_pad,):
            raise ValueError(f"u must have shape ({self.d_pad},); got {u.shape}")
        n, k = self.n, self.k
        groups = forward_groups(n, k, self.d_pad >> m)
        part = np.empty((groups, n, k))

        def units(a: int, b: int) -> None:
            native.tile_forward(u, rows, signs, k, m, groups, a, b, part)

        self._run(units, groups * n)
        flat = part.reshape(groups, n * k)

        def reduce(a: int, b: int) -> None:  # the groups added in order, then the scale
            y = flat[0, a:b]
            for g in range(1, groups):
                y += flat[g, a:b]
            y *= scale

        self._run(reduce, n * k, align=512)
        return part[0]

    def adjoint(self, z: FloatArray) -> FloatArray:
        """``A^T z = sum_i G_i^T z_i`` for ``z`` of shape (n, k); returns (d',)."""
        if product_path() == "tiles":
            return self._adjoint_tiles(z)
        out = np.zeros(self.d_pad)
        step = self._chunk()
        work = np.empty((step, self.d_pad))
        for lo in range(0, self.n, step):
            hi = min(self.n, lo + step)
            w = work[: hi - lo]

            def scatter(a: int, b: int, w: FloatArray = w, lo: int = lo) -> None:
                w[a:b].fill(0.0)
                np.put_along_axis(w[a:b], self.rows[lo + a : lo + b], z[lo + a : lo + b], axis=1)

            def reduce(a: int, b: int, w: FloatArray = w, lo: int = lo, hi: int = hi) -> None:
                cols = w[:, a:b]
                np.multiply(cols, self.signs[lo:hi, a:b], out=cols)
                out[a:b] += cols.sum(axis=0)

            self._run(scatter, hi - lo)
            self._fwht_rows(w)
            self._run(reduce, self.d_pad, align=512)
        out *= 1.0 / np.sqrt(self.d_pad)
        return out

    def forward(self, u: FloatArray) -> FloatArray:
        """``A u`` as an (n, k) array: row ``i`` is ``G_i u``."""
        if product_path() == "tiles":
            return self._forward_tiles(u)
        out = np.empty((self.n, self.k))
        step = self._chunk()
        work = np.empty((step, self.d_pad))
        for lo in range(0, self.n, step):
            hi = min(self.n, lo + step)
            w = work[: hi - lo]

            def sign(a: int, b: int, w: FloatArray = w, lo: int = lo, hi: int = hi) -> None:
                np.multiply(self.signs[lo:hi, a:b], u[None, a:b], out=w[:, a:b])

            def gather(a: int, b: int, w: FloatArray = w, lo: int = lo) -> None:
                out[lo + a : lo + b] = np.take_along_axis(
                    w[a:b], self.rows[lo + a : lo + b], axis=1
                )

            self._run(sign, self.d_pad, align=512)
            self._fwht_rows(w)
            self._run(gather, hi - lo)
        out *= 1.0 / np.sqrt(self.d_pad)
        return out

    def gram(self) -> FloatArray:
        """The nk x nk Gram matrix ``K = A A^T``.

        Block (i, j) is ``(1/d') (H (s_i * s_j))[r_ip XOR r_jq]`` since
        ``H diag(s) H`` has entry ``(H s)[a XOR b]``: one FWHT per pair of clients.
        """
        n, k, d_pad = self.n, self.k, self.d_pad
        gram = np.empty((n * k, n * k))
        step = self._chunk()
        for i in range(n):
            ri = self.rows[i]
            for lo in range(i, n, step):
                hi = min(n, lo + step)
                prod = np.multiply(self.signs[i][None, :], self.signs[lo:hi], dtype=np.float64)
                fwht(prod, inplace=True)
                idx = ri[None, :, None] ^ self.rows[lo:hi][:, None, :]  # (b, k, k)
                blocks = np.take_along_axis(prod, idx.reshape(hi - lo, k * k), axis=1)
                blocks = blocks.reshape(hi - lo, k, k) / d_pad
                # blocks[m] is K_{i, lo+m}; K_{lo+m, i} is its transpose
                gram[i * k : (i + 1) * k, lo * k : hi * k] = blocks.transpose(1, 0, 2).reshape(
                    k, (hi - lo) * k
                )
                gram[lo * k : hi * k, i * k : (i + 1) * k] = blocks.transpose(0, 2, 1).reshape(
                    (hi - lo) * k, k
                )
        return gram
