"""Identical unit vectors (R = n - 1): simulated MSE beside the closed forms.

The paper's Figure "full correlation": d = 1024, n in {10, 20, 50, 100}, small k with
nk < d; Rand-k, Rand-k-Spatial(max) and Rand-Proj-Spatial(max).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rpsagg._estimators import make_estimator
from rpsagg_experiments.closed_forms import CLOSED_FORMS
from rpsagg_experiments.montecarlo import mse
from rpsagg_experiments.runtime import TAGS, parallel_map, write_csv

NAME = "full-correlation"
LINEUP: list[tuple[str, str, str]] = [
    ("rand-k", "rand-k", "avg"),
    ("rand-k-spatial(max)", "rand-k-spatial", "max"),
    ("rand-proj-spatial(max)", "rand-proj-spatial", "max"),
]


@dataclass(frozen=True)
class Point:
    """One grid point: n identical unit vectors in dimension d, budget k."""

    n: int
    k: int
    d: int
    trials: int
    seed: int = 0


def k_grid(n: int, d: int, count: int = 6) -> list[int]:
    """``count`` budgets from 1 to the largest k with ``nk < d`` (distinct, increasing)."""
    k_max = (d - 1) // n
    return sorted({max(1, round(v)) for v in np.linspace(1, k_max, count)})


def grid(quick: bool = False, d: int = 1024) -> list[Point]:
    """The paper's grid (``quick``: n in {10, 50}, 3 budgets, 30 trials; else 100 trials)."""
    ns = [10, 50] if quick else [10, 20, 50, 100]
    trials = 30 if quick else 100
    return [Point(n, k, d, trials) for n in ns for k in k_grid(n, d, 3 if quick else 6)]


def unit_vector(d: int, seed: int) -> np.ndarray:
    """The shared unit vector of a grid point (Gaussian direction)."""
    v = np.random.default_rng([seed, d]).standard_normal(d)
    return np.asarray(v / np.linalg.norm(v))


def run_point(p: Point) -> list[dict[str, Any]]:
    """Simulated and closed-form MSE of every estimator at one grid point."""
    xs = np.tile(unit_vector(p.d, p.seed), (p.n, 1))
    rows: list[dict[str, Any]] = []
    for label, name, transform in LINEUP:
        est = make_estimator(name, n=p.n, k=p.k, d=p.d, transform=transform)
        res = mse(est, xs, p.trials, TAGS[NAME], p.seed, p.n, p.k, p.d, len(rows))
        closed = CLOSED_FORMS[label](p.n, p.k, p.d)
        rows.append(
            {
                "n": p.n,
                "k": p.k,
                "d": p.d,
                "estimator": label,
                "trials": res.trials,
                "mse": res.mean,
                "se": res.se,
                "closed_form": closed,
                "z": (res.mean - closed) / res.se if res.se > 0 else 0.0,
            }
        )
    return rows


def run(
    out: Path, *, quick: bool = False, workers: int = 2, progress: bool = True
) -> list[dict[str, Any]]:
    """Run the grid, write ``full-correlation.csv`` and ``.png`` under ``out``."""
    points = grid(quick)
    chunks = parallel_map(run_point, points, workers=workers, desc=NAME, progress=progress)
    rows = [r for chunk in chunks for r in chunk]
    write_csv(out / f"{NAME}.csv", rows)
    from rpsagg_experiments.plotting import plot_full_correlation

    plot_full_correlation(rows, out / f"{NAME}.png")
    return rows
