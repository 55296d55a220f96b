r"""The server's target mode (``--target-rel-error EPS``) against the fixed-k sweep.

In-process, with the server's rule, the library's ``rpsagg.planning.BudgetPolicy``: before
every round the k is ``BudgetPolicy(EPS, k_min, min(k_max, d)).plan(priors, make)``, which
plans at R = the least of ``VectorCorrelationTracker(m).planning_priors(n)`` (alpha 0.5: per
slot the least of the smoothed R_hat and the last round's), k_max while no R_hat is known
(the first round); with ``--transform auto`` the round's estimator takes the smoothed prior;
after the decode the tracker folds in the round's messages (``decoding.decode_round``). Where
``rpsagg_server`` is importable every round's k is checked against the server's
``rpsagg_server.rounds.planner.RoundPlanner.budget`` itself.

Workloads (n = 10 clients, d = 1024; the vectors of every round are fixed first, so the
target mode and every fixed k see the same vectors and the same client seeds):

* ``syn-R0.9``, ``syn-R4.5``, ``syn-R8.1``: ``correlated_vectors`` with a fixed R (fractions
  0.1, 0.5, 0.9 of n - 1), fresh vectors every round;
* ``syn-drift25``, ``syn-drift100``: R(t) = 4.5 + 4 sin(2 pi t / P), between 0.5 and 8.5,
  period P = 25 rounds (R moves by up to 1.0 a round) or 100 (up to 0.25 a round);
* ``fmnist-power``: power iteration on Fashion-MNIST (rows split across the clients, the
  state driven by the exact mean; R ~ 8.99 after the first round).

Measured per round: the relative error ``||x_hat - x_bar||^2 / ||x_bar||^2`` against the true
mean. Judged on the mean of the per-round relative errors (what the planner bounds: every
round's expected relative error <= EPS); the pooled total-over-total ratio is printed too.
Bytes: ``n (4 k + 8)`` per round (float32 values and an 8-byte header per client).

The fixed-k sweep runs a geometric grid of k over the same rounds; the smallest fixed k whose
mean relative error is <= the target mode's achieved mean is then found by bisection on the
integers between the two grid points around it (the sweep's mean falls with k up to noise).
The same is printed without the first round (sent at k_max). A second table plans the k at
other R for comparison (not the server's rule): the smoothed R_hat alone, and the round's
true R.

Usage (one BLAS thread; see bench_anyd.py)::

    OPENBLAS_NUM_THREADS=1 python bench/target_mode.py           # 100 rounds, table and plot
    OPENBLAS_NUM_THREADS=1 python bench/target_mode.py --quick   # 12 rounds, a coarse grid
    # transform auto (decodes ~20x slower): 50 rounds, two workloads
    OPENBLAS_NUM_THREADS=1 python bench/target_mode.py --transform auto --rounds 50 \
        --workloads syn-drift25,fmnist-power --no-plot
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

import rpsagg
from rpsagg import VectorCorrelationTracker
from rpsagg.linalg import one_blas_thread
from rpsagg.planning import BudgetPolicy, planning_r
from rpsagg.schemes import estimator_from_options
from rpsagg.synthetic import correlated_vectors

FloatArray = NDArray[np.float64]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

N = 10
D = 1024
ESTIMATOR = "rand-proj-spatial"  # the server's default
TARGETS = (0.05, 0.2)


@dataclass
class Workload:
    name: str
    rounds: list[FloatArray]  # each (m, n, d)

    def true_r(self, t: int) -> float:
        x = self.rounds[t][0]
        s = x.sum(axis=0)
        sq = float(np.sum(x * x))
        return float(s @ s - sq) / sq


def synthetic_fixed(r: float, rounds: int) -> Workload:
    return Workload(f"syn-R{r:g}", [correlated_vectors(N, D, r, seed=7000 + t)[None]
                                   for t in range(rounds)])


def synthetic_drift(rounds: int, period: int) -> Workload:
    out = []
    for t in range(rounds):
        r = 4.5 + 4.0 * math.sin(2 * math.pi * t / period)
        out.append(correlated_vectors(N, D, r, seed=9000 + t)[None])
    return Workload(f"syn-drift{period}", out)


def fmnist_power(rounds: int) -> Workload | None:
    from error_calibration import _shards, task_rounds

    from rpsagg.tasks.data import DataUnavailable, load_fashion_mnist

    try:
        images = load_fashion_mnist()
    except DataUnavailable as exc:
        print(f"skip fmnist-power: {exc}", file=sys.stderr)
        return None
    return Workload("fmnist-power", task_rounds("power-iteration", {}, _shards(images, None),
                                                D, rounds))


class Rule:
    """The server's choice of a round's k and estimator (``RoundPlanner.budget`` and
    ``RoundPlanner.choose``), with the job's options."""

    def __init__(self, target: float, k_min: int, k_max: int, transform: str) -> None:
        self.target, self.k_min, self.k_max, self.transform = target, k_min, k_max, transform

    def make(self, prior: float | None, k: int) -> rpsagg.Estimator:
        return estimator_from_options(ESTIMATOR, n=N, k=k, d=D, transform=self.transform,
                                      prior_r=prior if self.transform == "auto" else None,
                                      projection="auto", value_bits=32, bits=0)

    def round_k(self, priors: tuple[float | None, ...],
                decode_prior: float | None = None) -> int:
        if self.target <= 0:
            return self.k_max
        r = planning_r(priors)
        prior = (r if decode_prior is None else decode_prior) if self.transform == "auto" else None
        policy = BudgetPolicy(self.target, self.k_min, min(self.k_max, D))
        return policy.plan(priors, lambda k, bits: self.make(prior, k)).k


