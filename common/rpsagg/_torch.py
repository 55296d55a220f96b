"""Accelerator backend of the joint decode, on PyTorch (optional extra ``rpsagg[torch]``).

The same code runs on a CUDA device and on the CPU (where the tests run it, so it is never
skipped): the matrix-free operator ``A = [G_1; ...; G_n]`` with a batched FWHT, and the
Krylov solvers of :mod:`rpsagg._decode` on tensors of that device.

* Randomness: the signs and rows come from the spec code (:mod:`rpsagg.spec`, integer
  arithmetic on the CPU). The signs travel as the packed ``TAG_SIGNS`` words (``d'/8``
  bytes per client) and are expanded to int8 +-1 on the device.
* FWHT: ``H_{d'} = H_{2^a} (x) H_{2^b} (x) ...`` (Sylvester order is a Kronecker power), so
  the transform is a few batched matrix products with a small ``2^m x 2^m`` Hadamard factor
  (``m <= 7``: a product with 128 columns runs at matrix-unit speed and each factor is one
  pass over memory instead of ``m``). The ``d' x d'`` matrix is never formed. Matrix
  products must run in full precision: with TF32 enabled
  (``torch.backends.cuda.matmul.allow_tf32``) float32 transforms lose 3 digits.
* Solvers: ``c < 1`` runs scipy's conjugate-gradient recurrence step for step on the device
  (same stopping rule and iteration count as :func:`rpsagg._decode.solve_krylov`, so in
  float64 the two decodes agree to rounding). ``c = 1`` runs scipy's LSQR on the host with
  the device operator (vectors of length nk and d' cross the bus twice per iteration). Small
  systems that :func:`~rpsagg._decode.choose_method` sends to the exact solver are solved by
  the numpy code: a device brings nothing at nk <= 4096.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from rpsagg._decode import DEFAULT_RTOL, EXACT_LIMIT, SolveInfo, choose_method, joint_solve
from rpsagg._srht import JointShape, JointSRHT
from rpsagg.spec import TAG_SIGNS, srht_rows, stream_key, stream_words

if TYPE_CHECKING:
    import torch

FloatArray = NDArray[np.float64]

# Work arrays of shape (clients, d') per chunk, in bytes (the FWHT needs twice this).
DEFAULT_DEVICE_BUDGET = 1 << 30
DEFAULT_CPU_BUDGET = 256 * 1024 * 1024
# log2 of the Hadamard factor of the FWHT. 2^7: on CUDA a product with 128 columns runs at
# matrix-unit speed; on the CPU it is also the fastest (at (16, 2^20) float64, 2 threads:
# 0.87 s against 1.4 s with 2^3 factors and 4.8 s for a radix-2 butterfly in torch ops).
RADIX = 7


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the test set-up installs it
        raise ImportError(
            "a decode device needs PyTorch: pip install 'rpsagg[torch]'"
        ) from exc
    return torch


def resolve_device(device: str | torch.device) -> torch.device:
    """A ``torch.device`` for ``device``; raises ``ValueError`` if it is unusable here."""
    torch = _torch()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown decode device {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"decode device {device!r}: CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"decode device must be 'cpu' or 'cuda[:N]'; got {device!r}")
    return dev


_FACTORS: dict[tuple[int, Any, str], Any] = {}


def hadamard_factor(m: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The ``2^m x 2^m`` Sylvester-Hadamard factor (entries +-1), cached per device."""
    torch = _torch()
    key = (m, dtype, str(device))
    h = _FACTORS.get(key)
    if h is None:
        h = torch.ones((1, 1), dtype=dtype, device=device)
        for _ in range(m):  # H_2h = [[H_h, H_h], [H_h, -H_h]]
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        _FACTORS[key] = h
    return h


def fwht_torch(x: torch.Tensor, radix: int | None = None) -> torch.Tensor:
    """Unnormalized FWHT ``x @ H`` along the last axis (a new tensor).

    Parameters
    ----------
    x : Tensor, shape (..., n)
        ``n`` a power of two; float32 or float64.
    radix : int, optional
        log2 of the Hadamard factor per pass (default 7).

    Returns
    -------
    Tensor
        Same shape and dtype as ``x``.
    """
    torch = _torch()
    n = int(x.shape[-1])
    if n < 1 or n & (n - 1):
        raise ValueError(f"FWHT length must be a power of two; got {n}")
    if radix is None:
        radix = RADIX
    batch = x.numel() // n
    y = x.reshape(batch, n)
    left_bits = n.bit_length() - 1
    right = 1  # product of the axis sizes already transformed (the fastest-varying ones)
    while left_bits > 0:
        m = min(radix, left_bits)
        f = 1 << m
        left_bits -= m
        h = hadamard_factor(m, x.dtype, x.device)  # symmetric
        if right == 1:
            y = torch.mm(y.reshape(-1, f), h)
        else:  # one strided batched product, the factor broadcast (stride 0), no copies
            y3 = y.reshape(-1, f, right)
            y = torch.bmm(h.expand(y3.shape[0], f, f), y3)
        right *= f
    return y.reshape(x.shape)


