"""Joint decoding of SRHT and randomized-DCT sketches without forming S (d' x d').

``T(S)^+ A^T y = A^T f(K) y`` with ``K = A A^T`` (nk x nk) and ``f = 1/T`` on the non-zero
spectrum of K. For the affine ``T(l) = (1 - c) + c l`` this is ``A^T ((1-c) I + c K)^-1 y``
(``c < 1``) or ``A^T K^+ y`` (``c = 1``). Two solvers:

* ``exact``: build K from one FWHT per pair of clients and factorize it (Cholesky with a
  condition check, falling back to an eigendecomposition for singular systems).
* ``cg``: matrix-free Krylov iterations; each product with K costs n forward and n adjoint
  FWHTs. For ``c < 1`` conjugate gradients on ``M = (1-c) I + c K`` (positive definite). For
  ``c = 1``, ``A^T K^+ y = A^+ y`` is the minimum-norm least-squares solution of
  ``A x = y``, which LSQR on A finds directly; it handles a singular K and is better
  conditioned than any Krylov method on K itself.

``method="auto"`` (:func:`choose_method`) picks the exact solver when nk is small, and for
``c = 1`` when nk is close to d' (where LSQR stalls); the matrix-free one otherwise. For the
randomized DCT and hblocks, whose Gram matrix is built from dense rows (``(nk)^2 d``), a
small system still goes to the matrix-free solver unless the Gram matrix is the cheaper of
the two (``JointDCT.exact_cheaper``). Neither
raises on a singular system.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # scipy is imported lazily: encoding clients never load it
    from scipy.sparse.linalg import LinearOperator

    from rpsagg._projection import JointOperator

FloatArray = NDArray[np.float64]
log = logging.getLogger("rpsagg")

EXACT_ALWAYS = 512  # nk at or below which the exact solver is always used
EXACT_LIMIT = 4096  # largest nk for which the exact solver is chosen automatically
# Krylov stopping rule. The solver's relative error in A^T z is at most about cond(M) * rtol
# (cond(M) < 10 where the matrix-free path is chosen, nk <= d'/4), i.e. <= 1e-5 relative,
# deterministic given the round's seeds. That is two orders below the relative bias left by
# beta's Monte Carlo (standard error <= 1e-3) and five below the estimator's own relative
# error (sqrt(d'/(nk) - 1) >= 1 in the regime nk <= d'/2), so tighter solves buy nothing.
DEFAULT_RTOL = 1e-6
_RCOND_MIN = 1e-12


@dataclass(frozen=True)
class SolveInfo:
    """How a joint decode was solved.

    Attributes
    ----------
    method : str
        ``"exact-cholesky"``, ``"exact-eigh"``, ``"exact-svd"``, ``"cg"``, ``"lsqr"`` or
        ``"direct"`` (no system to solve: ``c = 0`` or one message).
    iterations : int
        Krylov iterations (0 for exact solvers).
    residual : float
        Relative residual ``||M z - y|| / ||y||``; for ``c = 1`` with a rank-deficient K
        (where ``A x = y`` is inconsistent) the least-squares criterion
        ``||A^T (A x - y)|| / (||A|| ||A x - y||)`` instead.
    seconds : float
        Wall-clock time of the solve.
    adjoint_sq : float or None
        ``||A^T y||^2 = y^T K y`` of the received sketches, which the error estimate needs
        (:mod:`rpsagg._error`). Every solver computes ``K y`` or ``A^T y`` on its way (the
        first Krylov product, the first LSQR step, the Gram matrix, the direct adjoint), so
        it costs one dot product; None where a solver did not record it.
    """

    method: str
    iterations: int
    residual: float
    seconds: float
    adjoint_sq: float | None = None


def choose_method(nk: int, d_pad: int, c: float = 1.0) -> str:
    """Solver picked by ``method="auto"`` for a system of size nk in dimension d'.

    For ``c < 1`` the system matrix ``M = (1-c) I + c K`` has eigenvalues in
    ``[1 - c, 1 - c + c lambda_max(K)]`` whatever nk/d' is, so conjugate gradients converge
    in tens of iterations (21 to rtol 1e-10 at n, k, d = 20, 100, 4096) and beat a Cholesky
    factorization from nk ~ 500 on. For ``c = 1`` (max) K itself must be inverted; its
    smallest eigenvalues approach 0 as nk approaches d', where LSQR stalls and the exact
    solver is used.
    """
    if nk <= EXACT_ALWAYS:
        return "exact"
    if c < 1.0:
        return "cg"
    if nk <= EXACT_LIMIT and 4 * nk > d_pad:
        return "exact"
    return "cg"


def eig_tolerance(w_max: float, nk: int, d_pad: int) -> float:
    """Eigenvalues of K below this count as zero (numpy ``matrix_rank``'s rule on S).

    Parameters
    ----------
    w_max : float
        Largest eigenvalue of K.
    nk, d_pad : int
        Size of K and the dimension the projections act in.

    Returns
    -------
    float
        ``max(w_max, 1) max(nk, d') eps``.
    """
    return max(w_max, 1.0) * max(nk, d_pad) * float(np.finfo(np.float64).eps)


def _spectral_apply(
    gram: FloatArray, y: FloatArray, c: float, d_pad: int
) -> tuple[FloatArray, str]:
    import scipy.linalg

    nk = gram.shape[0]
    try:
        w, v = scipy.linalg.eigh(gram, check_finite=False)
        method = "exact-eigh"
    except (np.linalg.LinAlgError, ValueError):
        u, s, _ = scipy.linalg.svd(gram, lapack_driver="gesvd", check_finite=False)
        w, v = s, u
        method = "exact-svd"
    tol = eig_tolerance(float(np.max(w)), nk, d_pad)
    t = (1.0 - c) + c * w
    f = np.where(w > tol, 1.0 / np.where(w > tol, t, 1.0), 0.0)
    return np.asarray(v @ (f * (v.T @ y))), method


def solve_exact(gram: FloatArray, y: FloatArray, c: float, d_pad: int) -> tuple[FloatArray, str]:
    """``f(K) y`` from the explicit Gram matrix; never raises on a singular K."""
    import scipy.linalg

    nk = gram.shape[0]
    m = c * gram
    m[np.diag_indices(nk)] += 1.0 - c
    try:
        factor, lower = scipy.linalg.cho_factor(m, lower=True, check_finite=False)
        anorm = float(np.abs(m).sum(axis=0).max())
        rcond, info = scipy.linalg.lapack.dpocon(factor, anorm, uplo="L")
        if info == 0 and rcond > _RCOND_MIN:
            return scipy.linalg.cho_solve((factor, lower), y, check_finite=False), "exact-cholesky"
    except np.linalg.LinAlgError:
        pass
    return _spectral_apply(gram, y, c, d_pad)


def system_operator(
    op: JointOperator, c: float, first: dict[str, FloatArray] | None = None
) -> LinearOperator:
    """``M = (1 - c) I + c K`` as a matrix-free operator on vectors of length nk.

    ``first``, when given, receives the first product's input (``"v"``) and ``K v``
    (``"kv"``): conjugate gradients from a zero start multiply y first, and ``y^T K y`` is
    what the error estimate needs.
    """
    from scipy.sparse.linalg import LinearOperator

    n, k = op.n, op.k

    def matvec(v: FloatArray) -> FloatArray:
        v = np.asarray(v, dtype=np.float64).reshape(n, k)
        kv = op.forward(op.adjoint(v))
        if first is not None and not first:
            first["v"], first["kv"] = v.reshape(-1).copy(), kv.reshape(-1).copy()
        return ((1.0 - c) * v + c * kv).reshape(-1)

    return LinearOperator((n * k, n * k), matvec=matvec, rmatvec=matvec, dtype=np.float64)


def one_blas_thread() -> contextlib.AbstractContextManager[object]:
    """One BLAS thread inside the block, where threadpoolctl exists (else a no-op).

    For the Monte Carlo's small factorizations and the Krylov solvers' vector operations:
    their vectors and matrices are at most a few thousand wide, or nk long, so a second
    thread gains little there, while OpenBLAS threads keep spinning after each call and
    take cores from the products' own threads. Measured: on a loaded machine one 256 x 1024
    SVD took 1.7 s instead of 0.03 s; the CG decode at (100, 1024, 2^20) with 2 product
    threads took 1.8-2.9 s with 2 OpenBLAS threads and 1.4-1.5 s with 1
    (docs/scaling.md). It also keeps the solvers' dot products, and so the decode's bits,
    independent of the BLAS thread count.

    The BLAS libraries are found once per process (a ``threadpoolctl.ThreadpoolController``
    made on the first call, after numpy's and scipy's are loaded): finding them scans the
    process's libraries, about 1 ms, which a blockwise decode would otherwise pay per block.

    Returns
    -------
    contextlib.AbstractContextManager
        The controller's ``limit(limits=1, user_api="blas")``, or a null context.
    """
    global _CONTROLLER
    if _CONTROLLER is None:
        import scipy.linalg  # noqa: F401  (load scipy's own BLAS first, so the limit covers it)

        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _CONTROLLER = False
        else:
            _CONTROLLER = ThreadpoolController()
    if _CONTROLLER is False:
        return contextlib.nullcontext()
    return _CONTROLLER.limit(limits=1, user_api="blas")


#: the process's threadpoolctl controller (False: threadpoolctl is not installed)
_CONTROLLER: Any = None


def solve_krylov(
    op: JointOperator,
    y: FloatArray,
    c: float,
    *,
    rtol: float = DEFAULT_RTOL,
    maxiter: int | None = None,
    x0: FloatArray | None = None,
    first: dict[str, FloatArray] | None = None,
    atol: float = 0.0,
) -> tuple[FloatArray, int, bool]:
    """``((1 - c) I + c K)^-1 y`` by conjugate gradients (``c < 1``).

    Returns the solution, the iteration count and whether the tolerance was reached;
    ``first`` receives the first product (see :func:`system_operator`).
    """
    from scipy.sparse.linalg import cg

    if not c < 1.0:
        raise ValueError("conjugate gradients need c < 1; use solve_lsqr for c = 1")
    iters = 0

    def count(_: FloatArray) -> None:
        nonlocal iters
        iters += 1

    nk = op.n * op.k
    maxiter = maxiter if maxiter is not None else max(200, min(nk, 2000))
    with one_blas_thread():  # the products run their own threads
        z, info = cg(system_operator(op, c, first), y, x0=x0, rtol=rtol, atol=atol,
                     maxiter=maxiter, callback=count)
    return np.asarray(z), iters, info == 0


def solve_lsqr(
    op: JointOperator, y: FloatArray, *, rtol: float = DEFAULT_RTOL, maxiter: int | None = None,
    first: dict[str, FloatArray] | None = None,
) -> tuple[FloatArray, int, bool, float]:
    """``A^+ y = A^T K^+ y`` (length d') by LSQR on the matrix-free A.

    Returns the solution, iterations, convergence flag and the stopping residual. ``first``,
    when given, receives the first adjoint product's input (``"u"``, LSQR's ``y / ||y||``)
    and output (``"atu"``).
    """
    from scipy.sparse.linalg import LinearOperator, lsqr

    n, k, d_pad = op.n, op.k, op.d_pad

    def rmatvec(z: FloatArray) -> FloatArray:
        out = op.adjoint(np.asarray(z, dtype=np.float64).reshape(n, k))
        if first is not None and not first:
            first["u"], first["atu"] = np.asarray(z, dtype=np.float64).copy(), out.copy()
        return out

    a_op = LinearOperator(
        (n * k, d_pad),
        matvec=lambda u: op.forward(np.asarray(u, dtype=np.float64)).reshape(-1),
        rmatvec=rmatvec,
        dtype=np.float64,
    )
    limit = maxiter if maxiter is not None else max(200, min(n * k, 4000))
    with one_blas_thread():  # the products run their own threads
        out = lsqr(a_op, y, atol=rtol, btol=rtol, iter_lim=limit)
    x, istop, itn, r1norm, anorm, arnorm = out[0], out[1], out[2], out[3], out[5], out[7]
    if istop == 2:  # least-squares stop: A x = y is inconsistent (K singular)
        residual = float(arnorm / max(anorm * r1norm, np.finfo(float).tiny))
    else:
        residual = float(r1norm / (np.linalg.norm(y) or 1.0))
    return np.asarray(x), int(itn), istop in (1, 2, 4), residual


def _gram_worth_building(op: JointOperator, nk: int, c: float) -> bool:
    """Whether ``method="auto"``, having picked the exact solver, should build the Gram matrix.

    The SRHT's costs ``n^2 / 2`` FWHTs: always affordable, and cheaper than a Krylov solve's
    ``~40 n``, where :func:`choose_method` picks it. The DCT's and hblocks' are built from
    their dense sampled rows (``(nk)^2 d``) and answer for themselves: affordable
    (:meth:`rpsagg._dct.JointDCT.exact_affordable`), and cheaper than a Krylov solve
    (:meth:`rpsagg._dct.JointDCT.exact_cheaper`) unless the system needs the exact solver
    for conditioning (``c = 1`` with nk close to d', where LSQR stalls).
    """
    def says(name: str) -> bool:
        check = getattr(op, name, None)
        return True if check is None else bool(check())

    if not says("exact_affordable"):
        return False
    return (c == 1.0 and 4 * nk > op.d_pad) or says("exact_cheaper")


def joint_solve(
    op: JointOperator,
    y: FloatArray,
    c: float,
    *,
    method: str = "auto",
    rtol: float = DEFAULT_RTOL,
    error_tol: float | None = None,
) -> tuple[FloatArray, SolveInfo]:
    """Return ``A^T f(K) y`` (length d') and how it was obtained.

    Parameters
    ----------
    op : JointSRHT or JointDCT
        The clients' transforms (``op.d_pad`` is the dimension they act in).
    y : ndarray, shape (n, k)
        Received sketches (float64).
    c : float
        Transform coefficient, ``T(l) = (1 - c) + c l``.
    method : {"auto", "exact", "cg"}
        Solver choice.
    rtol : float
        Relative residual target of the Krylov solver.
    error_tol : float, optional
        SRHT only, conjugate gradients (``c < 1``): also stop once the solve's bound on its
        error in the estimate is at most ``error_tol`` times a lower bound on the
        estimator's own RMS error (:func:`error_stop_scale`); None: ``rtol`` alone.
    """
    start = time.perf_counter()
    nk = op.n * op.k
    flat = np.asarray(y, dtype=np.float64).reshape(-1)
    if c == 0.0 or op.n == 1:
        # T(l) = 1 on the spectrum that A^T sees (or K = I): f(K) y = y.
        direct = op.adjoint(flat.reshape(op.n, op.k))
        return direct, SolveInfo("direct", 0, 0.0, time.perf_counter() - start,
                                 float(direct @ direct))
    if method not in ("auto", "exact", "cg"):
        raise ValueError(f"method must be 'auto', 'exact' or 'cg'; got {method!r}")
    chosen = choose_method(nk, op.d_pad, c) if method == "auto" else method
    if method == "auto" and chosen == "exact" and not _gram_worth_building(op, nk, c):
        chosen = "cg"  # the DCT's/hblocks' Gram matrix costs more than a Krylov solve
    adjoint_sq: float | None = None
    if chosen == "cg" and c == 1.0:
        first: dict[str, FloatArray] = {}
        xt, iterations, converged, residual = solve_lsqr(op, flat, rtol=rtol, first=first)
        adjoint_sq = _first_adjoint_sq(first, flat)
        if converged or nk > 2 * EXACT_LIMIT:
            return xt, SolveInfo("lsqr", iterations, residual, time.perf_counter() - start,
                                 adjoint_sq)
        log.warning("LSQR did not converge (nk=%d); falling back to the exact solver", nk)
        chosen = "exact"
    iterations = 0
    name = "cg"
    relaxed = 0.0
    if chosen == "cg" and error_tol is not None:
        relaxed = error_tol * error_stop_scale(c, nk, op.d_pad)
    if chosen == "cg":
        first = {}
        # the first pass aims at half the relaxed bound (with ||A^T z|| ~ ||y||, K ~ I),
        # so that the check below rarely needs a second pass
        z, iterations, converged = solve_krylov(op, flat, c, rtol=max(rtol, relaxed / 2),
                                                first=first)
        if "v" in first and np.array_equal(first["v"], flat):
            adjoint_sq = float(flat @ first["kv"])
        if not converged:
            if nk <= 2 * EXACT_LIMIT:
                log.warning("CG did not converge (nk=%d); falling back to the exact solver", nk)
                chosen, iterations = "exact", 0
            else:
                log.warning("CG did not converge (nk=%d); the estimate is approximate", nk)
    if chosen == "exact":
        gram = op.gram()
        if adjoint_sq is None:
            adjoint_sq = float(flat @ (gram @ flat))
        z, name = solve_exact(gram, flat, c, op.d_pad)
    xt = op.adjoint(z.reshape(op.n, op.k))
    # Residual of M z = y, reusing A^T z: M z = (1 - c) z + c A (A^T z). For c = 1 and a
    # rank-deficient K it includes the part of y outside range(K), which A^T removes.
    m_z = (1.0 - c) * z + c * op.forward(xt).reshape(-1)
    norm_y = float(np.linalg.norm(flat)) or 1.0
    residual = float(np.linalg.norm(m_z - flat)) / norm_y
    passes = 0
    while name == "cg" and relaxed > rtol / 2 and passes < 3:
        # error_tol: accept ||M z - y|| <= relaxed ||A^T z|| (or the plain rtol); else
        # go on from z to half that bound (the recurrence's residual), then check again
        bound = relaxed * float(np.linalg.norm(xt))
        if residual * norm_y <= max(bound, rtol * norm_y):
            break
        passes += 1
        z, more, _ = solve_krylov(op, flat, c, rtol=rtol, x0=z, atol=bound / 2 if passes < 3
                                  else 0.0)
        iterations += more
        xt = op.adjoint(z.reshape(op.n, op.k))
        m_z = (1.0 - c) * z + c * op.forward(xt).reshape(-1)
        residual = float(np.linalg.norm(m_z - flat)) / norm_y
    return xt, SolveInfo(name, iterations, residual, time.perf_counter() - start, adjoint_sq)


def error_stop_scale(c: float, nk: int, d_pad: int) -> float:
    """``s`` such that ``||M z - y|| <= error_tol * s * ||A^T z||`` keeps the solve's error
    in the estimate below ``error_tol`` times the estimator's RMS error (SRHT, ``c < 1``).

    The solve's error: ``z - z* = -M^-1 r`` with ``r = M z - y``, so the estimate moves by
    ``beta A^T M^-1 r``, whose norm is at most ``beta ||r|| max_l sqrt(l) / (1 - c + c l)``
    over the eigenvalues l of K, and ``1 - c + c l >= 2 sqrt(c (1 - c) l)`` (AM-GM): at
    most ``beta ||r|| / (2 sqrt(c (1 - c)))``.

    The estimator's error: ``x_hat = beta A^T z*`` lies in the row space of A, so
    ``||x_hat - x_bar|| >= ||(I - P) x_bar||`` with P the projection on it; by the SRHT's
    symmetry (``docs/math.md``, "The unbiasing scalar beta") ``E[P] = (E rank / d') I`` with rank
    <= nk, so ``MSE >= (1 - rho) ||x_bar||^2``, ``rho = nk / d'``. With unbiasedness,
    ``E||x_hat||^2 = ||x_bar||^2 + MSE <= MSE (2 - rho) / (1 - rho)``, i.e.
    ``MSE >= E||x_hat||^2 (1 - rho) / (2 - rho)``; the decode's own ``||x_hat|| =
    beta ||A^T z||`` stands for its RMS value (its square concentrates at large d').

    Both together: ``s = 2 sqrt(c (1 - c)) sqrt((1 - rho) / (2 - rho))``; 0 (no relaxed
    stop) where ``c`` is 0 or 1 or ``nk >= d'``.
    """
    rho = nk / d_pad
    if not 0.0 < c < 1.0 or rho >= 1.0:
        return 0.0
    return 2.0 * float(np.sqrt(c * (1.0 - c))) * float(np.sqrt((1.0 - rho) / (2.0 - rho)))


def _first_adjoint_sq(first: dict[str, FloatArray], y: FloatArray) -> float | None:
    """``||A^T y||^2`` from LSQR's first step (``A^T (y / ||y||)``), if it was that."""
    if "u" not in first:
        return None
    norm = float(np.linalg.norm(y))
    if norm == 0.0:
        return 0.0
    if not np.allclose(first["u"] * norm, y, rtol=1e-12, atol=0.0):
        return None
    return float(first["atu"] @ first["atu"]) * norm * norm