def server_round_k() -> Callable[[Rule, tuple[float | None, ...], float | None], int] | None:
    """The server's round planner (``RoundPlanner.budget``) with the rule's options (None
    where ``rpsagg_server`` is not importable)."""
    try:
        from rpsagg_server.rounds.planner import RoundPlanner
        from rpsagg_server.settings.serverconfig import ServerConfig
    except ImportError:
        return None

    planners: dict[tuple[float, int, int, str], RoundPlanner] = {}

    def call(rule: Rule, priors: tuple[float | None, ...], decode_prior: float | None) -> int:
        key = (rule.target, rule.k_min, rule.k_max, rule.transform)
        if key not in planners:
            planners[key] = RoundPlanner(ServerConfig(
                n=N, d=D, k=rule.k_max, estimator=ESTIMATOR, transform=rule.transform,
                target_rel_error=rule.target, k_min=rule.k_min, k_max=rule.k_max,
                insecure=True))
        return int(planners[key].budget(priors, decode_prior)[0])

    return call


@dataclass
class Run:
    """One run over a workload's rounds: per round k, squared error, ||x_bar||^2, prior."""

    k: list[int] = field(default_factory=list)
    sq: list[float] = field(default_factory=list)
    norm: list[float] = field(default_factory=list)
    prior: list[float | None] = field(default_factory=list)

    @property
    def rel(self) -> FloatArray:
        return np.asarray(self.sq) / np.asarray(self.norm)

    def tail(self, skip: int) -> Run:
        """The rounds after the first ``skip``."""
        return Run(self.k[skip:], self.sq[skip:], self.norm[skip:], self.prior[skip:])

    @property
    def mean_rel(self) -> float:
        return float(self.rel.mean())

    @property
    def se_rel(self) -> float:
        r = self.rel
        return float(r.std(ddof=1) / math.sqrt(r.size)) if r.size > 1 else math.nan

    @property
    def pooled_rel(self) -> float:
        return float(np.sum(self.sq) / np.sum(self.norm))

    @property
    def bytes_per_round(self) -> float:
        return float(np.mean([N * (4 * k + 8) for k in self.k]))


VARIANTS = ("server", "smoothed", "oracle")


