"""Benchmark of Rand-Proj-Spatial's beta: cold time of each path, and the free path's error.

Two tables:

1. Cold beta (``rpsagg.beta.rps_beta`` on an empty memory and disk cache) over the issue's
   domain ``n <= 1000, nk <= 2^17, d <= 2^20``: the path :func:`rpsagg.beta.beta_path`
   chooses, the seconds it took and the stated relative error (the Monte Carlo's standard
   error, or the free limit's bound). Target: <= 2 s everywhere.
2. Error of the free limit against a Monte Carlo reference of ``samples`` exact spectra per
   case (fixed seeds): the difference, its size in reference standard errors (z), and the
   stated bound. Target: within 2e-3 relative where the free path is chosen.

Usage::

    python bench/beta_paths.py             # both tables (several minutes on 2 cores)
    python bench/beta_paths.py --quick     # a few cases of each
    python bench/beta_paths.py --long      # also the issue's two slow cases (nk > d')
                                           # against Hutchinson in R^{d'} (minutes)
    python bench/beta_paths.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from rpsagg import beta as rbeta
from rpsagg.beta import free_error_bound, free_spectral_sum

# (n, k, d', c); c = -1 stands for avg, n / (2(n - 1))
COLD_CASES = [
    (200, 128, 4096, -1.0),
    (1000, 64, 4096, -1.0),
    (1000, 131, 2**20, -1.0),
    (1000, 1, 2**20, 0.9),
    (2, 2**16, 2**20, 0.99),
    (100, 1024, 2**20, 1.0),
    (1000, 128, 64, 0.5),
    (20, 100, 4096, 0.3),
    # the largest problems the rule sends to the Monte Carlo
    (256, 1, 1024, -1.0),
    (32, 8, 1024, 0.9),
    (8, 32, 512, 0.99),
    (64, 4, 256, 0.999),
    (8, 8, 64, 0.9),
    (1000, 1, 64, 0.5),
]
QUICK_COLD = [(200, 128, 4096, -1.0), (1000, 64, 4096, -1.0), (32, 8, 1024, 0.9), (8, 8, 64, 0.9)]

# (n, k, d', samples); every case at each of ERROR_CS
ERROR_CASES = [
    (8, 8, 64, 300),
    (2, 32, 64, 300),
    (16, 8, 128, 200),
    (2, 128, 256, 200),
    (16, 16, 256, 200),
    (256, 1, 256, 200),
    (4, 128, 512, 100),
    (512, 1, 512, 60),
    (16, 8, 512, 150),
    (16, 64, 256, 100),
    (8, 128, 1024, 30),
    (32, 8, 1024, 60),
    (16, 16, 4096, 100),
    (64, 16, 128, 80),
    (1000, 2, 128, 60),
]
QUICK_ERROR = [(8, 8, 64, 100), (16, 16, 256, 60), (4, 128, 512, 30)]
ERROR_CS = (0.5, 0.9, 0.99)
LONG_CASES = [(200, 128, 4096, -1.0), (1000, 64, 4096, -1.0)]


@dataclass
class ColdRow:
    """One cold beta."""

    n: int
    k: int
    d_pad: int
    c: float
    path: str
    method: str
    seconds: float
    beta: float
    rel_error: float


@dataclass
class ErrorRow:
    """The free limit against a Monte Carlo reference."""

    n: int
    k: int
    d_pad: int
    c: float
    samples: int
    mc_mean: float
    mc_se: float
    free: float
    rel_error: float
    z: float
    bound: float
    path: str


def _c(n: int, c: float) -> float:
    return n / (2.0 * (n - 1)) if c < 0 else c


def cold(cases: list[tuple[int, int, int, float]]) -> list[ColdRow]:
    """Time ``rps_beta`` on an empty cache for each case."""
    rows = []
    for n, k, d_pad, c_spec in cases:
        c = _c(n, c_spec)
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["RPSAGG_CACHE_DIR"] = tmp
            rbeta.clear_memory_cache()
            start = time.perf_counter()
            est = rbeta.rps_beta(n, k, d_pad, c)
            seconds = time.perf_counter() - start
        path = rbeta.beta_path(n, k, d_pad, c)
        rows.append(ColdRow(n, k, d_pad, c, path, est.method, seconds, est.beta, est.rel_se))
        print(
            f"{n:>5} {k:>6} {d_pad:>8} {c:>7.4g} {path:>5} {est.method:>8} "
            f"{seconds:>8.3f} {est.beta:>10.6g} {est.rel_se:>9.1e}",
            flush=True,
        )
    return rows


def errors(cases: list[tuple[int, int, int, int]], cs: tuple[float, ...]) -> list[ErrorRow]:
    """The free limit against ``samples`` exact Monte Carlo spectra per case."""
    rows = []
    for n, k, d_pad, samples in cases:
        for c in cs:
            vals = np.array([rbeta.spectral_sample(n, k, d_pad, c, s)[0] for s in range(samples)])
            mean = float(vals.mean())
            se = float(vals.std(ddof=1) / math.sqrt(samples))
            free = free_spectral_sum(n, k, d_pad, c)
            rel = (free - mean) / mean
            z = (free - mean) / se if se > 0 else 0.0
            bound = free_error_bound(n, k, d_pad, c)
            path = rbeta.beta_path(n, k, d_pad, c)
            rows.append(ErrorRow(n, k, d_pad, c, samples, mean, se, free, rel, z, bound, path))
            print(
                f"{n:>5} {k:>5} {d_pad:>6} {n * k / d_pad:>6.3g} {c:>6.3g} {samples:>5} "
                f"{mean:>11.4f} {se:>8.4f} {free:>11.4f} {free - mean:>+8.4f} {rel:>+10.2e} "
                f"{z:>+6.1f} {bound:>8.1e} {path:>5}",
                flush=True,
            )
    return rows


def dprime_hutchinson_sample(n: int, k: int, d_pad: int, c: float, sample: int) -> float:
    """One unbiased sample of ``tr(S ((1-c) I + c S)^-1)`` by Hutchinson in ``R^{d'}``.

    For nk > d' this has far less variance than the library's nk-dimensional Hutchinson
    (whose ``M^-1`` carries nk - d' eigenvalues ``1/(1-c)`` on K's null space, which a
    Rademacher probe in the sketch basis sees as large off-diagonal entries). Same seeds
    as the library's Monte Carlo; the probe is a fixed-seed Rademacher vector.
    """
    from scipy.sparse.linalg import LinearOperator, cg

    from rpsagg.projections import JointSRHT

    op = JointSRHT.from_seeds(rbeta.mc_seeds(sample, n), k, d_pad)

    def matvec(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        return (1.0 - c) * v + c * op.adjoint(op.forward(v))

    z = np.where(np.random.default_rng([sample, 0x5EED]).random(d_pad) < 0.5, -1.0, 1.0)
    x, info = cg(LinearOperator((d_pad, d_pad), matvec=matvec), z, rtol=1e-10, maxiter=1000)
    assert info == 0
    return float((d_pad - (1.0 - c) * float(z @ x)) / c)


def long_reference(cases: list[tuple[int, int, int, float]]) -> list[ErrorRow]:
    """The issue's slow cases (nk > d'): Hutchinson in R^{d'} to a 2e-4 relative s.e."""
    rows = []
    for n, k, d_pad, c_spec in cases:
        c = _c(n, c_spec)
        start = time.perf_counter()
        vals: list[float] = []
        while True:
            vals.append(dprime_hutchinson_sample(n, k, d_pad, c, len(vals)))
            if len(vals) >= 10:
                arr = np.asarray(vals)
                se = float(arr.std(ddof=1) / math.sqrt(arr.size))
                if se <= 2e-4 * abs(arr.mean()) or time.perf_counter() - start > 1800:
                    break
        seconds = time.perf_counter() - start
        mean = float(np.mean(vals))
        free = free_spectral_sum(n, k, d_pad, c)
        rel = (free - mean) / mean
        row = ErrorRow(
            n,
            k,
            d_pad,
            c,
            len(vals),
            mean,
            se,
            free,
            rel,
            (free - mean) / se,
            free_error_bound(n, k, d_pad, c),
            rbeta.beta_path(n, k, d_pad, c),
        )
        rows.append(row)
        print(
            f"{n:>5} {k:>5} {d_pad:>6} {c:>7.4g} MC {mean:.4f} +- {se:.4f} "
            f"({len(vals)} samples, {seconds:.0f} s), free {free:.4f}: rel {rel:+.2e}, "
            f"z {row.z:+.1f}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few cases of each table")
    parser.add_argument("--long", action="store_true", help="also the two slow Hutchinson runs")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args(argv)

    print("Cold beta (empty cache); target <= 2 s")
    print(
        f"{'n':>5} {'k':>6} {'d_pad':>8} {'c':>7} {'path':>5} {'method':>8} {'seconds':>8} "
        f"{'beta':>10} {'rel err':>9}"
    )
    cold_rows = cold(QUICK_COLD if args.quick else COLD_CASES)

    print("\nFree limit against Monte Carlo (exact spectra, fixed seeds); target 2e-3 where free")
    print(
        f"{'n':>5} {'k':>5} {'d_pad':>6} {'nk/d':>6} {'c':>6} {'S':>5} {'MC mean':>11} "
        f"{'MC se':>8} {'free':>11} {'diff':>8} {'rel':>10} {'z':>6} {'bound':>8} {'path':>5}"
    )
    with rbeta.one_blas_thread():  # as the library's own Monte Carlo
        err_rows = errors(QUICK_ERROR if args.quick else ERROR_CASES, ERROR_CS)
    long_rows = long_reference(LONG_CASES) if args.long else []

    slow = [r for r in cold_rows if r.seconds > 2.0]
    off = [r for r in err_rows + long_rows if r.path == "free" and abs(r.rel_error) > 2e-3]
    print(
        f"\ncold beta over 2 s: {len(slow)} of {len(cold_rows)}; free path off by more than "
        f"2e-3: {len(off)} of {sum(r.path == 'free' for r in err_rows + long_rows)}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "cold": [asdict(r) for r in cold_rows],
                    "errors": [asdict(r) for r in err_rows + long_rows],
                },
                fh,
                indent=1,
            )
    return 1 if slow or off else 0


if __name__ == "__main__":
    sys.exit(main())
