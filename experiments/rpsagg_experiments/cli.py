"""``rpsagg-experiments``: regenerate the paper's figures (CSV + PNG under ``results/``).

Examples
--------
    rpsagg-experiments all                  # everything (about an hour on two cores)
    rpsagg-experiments all --quick          # reduced grids, a few minutes
    rpsagg-experiments rank --out /tmp/r    # one experiment
    rpsagg-experiments linreg --data-path ../shared/data/ujiindoorloc.zip
    rpsagg-experiments power-iteration --via-service --runs 1 --iterations 3
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from rpsagg import add_version_flag
from rpsagg.commandline import Parser, exit_statuses, plain

EXPERIMENTS = (
    "full-correlation",
    "varying-correlation",
    "rank",
    "power-iteration",
    "kmeans",
    "linreg",
    "timing",
    "bits",
)


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    p = Parser(prog="rpsagg-experiments", description=plain(__doc__),
               epilog=exit_statuses())
    add_version_flag(p)
    what = p.add_argument_group("what to run", "e.g. rank --quick --out /tmp/r")
    what.add_argument("name", choices=(*EXPERIMENTS, "all"), help="experiment to run")
    what.add_argument("--out", type=Path, default=None,
                      help="results directory (default results/<name>/; all: results/)")
    what.add_argument("--quick", action="store_true", help="reduced grids and trials")
    what.add_argument("--workers", type=int, default=2, help="processes")
    what.add_argument("--no-progress", action="store_true", help="no progress bars")
    tasks = p.add_argument_group(
        "the tasks (power-iteration, kmeans, linreg)",
        "e.g. linreg --data-path ../shared/data/ujiindoorloc.zip --grid main --runs 3")
    tasks.add_argument("--data-path", default=None,
                       help="UJIIndoorLoc zip (default $RPSAGG_UJI_ZIP)")
    tasks.add_argument("--grid", choices=("main", "appendix", "all"), default=None,
                       help="task settings: the paper's main figure, the appendix, or both")
    tasks.add_argument("--runs", type=int, default=None,
                       help="task runs (default 10; quick 2)")
    tasks.add_argument("--kmeans-updates", type=int, choices=(0, 1), default=None,
                       help="kmeans: 1 (default) clients send centroid updates, 0 whole "
                       "centroids (the paper's wording; diverges under its budgets)")
    service = p.add_argument_group(
        "through the service", "e.g. power-iteration --via-service --runs 1 --iterations 3 "
        "--n 10 --k 102")
    service.add_argument("--via-service", action="store_true",
                         help="tasks only: run through a real server and client processes "
                         "(gRPC)")
    service.add_argument("--iterations", type=int, default=None, help="iterations")
    service.add_argument("--estimator", default="rand-proj-spatial(avg)",
                         help="estimator label")
    service.add_argument("--n", type=int, default=None, help="clients")
    service.add_argument("--k", type=int, default=None, help="budget")
    return p


def run_one(name: str, out: Path, args: argparse.Namespace) -> None:
    """Run one experiment into ``out``."""
    common = {"quick": args.quick, "workers": args.workers, "progress": not args.no_progress}
    if name in ("power-iteration", "kmeans", "linreg"):
        task_params: tuple[tuple[str, float], ...] = ()
        if name == "kmeans" and args.kmeans_updates is not None:
            task_params = (("updates", float(args.kmeans_updates)),)
        if args.via_service:
            from rpsagg_experiments.service import run_via_service

            run_via_service(name, out, estimator=args.estimator, n=args.n, k=args.k,
                            iterations=args.iterations, runs=args.runs or 1,
                            data_path=args.data_path, task_params=task_params)
            return
        from rpsagg_experiments import optimization

        optimization.run(name, out, data_path=args.data_path, grid=args.grid, runs=args.runs,
                         task_params=task_params, **common)
        return
    if args.via_service:
        raise SystemExit(f"--via-service applies to the tasks only, not {name}")
    if name == "full-correlation":
        from rpsagg_experiments import full_correlation as mod
    elif name == "varying-correlation":
        from rpsagg_experiments import varying_correlation as mod  # type: ignore[no-redef]
    elif name == "rank":
        from rpsagg_experiments import rank as mod  # type: ignore[no-redef]
    elif name == "bits":
        from rpsagg_experiments import bits as mod  # type: ignore[no-redef]
    else:
        from rpsagg_experiments import timing as mod  # type: ignore[no-redef]
    mod.run(out, **common)


def single_blas_thread() -> None:
    """One BLAS thread in this process and (through the environment) in the workers.

    Parallelism comes from the worker processes; a multi-threaded BLAS on a shared two-core
    machine spins and slows small products several-fold.
    """
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is in the experiments extra
        return
    threadpool_limits(1)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = build_parser().parse_args(argv)
    single_blas_thread()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    names = EXPERIMENTS if args.name == "all" else (args.name,)
    root = args.out if args.out is not None else Path("results")
    total = time.perf_counter()
    for name in names:
        out = root / name if (args.name == "all" or args.out is None) else root
        start = time.perf_counter()
        print(f"[rpsagg-experiments] {name} -> {out}", flush=True)
        try:
            run_one(name, out, args)
        except Exception as exc:  # report and go on with the next experiment
            from rpsagg.tasks import DataUnavailable

            if not isinstance(exc, DataUnavailable):
                raise
            print(f"[rpsagg-experiments] {name} skipped: {exc}", file=sys.stderr, flush=True)
            continue
        print(f"[rpsagg-experiments] {name} done in {time.perf_counter() - start:.0f} s",
              flush=True)
    print(f"[rpsagg-experiments] total {time.perf_counter() - total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