def _sign_words(seeds: Sequence[int], d_pad: int, threads: int) -> NDArray[np.uint64]:
    nwords = (d_pad + 63) // 64
    out = np.empty((len(seeds), nwords), dtype=np.uint64)

    def one(i: int) -> None:
        out[i] = stream_words(stream_key(seeds[i], TAG_SIGNS), 0, nwords)

    _map(one, len(seeds), threads)
    return out


def _map(fn: Any, count: int, threads: int) -> None:
    if threads <= 1 or count <= 1:
        for i in range(count):
            fn(i)
        return
    with ThreadPoolExecutor(max_workers=min(threads, count)) as pool:
        list(pool.map(fn, range(count)))  # numpy's ufuncs and the C sampler drop the GIL


@dataclass(eq=False)
class TorchJointSRHT(JointShape):
    """``A = [G_1; ...; G_n]`` on a torch device (the tensor twin of
    :class:`rpsagg._srht.JointSRHT`).

    Attributes
    ----------
    signs : Tensor of int8, shape (n, d')
        Diagonals of the ``D_i`` (+1 or -1).
    rows : Tensor of int64, shape (n, k)
        Rows sampled by each client.
    dtype : torch.dtype
        float64 (matches the numpy decode) or float32.
    memory_budget : int
        Bytes of work arrays per chunk of clients.
    radix : int or None
        log2 of the FWHT's Hadamard factor (None: per device).
    """

    signs: torch.Tensor
    rows: torch.Tensor
    dtype: torch.dtype
    memory_budget: int
    radix: int | None = None

    @classmethod
    def from_seeds(
        cls,
        seeds: Sequence[int],
        k: int,
        d_pad: int,
        device: str | torch.device = "cpu",
        *,
        dtype: str | torch.dtype = "float64",
        memory_budget: int | None = None,
        threads: int = 1,
        radix: int | None = None,
    ) -> TorchJointSRHT:
        """Regenerate every client's transform from its seed on the host, then move it.

        ``threads`` host threads derive the seeds' words and rows (they release the GIL).
        """
        torch = _torch()
        dev = resolve_device(device)
        tdtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if tdtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be float32 or float64; got {dtype}")
        if memory_budget is None:
            memory_budget = DEFAULT_DEVICE_BUDGET if dev.type == "cuda" else DEFAULT_CPU_BUDGET
        n = len(seeds)
        rows = np.empty((n, k), dtype=np.int64)

        def one_row(i: int) -> None:
            rows[i] = srht_rows(seeds[i], k, d_pad)

        _map(one_row, n, threads)
        words = _sign_words(seeds, d_pad, threads)
        # little-endian words: byte b of word w holds signs 64 w + 8 b ... + 7, lsb first
        packed = torch.from_numpy(words.view(np.uint8)).to(dev, non_blocking=False)
        signs = torch.empty((n, d_pad), dtype=torch.int8, device=dev)
        shifts = torch.arange(8, dtype=torch.uint8, device=dev)
        step = max(1, min(n, (memory_budget // 2) // max(1, d_pad)))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            bits = (packed[lo:hi, :, None] >> shifts) & 1  # (c, 8 nwords, 8) uint8
            s = signs[lo:hi]
            s.copy_(bits.reshape(hi - lo, -1)[:, :d_pad])
            s.mul_(-2).add_(1)
        return cls(signs, torch.from_numpy(rows).to(dev), tdtype, int(memory_budget), radix)

    @property
    def device(self) -> torch.device:
        return self.signs.device

    def _chunk(self) -> int:
        item = 8 if self.dtype == _torch().float64 else 4
        return max(1, min(self.n, self.memory_budget // (item * self.d_pad)))

    def _fwht(self, w: torch.Tensor) -> torch.Tensor:
        return fwht_torch(w, self.radix)

    def adjoint(self, z: torch.Tensor) -> torch.Tensor:
        """``A^T z = sum_i G_i^T z_i`` for ``z`` of shape (n, k); returns (d',)."""
        torch = _torch()
        out = torch.zeros(self.d_pad, dtype=self.dtype, device=self.device)
        step = self._chunk()
        for lo in range(0, self.n, step):
            hi = min(self.n, lo + step)
            w = torch.zeros((hi - lo, self.d_pad), dtype=self.dtype, device=self.device)
            w.scatter_(1, self.rows[lo:hi], z[lo:hi])
            w = self._fwht(w)
            w.mul_(self.signs[lo:hi])
            out += w.sum(dim=0)
        out *= 1.0 / float(np.sqrt(self.d_pad))
        return out

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """``A u`` as an (n, k) tensor: row ``i`` is ``G_i u``."""
        torch = _torch()
        out = torch.empty((self.n, self.k), dtype=self.dtype, device=self.device)
        step = self._chunk()
        for lo in range(0, self.n, step):
            hi = min(self.n, lo + step)
            w = self._fwht(self.signs[lo:hi] * u[None, :])
            out[lo:hi] = torch.gather(w, 1, self.rows[lo:hi])
        out *= 1.0 / float(np.sqrt(self.d_pad))
        return out

    def sketch(self, x: torch.Tensor, lo: int = 0) -> torch.Tensor:
        """``G_i x_i`` for clients ``lo .. lo + len(x) - 1`` (x: (m, d')); shape (m, k).

        The clients' encode on the device (benchmarks build messages with it; the tests
        check it against :func:`rpsagg._srht.srht_encode`).
        """
        torch = _torch()
        hi = lo + int(x.shape[0])
        w = self._fwht(self.signs[lo:hi] * x)
        return torch.gather(w, 1, self.rows[lo:hi]) * (1.0 / float(np.sqrt(self.d_pad)))


def _system_matvec(op: TorchJointSRHT, c: float, v: torch.Tensor) -> torch.Tensor:
    """``M v = (1 - c) v + c A A^T v`` on a flat vector of length nk."""
    v2 = v.reshape(op.n, op.k)
    kv = op.forward(op.adjoint(v2))
    return ((1.0 - c) * v2 + c * kv).reshape(-1)


def solve_krylov_torch(
    op: TorchJointSRHT, y: torch.Tensor, c: float, *, rtol: float = DEFAULT_RTOL,
    maxiter: int | None = None,
) -> tuple[torch.Tensor, int, bool]:
    """``((1 - c) I + c K)^-1 y`` by conjugate gradients on the device (``c < 1``).

    The recurrence, stopping rule (``||r|| < rtol ||y||``, checked before each step) and
    iteration count are scipy's ``cg`` with ``x0 = 0`` and no preconditioner.
    """
    torch = _torch()
    if not c < 1.0:
        raise ValueError("conjugate gradients need c < 1; use LSQR for c = 1")
    nk = op.n * op.k
    maxiter = maxiter if maxiter is not None else max(200, min(nk, 2000))
    b = y.reshape(-1)
    bnrm2 = float(torch.linalg.vector_norm(b))
    atol = float(rtol) * bnrm2
    if bnrm2 == 0.0:
        return b.clone(), 0, True
    x = torch.zeros_like(b)
    r = b.clone()
    p = torch.empty_like(b)
    rho_prev = None
    for iteration in range(maxiter):
        if float(torch.linalg.vector_norm(r)) < atol:
            return x, iteration, True
        rho_cur = torch.dot(r, r)
        if rho_prev is not None:
            p *= rho_cur / rho_prev
            p += r
        else:
            p.copy_(r)
        q = _system_matvec(op, c, p)
        alpha = rho_cur / torch.dot(p, q)
        x += alpha * p
        r -= alpha * q
        rho_prev = rho_cur
    return x, maxiter, False


def solve_lsqr_torch(
    op: TorchJointSRHT, y: torch.Tensor, *, rtol: float = DEFAULT_RTOL,
    maxiter: int | None = None,
) -> tuple[torch.Tensor, int, bool, float]:
    """``A^+ y`` by scipy's LSQR on the host, each product with A on the device."""
    torch = _torch()
    from scipy.sparse.linalg import LinearOperator, lsqr

    n, k, d_pad = op.n, op.k, op.d_pad
    dev, dt = op.device, op.dtype

    def matvec(u: FloatArray) -> FloatArray:
        t = torch.from_numpy(np.ascontiguousarray(u, dtype=np.float64)).to(dev, dt)
        return np.asarray(op.forward(t).reshape(-1).to("cpu", torch.float64).numpy())

    def rmatvec(z: FloatArray) -> FloatArray:
        t = torch.from_numpy(np.ascontiguousarray(z, dtype=np.float64)).to(dev, dt)
        return np.asarray(op.adjoint(t.reshape(n, k)).to("cpu", torch.float64).numpy())

    a_op = LinearOperator((n * k, d_pad), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)
    limit = maxiter if maxiter is not None else max(200, min(n * k, 4000))
    flat = y.reshape(-1).to("cpu", torch.float64).numpy()
    out = lsqr(a_op, flat, atol=rtol, btol=rtol, iter_lim=limit)
    x, istop, itn, r1norm, anorm, arnorm = out[0], out[1], out[2], out[3], out[5], out[7]
    if istop == 2:
        residual = float(arnorm / max(anorm * r1norm, np.finfo(float).tiny))
    else:
        residual = float(r1norm / (np.linalg.norm(flat) or 1.0))
    return torch.from_numpy(np.asarray(x)).to(dev, dt), int(itn), istop in (1, 2, 4), residual


def joint_solve_torch(
    op: TorchJointSRHT,
    y: torch.Tensor,
    c: float,
    *,
    method: str = "auto",
    rtol: float = DEFAULT_RTOL,
    seeds: Sequence[int] | None = None,
    maxiter: int | None = None,
) -> tuple[torch.Tensor, SolveInfo]:
    """``A^T f(K) y`` (length d', on the device) and how it was obtained.

    The device twin of :func:`rpsagg._decode.joint_solve`, with the same choice of solver
    and fallbacks. ``seeds`` (the clients' transform seeds) are needed only where the exact
    solver is chosen: it runs on the host with the numpy operator. ``maxiter`` caps the
    Krylov iterations (default as in the numpy decode).
    """
    torch = _torch()
    start = time.perf_counter()
    nk = op.n * op.k
    flat = y.reshape(-1).to(op.dtype)
    if c == 0.0 or op.n == 1:
        xt = op.adjoint(flat.reshape(op.n, op.k))
        return xt, SolveInfo("direct", 0, 0.0, time.perf_counter() - start)
    if method not in ("auto", "exact", "cg"):
        raise ValueError(f"method must be 'auto', 'exact' or 'cg'; got {method!r}")
    chosen = choose_method(nk, op.d_pad, c) if method == "auto" else method
    if chosen == "cg" and c == 1.0:
        xt, iterations, converged, residual = solve_lsqr_torch(op, flat, rtol=rtol,
                                                               maxiter=maxiter)
        if converged or nk > 2 * EXACT_LIMIT:
            return xt, SolveInfo("lsqr", iterations, residual, time.perf_counter() - start)
        chosen = "exact"
    if chosen == "cg":
        z, iterations, converged = solve_krylov_torch(op, flat, c, rtol=rtol, maxiter=maxiter)
        if converged or nk > 2 * EXACT_LIMIT:
            xt = op.adjoint(z.reshape(op.n, op.k))
            m_z = (1.0 - c) * z + c * op.forward(xt).reshape(-1)
            norm_y = float(torch.linalg.vector_norm(flat)) or 1.0
            residual = float(torch.linalg.vector_norm(m_z - flat)) / norm_y
            return xt, SolveInfo("cg", iterations, residual, time.perf_counter() - start)
    # exact (small nk): the numpy code, on the host
    if seeds is None:
        raise ValueError("the exact solver needs the clients' seeds")
    host = JointSRHT.from_seeds(seeds, op.k, op.d_pad)
    y64 = flat.to("cpu", torch.float64).numpy().reshape(op.n, op.k)
    xt_np, info = joint_solve(host, y64, c, method="exact", rtol=rtol)
    xt = torch.from_numpy(xt_np).to(op.device, op.dtype)
    return xt, SolveInfo(info.method, 0, info.residual, time.perf_counter() - start)


def device_joint_solve(
    seeds: Sequence[int],
    y: FloatArray,
    k: int,
    d_pad: int,
    c: float,
    *,
    device: str,
    method: str = "auto",
    rtol: float = DEFAULT_RTOL,
) -> tuple[FloatArray, SolveInfo]:
    """The estimator's entry point: numpy in, numpy out, float64 on ``device``."""
    torch = _torch()
    start = time.perf_counter()
    op = TorchJointSRHT.from_seeds(seeds, k, d_pad, device)
    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64)).to(op.device)
    xt, info = joint_solve_torch(op, yt, c, method=method, rtol=rtol, seeds=seeds)
    out = xt.to("cpu", torch.float64).numpy()
    return out, SolveInfo(info.method, info.iterations, info.residual,
                          time.perf_counter() - start)
