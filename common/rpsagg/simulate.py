"""``rpsagg-simulate``: the squared error of every estimator on correlated synthetic vectors,
in this process (no server): a first look at how R, k and the transform move the error
(``docs/library.md``, "rpsagg-simulate").
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from rpsagg._coordinates import Induced, RandK, RandKWangni
from rpsagg._estimators import make_estimator
from rpsagg._spatial import RandKSpatial, RandProjSpatial
from rpsagg._version import add_version_flag
from rpsagg.commandline import ExitStatus, Parser, exit_statuses
from rpsagg.spec import GAMMA, MASK64
from rpsagg.synthetic import correlated_vectors

LINEUP: list[tuple[str, str | float]] = [
    (RandK.name, "avg"),
    (RandKSpatial.name, "avg"),
    (RandProjSpatial.name, "avg"),
    (RandProjSpatial.name, "max"),
    (RandKWangni.name, "avg"),
    (Induced.name, "avg"),
]


def simulate(
    n: int, k: int, d: int, r_values: list[float], trials: int, seed: int = 0
) -> dict[tuple[str, str, float], tuple[float, float]]:
    """Mean and standard error of the squared error per (estimator, transform, R)."""
    results: dict[tuple[str, str, float], tuple[float, float]] = {}
    for r in r_values:
        xs = correlated_vectors(n, d, r, seed)
        mean = xs.mean(axis=0)
        for name, transform in LINEUP:
            est = make_estimator(name, n=n, k=k, d=d, transform=transform)
            errs = np.empty(trials)
            for t in range(trials):
                base = (seed * 1_000_003 + t * n) * GAMMA
                msgs = [est.encode(x, (base + i) & MASK64) for i, x in enumerate(xs)]
                errs[t] = float(np.sum((est.decode(msgs) - mean) ** 2))
            label = f"{transform}" if name.endswith("spatial") else "-"
            mse, se = float(errs.mean()), float(errs.std(ddof=1) / np.sqrt(trials))
            results[(name, label, r)] = (mse, se)
            print(f"  R={r:<5g} {name:<18} {label:<4} MSE {mse:9.4f} ± {se:.4f}", flush=True)
    return results


DESCRIPTION = """\
The squared error ||x_hat - x_bar||^2 of Rand-k, Rand-k-Spatial, Rand-Proj-Spatial (avg and
max), Rand-k-Wangni and Induced on n synthetic vectors of correlation R, each the mean and
standard error over --trials encodings with fresh seeds; one line per estimator and R, in
this process (no server).

  rpsagg-simulate
  rpsagg-simulate --n 10 --k 32 --d 1024 --r 0 4.5 9 --trials 200
"""


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rpsagg-simulate", description=DESCRIPTION,
                    epilog=exit_statuses(notes={ExitStatus.USAGE: "also a k or d the "
                                                "estimators refuse"}))
    add_version_flag(parser)
    g = parser.add_argument_group("the setting", "e.g. --n 20 --k 64 --d 4096 --r 0 19")
    g.add_argument("--n", type=int, default=10, help="clients")
    g.add_argument("--k", type=int, default=32, help="floats per client")
    g.add_argument("--d", type=int, default=1024, help="dimension")
    g.add_argument("--r", type=float, nargs="*", default=None, metavar="R",
                   help="correlations R, each in [-1, n-1] (default: 0, (n-1)/2 and n-1)")
    g.add_argument("--trials", type=int, default=100, help="encodings per point")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (``rpsagg-simulate``)."""
    args = _parser().parse_args(argv)
    r_values = args.r if args.r else [0.0, (args.n - 1) / 2, float(args.n - 1)]
    print(
        f"rpsagg simulation: n={args.n} clients, k={args.k} floats each, d={args.d}, "
        f"{args.trials} trials per point; squared error of the mean estimate",
        flush=True,
    )
    start = time.perf_counter()
    try:
        simulate(args.n, args.k, args.d, r_values, args.trials)
    except ValueError as exc:
        print(f"rpsagg-simulate: {exc}", file=sys.stderr)
        return ExitStatus.USAGE
    print(f"done in {time.perf_counter() - start:.1f} s", flush=True)
    return ExitStatus.DONE


if __name__ == "__main__":
    raise SystemExit(main())
