"""The spatial estimators: Rand-k-Spatial and Rand-Proj-Spatial (the transform T at decode)."""

from __future__ import annotations

import copy
import math
from typing import Self

import numpy as np
from numpy.typing import NDArray

from rpsagg._auto import auto_c
from rpsagg._beta import BetaEstimate, rps_beta, spatial_beta
from rpsagg._coordinates import RandK
from rpsagg._decode import DEFAULT_RTOL, joint_solve
from rpsagg._encoded import Encoded
from rpsagg._error import ErrorEstimate, quantization_variance, sketch_error
from rpsagg._error_coef import (
    ErrorCoefficients,
    free_coefficients,
    quantized_relative_extra,
    rps_coefficients,
    spatial_coefficients,
)
from rpsagg._estimator import DecodeResult, Estimator, FloatArray
from rpsagg._projection import (
    encode,
    joint_operator,
    operator_dim,
    resolve_projection,
)
from rpsagg._transform import Transform, parse_transform
from rpsagg._wireprofile import SchemeTraits

SCHEME = "rand-proj-spatial"
#: Message scheme of each projection (the blockwise SRHT adds ``:block=<b>`` to the first).
SCHEMES = {"srht": SCHEME, "dct": SCHEME + ":dct", "hblocks": SCHEME + ":hblocks"}


class _SpatialMixin:
    transform: Transform

    def _init_transform(self, transform: str | float, n: int, prior_r: float | None) -> None:
        self.transform = parse_transform(transform, n, prior_r)

    def with_prior(self, prior_r: float | None) -> Self:
        """A copy whose ``transform="auto"`` uses the prior correlation ``prior_r``."""
        if self.transform.kind != "auto":
            raise ValueError("with_prior needs an estimator built with transform='auto'")
        other = copy.copy(self)
        other.transform = parse_transform("auto", self.transform.n, prior_r)
        return other


class RandKSpatial(RandK, _SpatialMixin):
    """Rand-k-Spatial: Rand-k's encoding, ``x_hat(j) = beta / T(M_j) sum_{i sent j} x_i(j)``."""

    name = "rand-k-spatial"
    traits = SchemeTraits(name, quantizable=True, takes_transform=True, supports_r_hat=True)

    def __init__(
        self, n: int, k: int, d: int, transform: str | float = "avg", prior_r: float | None = None
    ) -> None:
        super().__init__(n, k, d)
        self._init_transform(transform, self.n, prior_r)

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        sums, counts = self._scatter(batch)
        n_prime = len(batch)
        c = self.transform.c_for(n_prime)
        beta = self._beta(n_prime)
        t = (1.0 - c) + c * counts
        est = np.where(counts > 0, beta * sums / np.where(counts > 0, t, 1.0), 0.0)
        coef = spatial_coefficients(n_prime, self.k, self.d, c, beta)
        return DecodeResult(est, n_prime, beta, c, None, 0.0,
                            self._sketch_error(batch, sums, coef))

    def predicted_relative_error(self, r: float) -> float:
        c = self.transform.c_for(self.n)
        coef = spatial_coefficients(self.n, self.k, self.d, c, self._beta(self.n))
        return coef.relative_error(r) + quantized_relative_extra(coef, self.k, self.value_bits, r)

    def _beta(self, n_prime: int) -> float:
        return spatial_beta(n_prime, self.k, self.d, self.transform.c_for(n_prime))

    def __repr__(self) -> str:
        return (
            f"RandKSpatial(n={self.n}, k={self.k}, d={self.d}, T={self.transform.label()}"
            f"{self._bits_label()})"
        )


