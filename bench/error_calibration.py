"""The error estimate calibrated: estimated against measured over many rounds, and its cost.

For every estimator family and data set, R rounds; each round every client's vectors are
encoded with fresh seeds and decoded, and the decode's own estimate
(``DecodeResult.error_estimate``) is set against the squared error measured against the true
mean. Printed per (family, data set): the mean estimated and mean measured squared error, their
ratio, the standard error of the mean difference (sd of the per-round differences over
sqrt(R)), the same for the relative error pooled over the rounds (the estimates' sum of
squared errors over their sum of ``||x_bar||^2`` estimates, against the measured sum over the
true sum; standard error by the delta method), and whether the target holds: the mean
estimate within 10 % of the mean measured, or within 3 standard errors of the difference where
that is wider.

Data sets (the vectors of every round are fixed first, from a trajectory driven by the exact
mean, so every family sees the same vectors):

* ``synthetic``: ``correlated_vectors`` with R cycling over 0, (n-1)/4, ..., n-1;
* ``fmnist-power``: power iteration on Fashion-MNIST (d = 1024; Debian's
  dataset-fashion-mnist), rows split across the clients;
* ``uji-linreg``: linear-regression gradients on UJIIndoorLoc (d = 512; the zip from
  ``--uji`` or ``$RPSAGG_UJI_ZIP``);
* ``uji-kmeans``: k-means centroid updates on UJIIndoorLoc with m = 3 centroids per client (each
  slot decoded separately; a round's error is the sum over the slots).

Cost: the share of a Rand-Proj-Spatial decode (SRHT, avg) spent on the estimate, at
(n, k, d) = (20, 100, 4096) and (100, 1024, 2^20): the time of ``RandProjSpatial._decode``
(which computes it) against that of ``error_from_sketches`` given the decode's values and
``||A^T y||^2`` (medians; the coefficients cold and warm).

Usage (one BLAS thread; see bench_anyd.py)::

    OPENBLAS_NUM_THREADS=1 python bench/error_calibration.py            # 200 rounds, plot
    OPENBLAS_NUM_THREADS=1 python bench/error_calibration.py --quick    # 30 rounds, small cost
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import rpsagg
from rpsagg.error import clear_memory_cache
from rpsagg.linalg import one_blas_thread
from rpsagg.synthetic import correlated_vectors
from rpsagg.tasks.base import Shard
from rpsagg.tasks.builtin import make_task

FloatArray = NDArray[np.float64]
ROOT = Path(__file__).resolve().parent.parent
UJI_DEFAULT = ROOT.parent / "shared" / "data" / "ujiindoorloc.zip"
N = 10

# (label, make_estimator name, options); k is set per data set from K_FRACTION.
FAMILIES: list[tuple[str, str, dict[str, Any]]] = [
    ("rand-k", "rand-k", {}),
    ("rand-k-spatial", "rand-k-spatial", {}),
    ("rps-srht", "rand-proj-spatial", {"projection": "srht"}),
    ("rps-srht-max", "rand-proj-spatial", {"projection": "srht", "transform": "max"}),
    ("rps-hblocks", "rand-proj-spatial", {"projection": "hblocks"}),
    ("rps-srht-8bit", "rand-proj-spatial", {"projection": "srht", "value_bits": 8}),
    ("eden-2", "eden", {"bits": 2}),
    ("qsgd-2", "qsgd", {"bits": 2}),
    ("rand-k-wangni", "rand-k-wangni", {}),
    ("induced", "induced", {}),
]
K_FRACTION = 1 / 16  # k = d / 16 per client


@dataclass
class Dataset:
    name: str
    d: int
    rounds: list[FloatArray]  # each (m, n, d): m slots of n client vectors


def synthetic(rounds: int, d: int = 1024) -> Dataset:
    grid = [j * (N - 1) / 4 for j in range(5)]
    out = []
    for t in range(rounds):
        out.append(correlated_vectors(N, d, grid[t % 5], seed=1000 + t)[None])
    return Dataset("synthetic", d, out)


def _shards(x: FloatArray, y: FloatArray | None) -> list[Shard]:
    out = []
    for i in range(N):
        lo, hi = i * x.shape[0] // N, (i + 1) * x.shape[0] // N
        out.append(Shard(x[lo:hi], None if y is None else y[lo:hi], index=i, n=N))
    return out


def task_rounds(task_name: str, params: dict[str, float], shards: list[Shard], d: int,
                rounds: int) -> list[FloatArray]:
    """The clients' vectors of each round, the state driven by the exact mean."""
    task = make_task(task_name, d, params)
    state = task.initial_state(0)
    out = []
    for step in range(rounds):
        vecs = np.stack([task.client_vectors(state, s, step) for s in shards], axis=1)
        out.append(vecs)
        state = task.apply(state, vecs.mean(axis=1))
    return out


