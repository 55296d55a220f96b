"""Equal bits: squared error against bits per client for every scheme.

Schemes: Rand-k, Rand-k-Spatial and Rand-Proj-Spatial with ``value_bits`` 1, 2, 4, 8 and 32
over a grid of k; EDEN (1, 2, 4, 8 bits) and QSGD (1, 2, 4, 8 bits). The cost of a point is
``Encoded.bits`` of one client's message (seed, values or codes and scale), shown per
coordinate (``bits / d``).

Settings:

* synthetic, n = 10, d = 1024, ``correlated_vectors`` with R = 0, (n-1)/2 and n-1; the
  spatial estimators use corr(R) with the true R (the paper's "opt"), squared error
  ``||x_hat - x_bar||^2`` averaged over fresh seeds;
* power iteration on Fashion-MNIST (n = 10, IID split, d = 1024) with the spatial estimators
  at avg (R unknown): the squared error of the mean estimate averaged over the iterations,
  and the final ``||v - v_top||``.

``rand-proj-spatial(auto)`` is Rand-Proj-Spatial with the service's ``transform=auto``:
trial (or iteration) t uses corr(R_prior), R_prior the smoothed ``R_hat`` of the sketches of
the trials before it, rounded *down* to a multiple of 0.02 (n-1) (one cached beta per value;
rounding down never turns a prior just below n-1 into max). With quantized values this
matters: rounding noise is independent across clients, so the sketches' correlation is below
the vectors' R, and ``R_hat`` (computed from the dequantized values) measures exactly that
lower correlation. corr(R) with the vectors' true R = n-1 (max) inverts S on its small
eigenvalues and amplifies the rounding noise when nk is close to d.

Rand-Proj-Spatial is run only where ``nk <= d`` (k <= 102 at n = 10): beyond that every
member of the family tends to Rand-k (``docs/math.md``, "Where correlation stops helping") and
its decode gets slow. The Pareto
frontier of a setting is the set of points that no cheaper point beats in squared error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rpsagg import CorrelationTracker, Estimator, make_estimator
from rpsagg.spec import derive_round_seed
from rpsagg.synthetic import correlated_vectors
from rpsagg_experiments.montecarlo import pareto, summarize, trial_seeds
from rpsagg_experiments.runtime import TAGS, parallel_map, write_csv

NAME = "bits"
TAG = TAGS[NAME]
N, D = 10, 1024
VALUE_BITS = (1, 2, 4, 8, 32)
QUANTIZER_BITS = (1, 2, 4, 8)
SKETCHES = ("rand-k", "rand-k-spatial", "rand-proj-spatial", "rand-proj-spatial(auto)")
K_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
K_GRID_QUICK = (2, 8, 32, 128, 512)
K_TASK = (8, 32, 102)
#: Rand-Proj-Spatial only while nk <= d.
RPS_MAX_NK = D


@dataclass(frozen=True)
class Point:
    """One scheme at one setting: ``setting`` is ``"R=<r>"`` or ``"power-iteration"``."""

    setting: str
    scheme: str
    k: int
    bits: int  # value_bits (sketches) or bits= (EDEN, QSGD)
    trials: int
    r: float = 0.0
    iterations: int = 0


def build(scheme: str, k: int, bits: int, transform: str | float) -> Estimator:
    """The estimator of a point (``transform`` for the spatial schemes)."""
    if scheme == "rand-proj-spatial(auto)":
        return make_estimator("rand-proj-spatial", n=N, k=k, d=D, transform="auto",
                              value_bits=bits)
    if scheme in ("eden", "qsgd"):
        return make_estimator(scheme, n=N, d=D, bits=bits)
    if scheme == "rand-k":
        return make_estimator(scheme, n=N, k=k, d=D, value_bits=bits)
    return make_estimator(scheme, n=N, k=k, d=D, transform=transform, value_bits=bits)


def label(scheme: str, bits: int) -> str:
    """Legend label: ``rand-proj-spatial/4b``, ``eden/2b``, ``qsgd/8b``."""
    return f"{scheme}/{bits}b"


def points(quick: bool = False) -> list[Point]:
    """Every point of every setting (quick: 5 k per sketch, value bits 1, 4, 8 and 32, bits
    1 and 4 for EDEN and QSGD, 20 trials, 8 power iterations)."""
    ks = K_GRID_QUICK if quick else K_GRID
    vbits = (1, 4, 8, 32) if quick else VALUE_BITS
    qbits = (1, 4) if quick else QUANTIZER_BITS
    trials = 20 if quick else 100
    out: list[Point] = []
    for r in (0.0, (N - 1) / 2, float(N - 1)):
        setting = f"R={r:g}"
        for scheme in SKETCHES:
            for k in ks:
                if scheme.startswith("rand-proj-spatial") and N * k > RPS_MAX_NK:
                    continue
                out.extend(Point(setting, scheme, k, b, trials, r) for b in vbits)
            if scheme.startswith("rand-proj-spatial"):  # the largest nk <= d as well
                out.extend(Point(setting, scheme, D // N, b, trials, r) for b in vbits)
        for scheme in ("eden", "qsgd"):
            out.extend(Point(setting, scheme, D, b, trials, r) for b in qbits)
    iters = 8 if quick else 30
    task_k = K_TASK[1:] if quick else K_TASK
    for scheme in SKETCHES:
        for k in task_k:
            out.extend(Point("power-iteration", scheme, k, b, 1, iterations=iters)
                       for b in vbits)
    for scheme in ("eden", "qsgd"):
        out.extend(Point("power-iteration", scheme, D, b, 1, iterations=iters) for b in qbits)
    return out


def run_synthetic(p: Point) -> dict[str, Any]:
    """Squared error of one scheme on the synthetic vectors of its R."""
    xs = correlated_vectors(N, D, p.r, seed=7)
    base_est = build(p.scheme, p.k, p.bits, p.r)
    tracker = CorrelationTracker() if p.scheme.endswith("(auto)") else None
    base = (TAG, round(p.r * 10), SKETCHES.index(p.scheme) if p.scheme in SKETCHES else 9,
            p.k, p.bits)
    errs = np.empty(p.trials)
    size = 0
    for t in range(p.trials):
        est = _with_prior(base_est, tracker)
        msgs = [est.encode(x, s) for x, s in zip(xs, trial_seeds(*base, t, n=N), strict=True)]
        size = msgs[0].bits
        errs[t] = float(np.sum((est.decode(msgs) - xs.mean(axis=0)) ** 2))
        if tracker is not None:
            tracker.update(msgs)
    res = summarize(errs)
    return _row(p, size, res.mean, res.se, res.trials, math.nan)


def run_power_iteration(p: Point) -> dict[str, Any]:
    """Power iteration on Fashion-MNIST (IID, n = 10) with one scheme: the squared error of
    the mean estimate averaged over the iterations, and the final distance to v_top."""
    from rpsagg_experiments.optimization import (
        Job,
        build_task,
        client_name,
        client_seed,
        initial_seed,
        load_dataset,
        reference,
        round_nonce,
        run_shards,
    )

    job = Job("power-iteration", "iid", N, p.k, p.scheme, 0, p.iterations)
    data = load_dataset(job.task)
    task = build_task(job.task)
    ref = reference(task, job, data)
    shards = run_shards(job, data)
    base_est = build(p.scheme, p.k, p.bits, "avg")
    tracker = CorrelationTracker() if p.scheme.endswith("(auto)") else None
    state = task.initial_state(initial_seed(0))
    errs = np.empty(p.iterations)
    size = 0
    for t in range(p.iterations):
        est = _with_prior(base_est, tracker)
        vecs = np.stack([task.client_vectors(state, s, t)[0] for s in shards])
        nonce = round_nonce(0, t)
        msgs = [est.encode(vecs[i], derive_round_seed(client_seed(0, t, i), nonce,
                                                      client_name(i), 0)) for i in range(N)]
        size = msgs[0].bits
        estimate = est.decode(msgs)
        if tracker is not None:
            tracker.update(msgs)
        errs[t] = float(np.sum((estimate - vecs.mean(axis=0)) ** 2))
        state = task.apply(state, estimate[None, :])
    res = summarize(errs)
    return _row(p, size, res.mean, res.se, res.trials, ref.loss(state))


PRIOR_STEP = 0.02


def floored_prior(tracker: CorrelationTracker, n: int, step: float = PRIOR_STEP) -> float | None:
    """The tracker's prior R rounded down to a multiple of ``step (n - 1)`` (None before the
    first update)."""
    if tracker.fraction is None:
        return None
    return math.floor(max(tracker.fraction, 0.0) / step + 1e-9) * step * (n - 1)


def _with_prior(est: Estimator, tracker: CorrelationTracker | None) -> Estimator:
    if tracker is None:
        return est
    return est.with_prior(floored_prior(tracker, N))  # type: ignore[attr-defined]


def _row(p: Point, size: int, mse: float, se: float, trials: int, loss: float) -> dict[str, Any]:
    return {"setting": p.setting, "r": p.r if p.setting != "power-iteration" else "",
            "scheme": p.scheme, "bits": p.bits, "label": label(p.scheme, p.bits), "k": p.k,
            "bits_per_client": size, "bits_per_coordinate": size / D, "trials": trials,
            "mse": mse, "se": se, "final_loss": loss}


def run_point(p: Point) -> dict[str, Any]:
    """One point of either kind."""
    if p.setting == "power-iteration":
        return run_power_iteration(p)
    return run_synthetic(p)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Pareto frontier of every setting, one row per frontier point."""
    out: list[dict[str, Any]] = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        for row in pareto([r for r in rows if r["setting"] == setting]):
            out.append({key: row[key] for key in ("setting", "label", "k",
                                                  "bits_per_coordinate", "mse", "se")})
    return out


