"""How often ``S = sum_i G_i^T G_i`` (SRHT) has full rank nk.

The paper (Appendix, Figure "rank of S"): d in {32, ..., 1024}, four nk <= d per d,
10^5 trials each; rank 31 in 2.1% of the trials at d = nk = 32, rank nk everywhere else.
The paper does not say how nk splits into n and k; k = 4 (n = nk/4) reproduces the d = 32
rate (n = 8, k = 4 gives about 2%; n = 4, k = 8 about 12%; n = 16, k = 2 about 0.03%).
rank S = rank K with ``K = A A^T`` (nk x nk), computed here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg

from rpsagg._decode import eig_tolerance
from rpsagg._srht import JointSRHT
from rpsagg_experiments.runtime import TAGS, parallel_map, seed_of, write_csv

NAME = "rank"
K_PER_CLIENT = 4


def gram_rank(gram: np.ndarray, d_pad: int) -> int:
    """Rank of a Gram matrix: nk when a well-conditioned Cholesky exists, else the number of
    eigenvalues above numpy ``matrix_rank``'s tolerance."""
    nk = gram.shape[0]
    try:
        factor = scipy.linalg.cholesky(gram, lower=True, check_finite=False)
        anorm = float(np.abs(gram).sum(axis=0).max())
        rcond, info = scipy.linalg.lapack.dpocon(factor, anorm, uplo="L")
        if info == 0 and rcond > 1e-10:
            return nk
    except np.linalg.LinAlgError:
        pass
    w = scipy.linalg.eigvalsh(gram, check_finite=False)
    return int(np.sum(w > eig_tolerance(float(np.max(w)), nk, d_pad)))


@functools.lru_cache(maxsize=8)
def _hadamard(d: int) -> np.ndarray:
    return np.asarray(scipy.linalg.hadamard(d), dtype=np.float64) / math.sqrt(d)


def stacked_srht(seeds: list[int], k: int, d: int) -> np.ndarray:
    """``A = [G_1; ...; G_n]`` (nk x d, d a power of two) as a dense matrix.

    Dense rows of H and one BLAS product are faster than :meth:`JointSRHT.gram`'s pair loop
    when n is large (n = 256 at d = nk = 1024).
    """
    op = JointSRHT.from_seeds(seeds, k, d)
    h = _hadamard(d)
    return np.concatenate([h[op.rows[i]] * op.signs[i][None, :] for i in range(op.n)])


def rank_of_s(seeds: list[int], k: int, d: int) -> int:
    """rank of ``S = sum_i G_i^T G_i`` for the clients' seeds (d a power of two)."""
    a = stacked_srht(seeds, k, d)
    return gram_rank(a @ a.T, d)


@dataclass(frozen=True)
class Chunk:
    """A batch of trials at one (d, nk)."""

    d: int
    n: int
    k: int
    start: int
    trials: int
    seed: int = 0


def trials_for(d: int, nk: int, quick: bool) -> int:
    """Trials per (d, nk): many where they are cheap and the anomaly lives (d = 32)."""
    if quick:
        return 2000 if d == nk == 32 else 50
    if d == nk == 32:
        return 20000
    if nk <= 64:
        return 5000
    return 1000 if nk <= 256 else (300 if nk <= 512 else 100)


def grid(quick: bool = False, chunk: int = 1000) -> list[Chunk]:
    """Chunks of trials for d in {32, ..., 1024} (quick: up to 256) and nk in
    {d/8, d/4, d/2, d}."""
    ds = [32, 64, 128, 256] if quick else [32, 64, 128, 256, 512, 1024]
    out = []
    for d in ds:
        for nk in (d // 8, d // 4, d // 2, d):
            total = trials_for(d, nk, quick)
            for start in range(0, total, chunk):
                size = min(chunk, total - start)
                out.append(Chunk(d, nk // K_PER_CLIENT, K_PER_CLIENT, start, size))
    return out


def run_chunk(c: Chunk) -> dict[int, int]:
    """Histogram ``{rank: count}`` of a chunk of trials."""
    hist: dict[int, int] = {}
    for t in range(c.start, c.start + c.trials):
        seeds = [seed_of(TAGS[NAME], c.seed, c.d, c.n, c.k, t, i) for i in range(c.n)]
        r = rank_of_s(seeds, c.k, c.d)
        hist[r] = hist.get(r, 0) + 1
    return hist


def wilson(count: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion."""
    if total == 0:
        return (0.0, 1.0)
    p = count / total
    den = 1 + z * z / total
    mid = (p + z * z / (2 * total)) / den
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def run(
    out: Path, *, quick: bool = False, workers: int = 2, progress: bool = True
) -> list[dict[str, Any]]:
    """Run the grid, write ``rank.csv`` (one row per (d, nk)) and ``rank.png``."""
    chunks = grid(quick)
    hists = parallel_map(run_chunk, chunks, workers=workers, desc=NAME, progress=progress)
    merged: dict[tuple[int, int, int], dict[int, int]] = {}
    for c, h in zip(chunks, hists, strict=True):
        acc = merged.setdefault((c.d, c.n, c.k), {})
        for r, cnt in h.items():
            acc[r] = acc.get(r, 0) + cnt
    rows = []
    for (d, n, k), h in sorted(merged.items()):
        total = sum(h.values())
        deficient = total - h.get(n * k, 0)
        lo, hi = wilson(deficient, total)
        rows.append({
            "d": d, "n": n, "k": k, "nk": n * k, "trials": total, "deficient": deficient,
            "p_deficient": deficient / total, "ci_low": lo, "ci_high": hi,
            "min_rank": min(h), "ranks": " ".join(f"{r}:{h[r]}" for r in sorted(h)),
        })
    write_csv(out / f"{NAME}.csv", rows)
    from rpsagg_experiments.plotting import plot_rank

    plot_rank(rows, out / f"{NAME}.png")
    return rows