class RandProjSpatial(Estimator, _SpatialMixin):
    """Rand-Proj-Spatial with a seeded projection: ``x_hat = beta T(S)^+ sum_i G_i^T y_i``.

    Parameters
    ----------
    n, k, d : int
        Clients, per-client budget, dimension.
    transform : {"avg", "max", "one", "auto"} or float
        T; a float R in [0, n-1] selects corr(R). ``auto`` with a prior takes the c of
        :func:`rpsagg._auto.auto_c` (continuous; kept away from 1 where nk is close to d').
    prior_r : float, optional
        Prior correlation for ``transform="auto"``.
    method : {"auto", "exact", "cg"}
        Joint solver.
    rtol : float
        Relative residual target of the matrix-free solver.
    projection : {"auto", "srht", "dct", "hblocks"}
        ``"srht"``: the SRHT on x zero-padded to ``d' = 2^ceil(log2 d)`` (scheme
        ``rand-proj-spatial``); ``"dct"``: the subsampled randomized DCT on x itself (scheme
        ``rand-proj-spatial:dct``, wire format ``rpsagg-seed-v2``); ``"hblocks"``: two
        overlapping Hadamard blocks on x itself (scheme ``rand-proj-spatial:hblocks``,
        ``rpsagg-seed-v4``); ``"auto"``: the SRHT when d is a power of two, hblocks
        otherwise.
    device : str, optional
        Decode on this PyTorch device (``"cuda"``, ``"cuda:1"``, ``"cpu"``; needs the
        ``rpsagg[torch]`` extra) in float64; None (default) decodes with numpy. Encode is
        always numpy. The device decode is for the SRHT projection.
    threads : int, optional
        CPU threads of the numpy SRHT decode (default: every core this process may use);
        the estimate does not depend on it, bit for bit.
    error_tol : float, optional
        The SRHT's numpy decode only: conjugate gradients also stop once their bound on
        the solve's error in the estimate is at most ``error_tol`` times a lower bound on
        the estimator's RMS error (:func:`rpsagg._decode.error_stop_scale`; e.g. 1e-3:
        the estimate moves by at most a thousandth of its own error). None (default):
        the residual target ``rtol`` alone.
    """

    name = SCHEME
    traits = SchemeTraits(name, quantizable=True, takes_transform=True, takes_projection=True,
                          supports_r_hat=True)
    _mixes_all_inputs = True

    def __init__(
        self,
        n: int,
        k: int,
        d: int,
        transform: str | float = "avg",
        prior_r: float | None = None,
        method: str = "auto",
        rtol: float = DEFAULT_RTOL,
        projection: str = "auto",
        device: str | None = None,
        threads: int | None = None,
        error_tol: float | None = None,
    ) -> None:
        super().__init__(n, k, d)
        self._init_transform(transform, self.n, prior_r)
        if threads is not None and (isinstance(threads, bool) or int(threads) < 1):
            raise ValueError(f"threads must be an integer >= 1; got {threads!r}")
        self.threads = None if threads is None else int(threads)
        if device is not None:
            from rpsagg._torch import resolve_device

            device = str(resolve_device(device))
        if method not in ("auto", "exact", "cg"):
            raise ValueError(f"method must be 'auto', 'exact' or 'cg'; got {method!r}")
        if not 0 < rtol < 1:
            raise ValueError(f"rtol must be in (0, 1); got {rtol}")
        self.method = method
        self.rtol = rtol
        self.projection = resolve_projection(projection, self.d)
        self.name = SCHEMES[self.projection]
        #: The dimension the projection acts in: d' (SRHT, padded) or d (DCT, hblocks).
        self.d_pad = operator_dim(self.projection, self.d)
        if device is not None and self.projection != "srht":
            raise ValueError(f"device decoding supports the SRHT projection; this estimator "
                             f"uses {self.projection!r} (d = {self.d}); pass projection='srht' "
                             "to decode on a device")
        self.device = device
        if error_tol is not None:
            if isinstance(error_tol, bool) or not 0 < float(error_tol) < 1:
                raise ValueError(f"error_tol must be in (0, 1); got {error_tol!r}")
            if self.projection != "srht" or device is not None:
                raise ValueError("error_tol applies to the SRHT's numpy decode only")
            error_tol = float(error_tol)
        self.error_tol = error_tol

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        return encode(self.projection, x, seed, self.k), None

    def _decode(self, batch: list[Encoded], beta: float | None = None) -> DecodeResult:
        """Decode; ``beta`` (from :meth:`beta_for`) may be given by a caller that computed
        it once for several decodes (the Ray backend passes it to its tasks)."""
        n_prime = len(batch)
        seeds = [m.seed for m in batch]
        y = np.stack([m.values.astype(np.float64) for m in batch])
        c = self._c_for(n_prime)
        if self.device is not None:
            from rpsagg._torch import device_joint_solve

            xt, info = device_joint_solve(seeds, y, self.k, self.d_pad, c, device=self.device,
                                          method=self.method, rtol=self.rtol)
        else:
            op = joint_operator(self.projection, seeds, self.k, self.d_pad,
                                threads=self.threads)
            xt, info = joint_solve(op, y, c, method=self.method, rtol=self.rtol,
                                   error_tol=self.error_tol)
        beta = self._beta(n_prime) if beta is None else beta
        adjoint_sq = info.adjoint_sq
        if adjoint_sq is None:  # a solver that did not record it: one more adjoint product
            back = joint_operator(self.projection, seeds, self.k, self.d_pad,
                                  threads=self.threads).adjoint(y)
            adjoint_sq = float(back @ back)
        error = self.error_from_sketches(batch, y, adjoint_sq, c, beta)
        return DecodeResult(beta * xt[: self.d], n_prime, beta, c, info, 0.0, error)

    def error_from_sketches(self, batch: list[Encoded], y: FloatArray, adjoint_sq: float,
                            c: float, beta: float) -> ErrorEstimate:
        """The error estimate of a decode of ``batch`` (values ``y``, ``||A^T y||^2``, its c
        and beta): :func:`rpsagg._error.sketch_error` with this projection's coefficients;
        the padded SRHT keeps ``d / d'`` of the error (it spreads evenly over d')."""
        coef = rps_coefficients(len(batch), self.k, self.d_pad, c, beta, self.projection)
        qvar = np.array([quantization_variance(m) for m in batch])
        return sketch_error(y, adjoint_sq, self.d_pad, self.k, coef, qvar=qvar,
                            keep=self.d / self.d_pad)

    def coefficients(self, n_prime: int | None = None, r: float | None = None
                     ) -> ErrorCoefficients:
        """``a`` and ``b`` of the MSE's form for ``n_prime`` messages (default n); for
        ``transform="auto"``, ``r`` is the prior correlation the transform is chosen for."""
        n_prime = self.n if n_prime is None else n_prime
        other = self.with_prior(r) if (self.transform.kind == "auto" and r is not None) else self
        c = other._c_for(n_prime)
        return rps_coefficients(n_prime, self.k, self.d_pad, c, other._beta(n_prime),
                                self.projection)

    def predicted_relative_error(self, r: float) -> float:
        """Predicted relative error ``E||x_hat - x_bar||^2 / ||x_bar||^2`` at correlation R
        for n messages (``auto`` takes R as its prior); padded SRHT scaled by ``d / d'``.

        For planning, so always the closed form: the free-probability limit
        (:func:`rpsagg._error_coef.free_coefficients`, microseconds, no Monte Carlo and no
        beta), infinite where the limit is (c = 1 at nk = D, the hard edge).
        """
        other = self.with_prior(r) if self.transform.kind == "auto" else self
        coef = free_coefficients(self.n, self.k, self.d_pad, other._c_for(self.n))
        if not (math.isfinite(coef.a) and math.isfinite(coef.b)):
            return math.inf
        extra = quantized_relative_extra(coef, self.k, self.value_bits, r)
        return (coef.relative_error(r) + extra) * self.d / self.d_pad

    def _c_for(self, n_prime: int) -> float:
        """c of T for ``n_prime`` messages.

        ``auto`` with a prior: :func:`rpsagg._auto.auto_c` of the prior's correlation
        fraction at ``n_prime`` clients, a pure function of ``(n', k, d', R)``, so a server
        that persisted the prior derives the same c; otherwise :meth:`Transform.c_for`.
        """
        t = self.transform
        if t.kind == "auto" and t.r is not None and n_prime > 1:
            frac = min(1.0, max(0.0, t.r / (t.n - 1))) if t.n > 1 else 0.0
            return auto_c(n_prime, self.k, self.d_pad, frac * (n_prime - 1))
        return t.c_for(n_prime)

    def _beta(self, n_prime: int) -> float:
        return self._beta_estimate(n_prime).beta

    def _beta_estimate(self, n_prime: int) -> BetaEstimate:
        c = self._c_for(n_prime)
        return rps_beta(n_prime, self.k, self.d_pad, c, projection=self.projection)

    def with_device(self, device: str | None) -> Self:
        """A copy that decodes on ``device`` (a PyTorch device, or None for numpy)."""
        other = copy.copy(self)
        if device is not None and self.error_tol is not None:
            raise ValueError("error_tol applies to the SRHT's numpy decode only")
        if device is not None:
            from rpsagg._torch import resolve_device

            device = str(resolve_device(device))
        other.device = device
        return other

    def with_threads(self, threads: int | None) -> Self:
        """A copy whose numpy decode runs ``threads`` threads (None: every core)."""
        if threads is not None and (isinstance(threads, bool) or int(threads) < 1):
            raise ValueError(f"threads must be an integer >= 1; got {threads!r}")
        other = copy.copy(self)
        other.threads = None if threads is None else int(threads)
        return other

    def beta_details(self, n_prime: int | None = None) -> BetaEstimate:
        """The :class:`~rpsagg._beta.BetaEstimate` behind ``beta_for(n_prime)``."""
        n_prime = self.n if n_prime is None else n_prime
        self.beta_for(n_prime)  # validates n_prime
        return self._beta_estimate(n_prime)

    def __repr__(self) -> str:
        return (
            f"RandProjSpatial(n={self.n}, k={self.k}, d={self.d}, T={self.transform.label()}, "
            f"projection={self.projection}{self._bits_label()})"
        )
