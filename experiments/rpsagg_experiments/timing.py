"""Encode and decode wall-clock per estimator on the three tasks' shapes.

Shapes of the paper's main figure: power iteration and k-means (d = 1024; (n, k) =
(10, 102) and (50, 20)), linear regression (d = 512; (10, 50) and (50, 10)); a k-means round
decodes ``m = 10`` such vectors. The vectors are Gaussian: the cost
of every scheme but Wangni and Induced does not depend on the values, and theirs only
through sorting. Encode time is per client vector, decode time per joint decode of n
vectors; both are medians over repetitions (beta is computed before timing).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from rpsagg_experiments.optimization import DIM, LINEUP, MAIN, make_lineup_estimator
from rpsagg_experiments.runtime import TAGS, seed_of, write_csv

NAME = "timing"


def time_estimator(label: str, n: int, k: int, d: int, reps: int) -> dict[str, Any]:
    """Median encode (per client) and decode (per round) time in milliseconds."""
    est = make_lineup_estimator(label, n, k, d)
    if LINEUP[label][1] == "auto":
        est = est.with_prior(float(n - 1) / 2)  # type: ignore[attr-defined]
    est.beta_bar  # noqa: B018 - computes (or loads) the beta outside the timed region
    xs = np.random.default_rng(seed_of(TAGS[NAME], n, k, d)).standard_normal((n, d))
    enc, dec = [], []
    for rep in range(reps):
        seeds = [seed_of(TAGS[NAME], rep, i) for i in range(n)]
        start = time.perf_counter()
        msgs = [est.encode(x, s) for x, s in zip(xs, seeds, strict=True)]
        enc.append((time.perf_counter() - start) / n)
        start = time.perf_counter()
        est.decode(msgs)
        dec.append(time.perf_counter() - start)
    return {"estimator": label, "n": n, "k": k, "d": d, "reps": reps,
            "encode_ms": 1e3 * statistics.median(enc), "decode_ms": 1e3 * statistics.median(dec)}


def run(
    out: Path, *, quick: bool = False, workers: int = 1, progress: bool = True
) -> list[dict[str, Any]]:
    """Time every estimator on each task's main shapes; ``timing.csv`` and ``.png``.

    Runs in one process (``workers`` is ignored) so that the two measurements do not
    compete for the cores.
    """
    reps = 5 if quick else 30
    rows = []
    for task in ("power-iteration", "kmeans", "linreg"):
        for n, k in MAIN[task][:1] if quick else MAIN[task]:
            for label in LINEUP:
                row = time_estimator(label, n, k, DIM[task], reps)
                rows.append({"task": task, **row})
    write_csv(out / f"{NAME}.csv", rows)
    from rpsagg_experiments.plotting import plot_timing

    plot_timing(rows, out / f"{NAME}.png")
    return rows