def real_datasets(rounds: int, uji: Path | None) -> list[Dataset]:
    from rpsagg.tasks.data import DataUnavailable, load_fashion_mnist, load_ujiindoorloc

    out = []
    try:
        images = load_fashion_mnist()
        out.append(Dataset("fmnist-power", 1024,
                           task_rounds("power-iteration", {}, _shards(images, None), 1024,
                                       rounds)))
    except DataUnavailable as exc:
        print(f"skip fmnist-power: {exc}", file=sys.stderr)
    try:
        x, y = load_ujiindoorloc(uji)
        shards = _shards(x, y)
        out.append(Dataset("uji-linreg", 512,
                           task_rounds("linreg", {"lr": 0.1}, shards, 512, rounds)))
        out.append(Dataset("uji-kmeans", 512,
                           task_rounds("kmeans", {"centroids": 3}, shards, 512, rounds)))
    except DataUnavailable as exc:
        print(f"skip uji: {exc}", file=sys.stderr)
    return out


@dataclass
class Row:
    family: str
    dataset: str
    rounds: int
    est_sq: float
    meas_sq: float
    se_sq: float
    est_rel: float
    meas_rel: float
    se_rel: float
    methods: str

    @staticmethod
    def ok(est: float, meas: float, se: float) -> bool:
        return abs(est - meas) <= max(0.10 * abs(meas), 3.0 * se)

    @property
    def passed(self) -> bool:
        return (self.ok(self.est_sq, self.meas_sq, self.se_sq)
                and self.ok(self.est_rel, self.meas_rel, self.se_rel))


def calibrate(label: str, name: str, opts: dict[str, Any], ds: Dataset) -> Row:
    kw = dict(opts)
    if name not in ("eden", "qsgd"):
        kw["k"] = max(1, int(ds.d * K_FRACTION))
    est = rpsagg.make_estimator(name, n=N, d=ds.d, **kw)
    meas, esti, true_sq, est_sq = [], [], [], []
    methods: set[str] = set()
    seed = 1
    for vecs in ds.rounds:
        m_sq = e_sq = m_norm = e_norm = 0.0
        for slot in vecs:
            msgs = []
            for i in range(N):
                msgs.append(est.encode(slot[i], seed))
                seed += 1
            res = est.decode_with_info(msgs)
            info = res.error_estimate
            assert info is not None
            target = slot.mean(axis=0)
            err = res.estimate - target
            m_sq += float(err @ err)
            m_norm += float(target @ target)
            e_sq += info.squared_error
            e_norm += info.mean_norm_squared
            methods.add(info.method)
        meas.append(m_sq)
        esti.append(e_sq)
        true_sq.append(m_norm)
        est_sq.append(e_norm)
    e, m, s, q = (np.asarray(v) for v in (esti, meas, true_sq, est_sq))
    rounds = e.size
    se_sq = float((e - m).std(ddof=1) / math.sqrt(rounds))
    # The relative error pooled over the rounds: sum of squared errors over the sum of
    # ||x_bar||^2 (estimated: the estimates' sums; measured: the true ones). Per-round ratios
    # are not averaged: ||x_bar||^2 is near 0 in some rounds (k-means updates, orthogonal
    # vectors) and its estimate is noisy there. Standard error by the delta method: the
    # per-round influence of the difference is (e_t - rel_e q_t)/mean(q) - m_t/mean(s).
    rel_e, rel_m = e.mean() / q.mean(), m.mean() / s.mean()
    infl = (e - rel_e * q) / q.mean() - m / s.mean()
    se_rel = float(infl.std(ddof=1) / math.sqrt(rounds))
    return Row(label, ds.name, rounds, float(e.mean()), float(m.mean()), se_sq, float(rel_e),
               float(rel_m), se_rel, "+".join(sorted(methods)))