def run(wl: Workload, rule: Rule, fixed_k: int | None = None,
        check: Callable[[Rule, tuple[float | None, ...], float | None], int] | None = None,
        variant: str = "server") -> Run:
    """The rounds of ``wl`` under the target mode (``fixed_k`` None) or a fixed k (the
    tracker still feeds auto's prior, as in a server without a target).

    ``variant`` ``server`` plans the k as the server does, at the least of the smoothed
    prior and the last round's R_hat (``VectorCorrelationTracker.planning_priors``); for
    the comparison only, ``smoothed`` plans at the smoothed prior alone and ``oracle`` at the
    round's true R. The decode's prior stays the tracker's smoothed one.
    """
    m = wl.rounds[0].shape[0]
    tracker = VectorCorrelationTracker(m)
    out = Run()
    for t, vecs in enumerate(wl.rounds):
        tracked = tuple(tracker.priors(N))
        planned = tuple(tracker.planning_priors(N))
        if variant == "smoothed":
            planned = tracked
        elif variant == "oracle":
            planned = (wl.true_r(t),)
        decode_prior = tracked[0] if rule.transform == "auto" else None
        k = rule.round_k(planned, decode_prior) if fixed_k is None else fixed_k
        if check is not None and fixed_k is None and variant == "server":
            k_server = check(rule, planned, decode_prior)
            if k_server != k:
                raise AssertionError(f"{wl.name} round {t}: k {k}, server's round_k {k_server}")
        priors = tracked if rule.transform == "auto" else (None,) * m
        sq = norm = 0.0
        batches = []
        for j, slot in enumerate(vecs):
            est = rule.make(priors[j], k)
            msgs = [est.encode(slot[i], 100_000 * t + 100 * j + i + 1) for i in range(N)]
            res = est.decode_with_info(msgs)
            mean = slot.mean(axis=0)
            err = res.estimate - mean
            sq += float(err @ err)
            norm += float(mean @ mean)
            batches.append(msgs)
        tracker.update(batches)
        out.k.append(k)
        out.sq.append(sq)
        out.norm.append(norm)
        out.prior.append(planning_r(planned))
    return out


def k_grid(quick: bool, k_max: int) -> list[int]:
    ratio = 1.25 if quick else 1.12
    ks, k = [], 8.0
    while k < k_max:
        ks.append(round(k))
        k *= ratio
    ks.append(k_max)
    return sorted(set(ks))


@dataclass
class Row:
    workload: str
    eps: float
    rounds: int
    mean_rel: float
    se_rel: float
    pooled_rel: float
    mean_k: float
    oracle_k: float
    bytes_target: float
    k_fixed: int | None
    fixed_rel: float
    bytes_fixed: float
    ratio_tail: float  # the bytes ratio over rounds 2.. (without the first round's k_max)

    @property
    def err_ok(self) -> bool:
        return abs(self.mean_rel - self.eps) <= 0.2 * self.eps

    @property
    def ratio(self) -> float:
        return self.bytes_target / self.bytes_fixed if self.bytes_fixed else math.inf

    @property
    def bytes_ok(self) -> bool:
        return self.ratio <= 1.10


def smallest_fixed_k(wl: Workload, rule: Rule, sweep: dict[int, Run], goal: float,
                     cache: dict[int, Run], skip: int = 0) -> int | None:
    """The smallest k whose fixed-k mean relative error (over the rounds after the first
    ``skip``) is <= goal: the first grid point that reaches it, then bisection on the
    integers down to the grid point before it."""
    grid = sorted(sweep)
    hit = next((i for i, k in enumerate(grid) if sweep[k].tail(skip).mean_rel <= goal), None)
    if hit is None:
        return None
    lo = grid[hit - 1] if hit > 0 else 0  # misses (or 0: below the grid)
    hi = grid[hit]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid not in cache:
            cache[mid] = run(wl, rule, fixed_k=mid)
        if cache[mid].tail(skip).mean_rel <= goal:
            hi = mid
        else:
            lo = mid
    return hi