def run(
    out: Path, *, quick: bool = False, workers: int = 2, progress: bool = True
) -> list[dict[str, Any]]:
    """Run every point; write ``bits.csv``, ``bits-frontier.csv`` and ``bits.png``."""
    pts = points(quick)
    # the slow ones first (power iteration, large RPS budgets) so the pool balances
    pts.sort(key=lambda p: (p.setting != "power-iteration",
                            -(p.k if p.scheme.startswith("rand-proj-spatial") else 0)))
    rows = parallel_map(run_point, pts, workers=workers, desc=NAME, progress=progress)
    rows.sort(key=lambda r: (r["setting"], r["scheme"], r["bits"], r["k"]))
    write_csv(out / f"{NAME}.csv", rows)
    front = summary(rows)
    write_csv(out / f"{NAME}-frontier.csv", front)
    from rpsagg_experiments.plotting import plot_bits

    plot_bits(rows, out / f"{NAME}.png")
    for setting in dict.fromkeys(r["setting"] for r in front):
        names = ", ".join(f"{r['label']} k={r['k']} ({float(r['bits_per_coordinate']):.3g} b/c, "
                          f"{float(r['mse']):.3g})" for r in front if r["setting"] == setting)
        print(f"[bits] {setting} frontier: {names}", flush=True)
    return rows
