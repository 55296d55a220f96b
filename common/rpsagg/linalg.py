"""The joint decode's linear algebra: the transform T and the solvers.

Rand-Proj-Spatial decodes ``beta A^T f(K) y`` with ``K = A A^T`` (nk x nk) and the
transform ``T(l) = (1 - c) + c l`` (:func:`parse_transform` turns the user's ``transform``
argument into c). :func:`joint_solve` picks the exact solver (Cholesky or an
eigendecomposition of K) or a matrix-free Krylov solver (conjugate gradients; LSQR for
``c = 1``) and reports which in a :class:`SolveInfo`. ``docs/performance.md`` has the
figures behind the choice.
"""

from rpsagg._decode import (
    DEFAULT_RTOL,
    EXACT_LIMIT,
    SolveInfo,
    eig_tolerance,
    joint_solve,
    one_blas_thread,
)
from rpsagg._transform import Transform, parse_transform

__all__ = [
    "DEFAULT_RTOL",
    "EXACT_LIMIT",
    "SolveInfo",
    "Transform",
    "eig_tolerance",
    "joint_solve",
    "one_blas_thread",
    "parse_transform",
]