def print_table(rows: list[Row]) -> None:
    print("\n| workload | EPS | rounds | mean rel. err (per round) | SE | pooled rel. err | "
          "within +-20 % | mean k | k at true R | bytes/round | smallest fixed k | "
          "its mean rel. err | its bytes/round | bytes ratio | <= 110 % | ratio, rounds 2+ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        kf = "none" if r.k_fixed is None else str(r.k_fixed)
        print(f"| {r.workload} | {r.eps:g} | {r.rounds} | {r.mean_rel:.4f} "
              f"({100 * (r.mean_rel / r.eps - 1):+.0f} %) | {r.se_rel:.4f} | "
              f"{r.pooled_rel:.4f} | {'ok' if r.err_ok else 'MISSED'} | {r.mean_k:.0f} | "
              f"{r.oracle_k:.0f} | {r.bytes_target:.0f} | {kf} | {r.fixed_rel:.4f} | "
              f"{r.bytes_fixed:.0f} | {100 * r.ratio:.1f} % | "
              f"{'ok' if r.bytes_ok else 'MISSED'} | {100 * r.ratio_tail:.1f} % |")


def plot(results: dict[str, tuple[dict[int, Run], dict[float, Run]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 9))
    ax_k = fig.add_subplot(2, 2, 1)
    ax_e = fig.add_subplot(2, 2, 2)
    ax_s = fig.add_subplot(2, 1, 2)
    colors = {w: plt.get_cmap("tab10")(i) for i, w in enumerate(results)}
    styles = {TARGETS[0]: "-", TARGETS[1]: "--"}
    for w, (sweep, target_runs) in results.items():
        for eps, r in target_runs.items():
            t = np.arange(len(r.k))
            ax_k.plot(t, r.k, styles.get(eps, ":"), color=colors[w], lw=1)
            ax_e.plot(t, r.rel, styles.get(eps, ":"), color=colors[w], lw=0.8)
        ks = sorted(sweep)
        ax_s.plot([N * (4 * k + 8) for k in ks], [sweep[k].mean_rel for k in ks], "-",
                  color=colors[w], lw=1, label=f"{w}: fixed k")
        for eps, r in target_runs.items():
            ax_s.scatter([r.bytes_per_round], [r.mean_rel], color=colors[w],
                         marker="*" if eps == TARGETS[0] else "P", s=90, zorder=3)
    for eps in TARGETS:
        ax_e.axhline(eps, color="k", lw=0.6, ls=styles.get(eps, ":"))
        ax_s.axhline(eps, color="k", lw=0.6, ls=styles.get(eps, ":"))
    ax_k.set_yscale("log")
    ax_k.set_xlabel("round")
    ax_k.set_ylabel("k chosen (solid: EPS 0.05, dashed: 0.2)")
    ax_k.set_title("target mode: k per round")
    ax_e.set_yscale("log")
    ax_e.set_ylim(5e-3, 1.5)  # round 0 (k = k_max = d: exact) is below
    ax_e.set_xlabel("round")
    ax_e.set_ylabel("measured relative error")
    ax_e.set_title("target mode: measured relative error per round")
    ax_s.set_xscale("log")
    ax_s.set_yscale("log")
    ax_s.set_ylim(5e-3, 50)  # k = d is exact
    ax_s.set_xlabel(f"bytes per round (n = {N}, 4 k + 8 per client)")
    ax_s.set_ylabel("mean relative error per round")
    ax_s.set_title("fixed-k sweep (lines) and the target mode (star: EPS 0.05, plus: 0.2)")
    ax_s.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="12 rounds, a coarse k grid")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--k-min", type=int, default=1)
    ap.add_argument("--k-max", type=int, default=D)
    ap.add_argument("--transform", default="avg", help="avg (the server's default) or auto")
    ap.add_argument("--workloads", default="syn-R0.9,syn-R4.5,syn-R8.1,syn-drift25,"
                    "syn-drift100,fmnist-power")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "target-mode.png")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    rounds = args.rounds or (12 if args.quick else 100)
    wanted = args.workloads.split(",")
    check = server_round_k()
    print(f"n = {N}, d = {D}, {ESTIMATOR}, transform {args.transform}, k in "
          f"[{args.k_min}, {args.k_max}], {rounds} rounds; server rule check: "
          f"{'on' if check else 'off (rpsagg_server not importable)'}", flush=True)
    rows: list[Row] = []
    variants: list[tuple[str, float, str, float, float, float, float]] = []
    results: dict[str, tuple[dict[int, Run], dict[float, Run]]] = {}
    t_start = time.perf_counter()
    with one_blas_thread():
        for name in wanted:
            if name.startswith("syn-R"):
                wl: Workload | None = synthetic_fixed(float(name[5:]), rounds)
            elif name.startswith("syn-drift"):
                wl = synthetic_drift(rounds, int(name[9:]))
            elif name == "fmnist-power":
                wl = fmnist_power(rounds)
            else:
                raise SystemExit(f"unknown workload {name}")
            if wl is None:
                continue
            base = Rule(0.0, args.k_min, args.k_max, args.transform)
            t0 = time.perf_counter()
            sweep: dict[int, Run] = {}
            grid = k_grid(args.quick, args.k_max)
            for i, k in enumerate(grid):
                sweep[k] = run(wl, base, fixed_k=k)
                if i % 8 == 7 or i == len(grid) - 1:
                    print(f"  {wl.name}: sweep {i + 1}/{len(grid)} (k = {k}, mean rel "
                          f"{sweep[k].mean_rel:.4f}) {time.perf_counter() - t0:.0f} s",
                          flush=True)
            cache = dict(sweep)
            target_runs: dict[float, Run] = {}
            for eps in TARGETS:
                rule = Rule(eps, args.k_min, args.k_max, args.transform)
                tr = run(wl, rule, check=check)
                target_runs[eps] = tr
                oracle = [rule.round_k((wl.true_r(t),)) for t in range(rounds)]
                kf = smallest_fixed_k(wl, base, sweep, tr.mean_rel, cache)
                fixed = cache[kf] if kf is not None else None
                kt = smallest_fixed_k(wl, base, sweep, tr.tail(1).mean_rel, cache, skip=1)
                ratio_tail = (tr.tail(1).bytes_per_round / cache[kt].bytes_per_round
                              if kt is not None else math.inf)
                rows.append(Row(wl.name, eps, rounds, tr.mean_rel, tr.se_rel, tr.pooled_rel,
                                float(np.mean(tr.k)), float(np.mean(oracle)),
                                tr.bytes_per_round, kf,
                                fixed.mean_rel if fixed else math.nan,
                                fixed.bytes_per_round if fixed else math.nan, ratio_tail))
                print(f"  {wl.name} EPS {eps:g}: mean rel {tr.mean_rel:.4f} +- {tr.se_rel:.4f}"
                      f", mean k {np.mean(tr.k):.0f}, fixed k {kf}; "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
                for variant in VARIANTS:
                    vr = tr if variant == "server" else run(wl, rule, variant=variant)
                    kv = smallest_fixed_k(wl, base, sweep, vr.mean_rel, cache)
                    variants.append((wl.name, eps, variant, vr.mean_rel, vr.se_rel,
                                     float(np.mean(vr.k)),
                                     vr.bytes_per_round / cache[kv].bytes_per_round
                                     if kv is not None else math.inf))
            results[wl.name] = (sweep, target_runs)
    print_table(rows)
    err_missed = [r for r in rows if not r.err_ok]
    bytes_missed = [r for r in rows if not r.bytes_ok]
    print(f"\nerror within +-20 % of EPS: {len(rows) - len(err_missed)} of {len(rows)}; "
          f"bytes <= 110 % of the fixed k: {len(rows) - len(bytes_missed)} of {len(rows)} "
          f"({time.perf_counter() - t_start:.0f} s)")
    print("\nThe rule's R (server: the least of the smoothed R_hat and the last round's; "
          "smoothed: the smoothed R_hat alone; oracle: the round's true R):\n")
    print("| workload | EPS | planned at | mean rel. err | SE | vs EPS | mean k | bytes ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, eps, variant, rel, se, mk, ratio in variants:
        print(f"| {name} | {eps:g} | {variant} | {rel:.4f} | {se:.4f} | "
              f"{100 * (rel / eps - 1):+.0f} % | {mk:.0f} | {100 * ratio:.1f} % |")
    if not args.no_plot and results:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
