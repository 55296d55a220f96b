"""Varying correlation: canonical basis vectors shared by groups of clients.

Each client holds some ``e_j``; clients holding the same ``e_j`` form a group. With group
sizes ``g_1, g_2, ...`` (singletons for the rest), ``R = sum_{i != l} <x_i, x_l> /
sum_i ||x_i||^2 = sum_g g (g - 1) / n``. The paper's R values are not all reachable exactly
(n = 21, R = 16 needs ``sum g(g-1) = 336``); :func:`group_sizes` picks the reachable R
closest to the target and the estimators use that actual R.

Rand-k's and Rand-k-Spatial's MSE on such sparse vectors is heavy-tailed (a coordinate is
either sent or not), so their Monte Carlo means are noisy; their exact MSEs
(:func:`~rpsagg_experiments.closed_forms.rand_k_spatial_basis`) are reported beside them
and used in the comparison and the figure.

Estimators: Rand-k; Rand-k-Spatial(opt) = corr(R) (the best of the Rand-k-Spatial family,
Jhunjhunwala et al.); Rand-Proj-Spatial(corr(R)); and Rand-Proj-Spatial(auto), whose prior
comes from the smoothed ``R_hat`` of the previous trials (unrounded: its beta is a closed
form or a small Monte Carlo).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rpsagg._correlation import CorrelationTracker
from rpsagg._estimators import RandProjSpatial, make_estimator
from rpsagg_experiments.closed_forms import rand_k_general, rand_k_spatial_basis
from rpsagg_experiments.montecarlo import mse, summarize, trial_seeds
from rpsagg_experiments.runtime import TAGS, parallel_map, write_csv

NAME = "varying-correlation"

#: The paper's settings: n -> target R values (main text n in {21, 51}, appendix {5, 11}).
R_TARGETS: dict[int, list[float]] = {
    5: [0.8, 1.6, 2.4],
    11: [2.0, 4.0, 6.0, 8.0],
    21: [4.0, 8.0, 12.0, 16.0],
    51: [10.0, 20.0, 30.0, 40.0],
}
#: Budgets with nk < d = 1024 (the paper's figures use several small k).
K_VALUES: dict[int, list[int]] = {
    5: [10, 50, 200], 11: [10, 40, 90], 21: [5, 20, 45], 51: [5, 10, 20]
}


def group_sizes(n: int, r_target: float) -> list[int]:
    """Sizes (>= 2) of the groups sharing a basis vector, total at most n, whose
    ``sum g(g-1) / n`` is closest to ``r_target`` (ties: fewer clients in groups)."""
    # reach[s] = {pair_sum: sizes} over multisets of sizes >= 2 with total exactly s
    reach: list[dict[int, list[int]]] = [{} for _ in range(n + 1)]
    reach[0][0] = []
    for size in range(2, n + 1):
        for total in range(size, n + 1):
            for pairs, sizes in list(reach[total - size].items()):
                new = pairs + size * (size - 1)
                if new not in reach[total]:
                    reach[total][new] = [*sizes, size]
    best: tuple[float, int, list[int]] | None = None
    for total in range(n + 1):
        for pairs, sizes in reach[total].items():
            cand = (abs(pairs / n - r_target), total, sorted(sizes, reverse=True))
            if best is None or cand[:2] < best[:2]:
                best = cand
    assert best is not None
    return best[2]


def basis_vectors(n: int, d: int, sizes: list[int]) -> np.ndarray:
    """Client vectors: group members share a basis vector, the others hold distinct ones."""
    xs = np.zeros((n, d))
    j = 0
    i = 0
    for size in sizes:
        xs[i : i + size, j] = 1.0
        i += size
        j += 1
    for row in range(i, n):
        xs[row, j] = 1.0
        j += 1
    return xs


def correlation(xs: np.ndarray) -> float:
    """``R = sum_{i != l} <x_i, x_l> / sum_i ||x_i||^2``."""
    total = xs.sum(axis=0)
    sq = float(np.sum(xs * xs))
    return (float(total @ total) - sq) / sq


@dataclass(frozen=True)
class Point:
    """One grid point."""

    n: int
    k: int
    r_target: float
    d: int
    trials: int
    seed: int = 0


def grid(quick: bool = False, d: int = 1024) -> list[Point]:
    """All settings (``quick``: n in {11, 21}, two R, two k, 30 trials; else 150 trials)."""
    if quick:
        return [
            Point(n, k, r, d, 30)
            for n in (11, 21)
            for k in K_VALUES[n][:2]
            for r in R_TARGETS[n][1::2]
        ]
    return [Point(n, k, r, d, 150) for n in R_TARGETS for k in K_VALUES[n] for r in R_TARGETS[n]]


def run_point(p: Point) -> list[dict[str, Any]]:
    """MSE of every estimator at one grid point."""
    sizes = group_sizes(p.n, p.r_target)
    xs = basis_vectors(p.n, p.d, sizes)
    r = correlation(xs)
    base = (TAGS[NAME], p.seed, p.n, p.k, round(p.r_target * 1000))
    lineup = [
        ("rand-k", make_estimator("rand-k", n=p.n, k=p.k, d=p.d)),
        ("rand-k-spatial(opt)", make_estimator("rand-k-spatial", n=p.n, k=p.k, d=p.d, transform=r)),
        ("rand-proj-spatial(corr)",
         make_estimator("rand-proj-spatial", n=p.n, k=p.k, d=p.d, transform=r)),
    ]
    rows: list[dict[str, Any]] = []

    exact = {
        "rand-k": rand_k_general(p.n, p.k, p.d, float(p.n)),
        "rand-k-spatial(opt)": rand_k_spatial_basis(p.n, p.k, p.d, sizes, r / (p.n - 1)),
    }

    def row(label: str, mean: float, se: float, trials: int) -> dict[str, Any]:
        return {"n": p.n, "k": p.k, "d": p.d, "r_target": p.r_target, "r": r,
                "groups": "+".join(map(str, sizes)) or "-", "estimator": label,
                "trials": trials, "mse": mean, "se": se, "exact": exact.get(label, "")}

    for idx, (label, est) in enumerate(lineup):
        res = mse(est, xs, p.trials, *base, idx)
        rows.append(row(label, res.mean, res.se, res.trials))
    # auto: trial t uses the prior from trials < t (its own sketches), as a server would.
    auto = RandProjSpatial(p.n, p.k, p.d, transform="auto")
    tracker = CorrelationTracker()
    errs = np.empty(p.trials)
    for t in range(p.trials):
        est = auto.with_prior(tracker.prior(p.n))
        msgs = [est.encode(x, s) for x, s in zip(xs, trial_seeds(*base, 99, t, n=p.n), strict=True)]
        errs[t] = float(np.sum((est.decode(msgs) - xs.mean(axis=0)) ** 2))
        tracker.update(msgs)
    res = summarize(errs)
    rows.append(row("rand-proj-spatial(auto)", res.mean, res.se, res.trials))
    return rows


def run(
    out: Path, *, quick: bool = False, workers: int = 2, progress: bool = True
) -> list[dict[str, Any]]:
    """Run the grid, write ``varying-correlation.csv`` and ``.png`` under ``out``."""
    points = grid(quick)
    # the largest nk first: their Monte Carlo betas dominate, and the pool balances better
    points.sort(key=lambda p: -p.n * p.k)
    chunks = parallel_map(run_point, points, workers=workers, desc=NAME, progress=progress)
    rows = [r for chunk in chunks for r in chunk]
    rows.sort(key=lambda r: (r["n"], r["k"], r["r_target"]))
    write_csv(out / f"{NAME}.csv", rows)
    from rpsagg_experiments.plotting import plot_varying_correlation

    plot_varying_correlation(rows, out / f"{NAME}.png")
    return rows