def print_table(rows: list[Row]) -> None:
    print("\n| family | data set | rounds | est. MSE | meas. MSE | ratio | SE diff | "
          "est. rel | meas. rel | ratio | SE diff | target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.family} | {r.dataset} | {r.rounds} | {r.est_sq:.4g} | {r.meas_sq:.4g} | "
              f"{r.est_sq / r.meas_sq:.3f} | {r.se_sq:.2g} | {r.est_rel:.4g} | "
              f"{r.meas_rel:.4g} | {r.est_rel / r.meas_rel:.3f} | {r.se_rel:.2g} | "
              f"{'ok' if r.passed else 'MISSED'} |")


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    families = sorted({r.family for r in rows})
    markers = dict(zip(sorted({r.dataset for r in rows}), "osD^v", strict=False))
    colors = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    for ax, (what, est_f, meas_f) in zip(axes, [("squared error", "est_sq", "meas_sq"),
                                                ("relative error", "est_rel", "meas_rel")],
                                         strict=True):
        lo, hi = math.inf, 0.0
        for r in rows:
            xv, yv = getattr(r, meas_f), getattr(r, est_f)
            if xv <= 0 or yv <= 0:
                continue
            ax.scatter(xv, yv, color=colors[r.family], marker=markers[r.dataset], s=28)
            lo, hi = min(lo, xv, yv), max(hi, xv, yv)
        ax.plot([lo / 2, hi * 2], [lo / 2, hi * 2], "k-", lw=0.8, label="y = x")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"mean measured {what}")
        ax.set_ylabel(f"mean estimated {what}")
        ax.set_title(f"{what}: estimated against measured")
    handles = [plt.Line2D([], [], color=colors[f], marker="o", ls="", label=f)
               for f in families]
    handles += [plt.Line2D([], [], color="black", mfc="none", marker=m, ls="", label=d)
                for d, m in markers.items()]
    axes[1].legend(handles=handles, fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _median_time(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cost(n: int, k: int, d: int, reps: int) -> None:
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, projection="srht")
    x = correlated_vectors(n, d, (n - 1) / 2, seed=5) if d <= 8192 else None
    rng = np.random.default_rng(5)
    msgs = []
    for i in range(n):
        v = x[i] if x is not None else rng.standard_normal(d)
        msgs.append(est.encode(v, 10 + i))
    batch = list(msgs)
    est._decode(batch)  # warm: beta, plans
    res = est._decode(batch)
    assert res.solve is not None and res.solve.adjoint_sq is not None
    y = np.stack([m.values.astype(np.float64) for m in batch])
    adjoint_sq = res.solve.adjoint_sq
    c, beta = float(res.c or 0.0), res.beta
    t_decode = _median_time(lambda: est._decode(batch), reps)

    def cold() -> object:
        clear_memory_cache()
        return est.error_from_sketches(batch, y, adjoint_sq, c, beta)

    t_cold = _median_time(cold, 20)
    t_warm = _median_time(lambda: est.error_from_sketches(batch, y, adjoint_sq, c, beta), 20)
    print(f"cost (n, k, d) = ({n}, {k}, {d}): decode {t_decode * 1e3:.2f} ms "
          f"({res.solve.method}), estimate {t_warm * 1e3:.3f} ms warm / {t_cold * 1e3:.3f} ms "
          f"cold coefficients = {100 * t_warm / t_decode:.2f} % / {100 * t_cold / t_decode:.2f} "
          f"% of the decode", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="30 rounds, small cost point only")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--uji", type=Path, default=None,
                    help="UJIIndoorLoc zip (default $RPSAGG_UJI_ZIP or ../shared/data)")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "error-calibration.png")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--sections", default="calibration,cost")
    args = ap.parse_args(argv)
    rounds = args.rounds or (30 if args.quick else 200)
    sections = set(args.sections.split(","))
    uji = args.uji or (Path(os.environ["RPSAGG_UJI_ZIP"]) if os.environ.get("RPSAGG_UJI_ZIP")
                       else UJI_DEFAULT)
    with one_blas_thread():
        if "cost" in sections:
            cost(20, 100, 4096, 20)
            if not args.quick:
                cost(100, 1024, 2**20, 3)
        if "calibration" in sections:
            t0 = time.perf_counter()
            datasets = [synthetic(rounds), *real_datasets(rounds, uji)]
            print(f"data: {', '.join(ds.name for ds in datasets)} ({rounds} rounds, n = {N}; "
                  f"{time.perf_counter() - t0:.1f} s)", flush=True)
            rows = []
            for ds in datasets:
                for label, name, opts in FAMILIES:
                    t1 = time.perf_counter()
                    row = calibrate(label, name, opts, ds)
                    rows.append(row)
                    print(f"  {ds.name:13s} {label:14s} est/meas MSE {row.est_sq / row.meas_sq:.3f}"
                          f" rel {row.est_rel / row.meas_rel:.3f} [{row.methods}] "
                          f"{time.perf_counter() - t1:.1f} s", flush=True)
            print_table(rows)
            missed = [r for r in rows if not r.passed]
            print(f"\n{len(rows) - len(missed)} of {len(rows)} within the target"
                  + ("" if not missed else
                     ": missed " + ", ".join(f"{r.family}/{r.dataset}" for r in missed)))
            if not args.no_plot:
                plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
