"""Benchmark suite: encode and decode time, peak memory, growth exponents, blockwise MSE.

Every decode case runs in its own Python process, so its peak memory is its own: beta is
computed (or read from the cache) first and timed separately, then the decode is timed with
``tracemalloc`` tracking numpy's allocations (peak bytes above the process's baseline) and
``ru_maxrss`` giving the whole process's high-water mark. Prints tables; ``--json PATH``
writes everything.

    python bench/suite.py                 # full grid (about 15-25 minutes on 2 cores)
    python bench/suite.py --quick         # small grid (about a minute)
    python bench/suite.py --only targets  # just the issue's target cases
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

import rpsagg
from rpsagg.synthetic import correlated_vectors

ROOT = Path(__file__).resolve().parents[1]

TARGET_CASES = [  # (n, k, d, block_size)
    (20, 100, 4096, None),
    (100, 64, 1 << 16, None),
    (100, 1024, 1 << 20, None),
    (100, 1024, 1 << 22, 1 << 18),
]
D_GRID = [(20, 64, 1 << e, None) for e in (12, 14, 16, 18, 20)]
N_GRID = [(n, 64, 1 << 16, None) for n in (10, 20, 50, 100)]
QUICK = [(10, 32, 1024, None), (20, 100, 4096, None), (50, 32, 1 << 14, None)]


def client_messages(est: rpsagg.Estimator, n: int, d: int, seed: int = 3) -> list[rpsagg.Encoded]:
    """Encoded correlated client vectors (a shared component plus noise, R ~ (n-1)/2).

    Vectors are generated and encoded one at a time, so the process never holds n x d of
    client data and its peak memory is the decoder's.
    """
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(d)
    return [est.encode(common + rng.standard_normal(d), 1_000 + i) for i in range(n)]


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one decode case in this process and return its figures."""
    n, k, d, block = spec["n"], spec["k"], spec["d"], spec["block"]
    transform = spec["transform"]
    est = rpsagg.make_estimator(
        "rand-proj-spatial", n=n, k=k, d=d, transform=transform, block_size=block
    )
    msgs = client_messages(est, n, d)
    import scipy.linalg
    import scipy.sparse.linalg  # noqa: F401  (imported lazily by rpsagg; not part of a decode)

    t0 = time.perf_counter()
    beta = est.beta_bar
    beta_s = time.perf_counter() - t0
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    t0 = time.perf_counter()
    result = est.decode_with_info(msgs)
    decode_s = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out: dict[str, Any] = {
        **spec,
        "beta": beta,
        "beta_seconds": beta_s,
        "decode_seconds": decode_s,
        "peak_traced_mib": peak / 2**20,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_decode_mib": base_rss / 1024,
        "solver": result.solve.method if result.solve else None,
        "iterations": result.solve.iterations if result.solve else 0,
        "residual": result.solve.residual if result.solve else 0.0,
    }
    if spec.get("dense") and block is None and d <= 4096:
        from bench_core import dense_decode  # the paper's eigendecomposition of S

        t0 = time.perf_counter()
        dense = dense_decode(msgs, k, d, est.transform.c_for(n), beta)  # type: ignore[attr-defined]
        out["dense_seconds"] = time.perf_counter() - t0
        out["rel_diff"] = float(np.linalg.norm(dense - result.estimate) / np.linalg.norm(dense))
        # the same decode solved to rtol 1e-10 instead of the default 1e-6
        tight = rpsagg.make_estimator(
            "rand-proj-spatial", n=n, k=k, d=d, transform=transform, rtol=1e-10
        )
        t0 = time.perf_counter()
        tight_result = tight.decode_with_info(msgs)
        out["tight_decode_seconds"] = time.perf_counter() - t0
        out["tight_rel_diff"] = float(
            np.linalg.norm(dense - tight_result.estimate) / np.linalg.norm(dense)
        )
    return out


def run_case(
    n: int, k: int, d: int, block: int | None, transform: str, dense: bool
) -> dict[str, Any]:
    spec = {"n": n, "k": k, "d": d, "block": block, "transform": transform, "dense": dense}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__)), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"case {spec} failed:\n{proc.stderr}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def encode_times(dims: list[int], repeats: int) -> list[dict[str, Any]]:
    rows = []
    for d in dims:
        k = max(1, d // 32)
        est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d)
        x = np.random.default_rng(0).standard_normal(d)
        est.encode(x, 1)
        times = []
        for r in range(repeats):
            t0 = time.perf_counter()
            est.encode(x, 100 + r)
            times.append(time.perf_counter() - t0)
        rows.append(
            {
                "d": d,
                "k": k,
                "median_ms": 1e3 * float(np.median(times)),
                "min_ms": 1e3 * float(np.min(times)),
            }
        )
    return rows


def blockwise_mse(trials: int) -> list[dict[str, Any]]:
    """MSE of full vs blockwise transforms on the same vectors (d = 2^14, n = 10, k = 256)."""
    n, k, d = 10, 256, 1 << 14
    rows = []
    cases = {
        "R=0": correlated_vectors(n, d, 0.0, seed=1),
        "R=4.5": correlated_vectors(n, d, 4.5, seed=1),
        "R=9": correlated_vectors(n, d, 9.0, seed=1),
    }
    skew = correlated_vectors(n, d, 4.5, seed=1)
    skew[:, : d // 16] *= 8.0  # energy concentrated in the first 1/16 of the coordinates
    cases["R=4.5, energy in 1/16"] = skew
    for label, xs in cases.items():
        x_bar = xs.mean(axis=0)
        norm = float(x_bar @ x_bar)
        for block in (None, 1 << 12, 1 << 10):
            est = rpsagg.make_estimator(
                "rand-proj-spatial", n=n, k=k, d=d, transform="avg", block_size=block
            )
            errs = []
            for t in range(trials):
                msgs = [est.encode(x, 50_000 + t * n + i) for i, x in enumerate(xs)]
                errs.append(float(np.sum((est.decode(msgs) - x_bar) ** 2)) / norm)
            rows.append(
                {
                    "vectors": label,
                    "block": block or d,
                    "rel_mse": float(np.mean(errs)),
                    "se": float(np.std(errs, ddof=1) / np.sqrt(trials)),
                }
            )
            print(
                f"  {label:<24} block {block or d:>6}: relative MSE {rows[-1]['rel_mse']:.4f}"
                f" ± {rows[-1]['se']:.4f}",
                flush=True,
            )
    return rows


def loop_lag_during_decode(n: int, k: int, d: int) -> dict[str, Any]:
    """Event-loop lag while a decode runs in a worker thread, as the server runs it.

    The server decodes in a ``ThreadPoolExecutor`` off its asyncio loop; this measures how
    late a 5 ms ``asyncio.sleep`` wakes up while such a decode is running (the GIL is the only
    thing the two share), i.e. the extra latency a Submit or status call would see.
    """
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d)
    msgs = client_messages(est, n, d)
    _ = est.beta_bar  # computed (and cached) before the timed part

    async def run() -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as pool:
            t0 = time.perf_counter()
            fut = loop.run_in_executor(pool, est.decode, msgs)
            lags = []
            while not fut.done():
                start = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append(time.perf_counter() - start - 0.005)
            await fut
            return lags, time.perf_counter() - t0

    lags, seconds = asyncio.run(run())
    arr = np.asarray(lags) * 1e3
    return {
        "n": n,
        "k": k,
        "d": d,
        "decode_seconds": seconds,
        "wakeups": int(arr.size),
        "lag_p50_ms": float(np.median(arr)),
        "lag_p99_ms": float(np.percentile(arr, 99)),
        "lag_max_ms": float(arr.max()),
    }


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x (the growth exponent)."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def print_decode(rows: list[dict[str, Any]]) -> None:
    """One line per decode case."""
    head = (
        "n",
        "k",
        "d",
        "block",
        "T",
        "solver",
        "it",
        "beta s",
        "decode s",
        "peak MiB",
        "rss MiB",
        "dense s",
        "speedup",
        "rel diff",
    )
    widths = (4, 5, 8, 7, 4, 15, 4, 7, 9, 9, 8, 8, 8, 9)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    for r in rows:
        dense = r.get("dense_seconds")
        cells = (
            r["n"],
            r["k"],
            r["d"],
            r["block"] or "-",
            r["transform"],
            r["solver"],
            r["iterations"],
            f"{r['beta_seconds']:.2f}",
            f"{r['decode_seconds']:.3f}",
            f"{r['peak_traced_mib']:.0f}",
            f"{r['max_rss_mib']:.0f}",
            f"{dense:.2f}" if dense else "-",
            f"{dense / r['decode_seconds']:.0f}x" if dense else "-",
            f"{r['rel_diff']:.1e}" if "rel_diff" in r else "-",
        )
        print(" ".join(f"{c!s:>{w}}" for c, w in zip(cells, widths, strict=True)), flush=True)
        if "tight_rel_diff" in r:
            print(
                f"{'':>30}same decode at rtol 1e-10: {r['tight_decode_seconds']:.3f} s, "
                f"{dense / r['tight_decode_seconds']:.0f}x, rel diff "
                f"{r['tight_rel_diff']:.1e}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="small grid only")
    p.add_argument(
        "--only", choices=["targets", "grid", "encode", "blockwise", "lag"], action="append"
    )
    p.add_argument("--json", metavar="PATH", help="write all results as JSON")
    p.add_argument("--trials", type=int, default=20, help="trials per blockwise MSE point")
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    parts = set(args.only or ["encode", "targets", "grid", "blockwise", "lag"])
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "fwht": rpsagg.FWHT_BACKEND,
            "load_avg_start": os.getloadavg(),
        },
    }
    if "encode" in parts:
        print("Encode (rand-proj-spatial, k = d/32, one vector)", flush=True)
        dims = [1 << 10, 1 << 16] if args.quick else [1 << e for e in (10, 12, 14, 16, 18, 20, 22)]
        report["encode"] = encode_times(dims, 9 if args.quick else 31)
        for r in report["encode"]:
            print(f"  d = {r['d']:>8}  median {r['median_ms']:8.3f} ms   min {r['min_ms']:8.3f} ms")
    decode_rows: list[dict[str, Any]] = []
    if "targets" in parts:
        print("\nDecode, target cases (Rand-Proj-Spatial avg)", flush=True)
        cases = QUICK if args.quick else TARGET_CASES
        rows = [run_case(n, k, d, b, "avg", dense=True) for n, k, d, b in cases]
        print_decode(rows)
        report["targets"] = rows
        decode_rows += rows
    if "grid" in parts and not args.quick:
        print("\nDecode growth in d (n = 20, k = 64) and in n (k = 64, d = 2^16)", flush=True)
        rows_d = [run_case(n, k, d, b, "avg", dense=d <= 4096) for n, k, d, b in D_GRID]
        rows_n = [run_case(n, k, d, b, "avg", dense=False) for n, k, d, b in N_GRID]
        print_decode(rows_d + rows_n)
        report["grid_d"], report["grid_n"] = rows_d, rows_n
        report["exponent_d"] = slope(
            [r["d"] for r in rows_d], [r["decode_seconds"] for r in rows_d]
        )
        report["exponent_n"] = slope(
            [r["n"] for r in rows_n], [r["decode_seconds"] for r in rows_n]
        )
        print(
            f"  fitted growth: decode time ~ d^{report['exponent_d']:.2f} (n, k fixed), "
            f"~ n^{report['exponent_n']:.2f} (k, d fixed)"
        )
    if "blockwise" in parts:
        print(
            "\nBlockwise vs full transform: relative MSE ||x_hat - x_bar||^2 / ||x_bar||^2",
            flush=True,
        )
        report["blockwise_mse"] = blockwise_mse(3 if args.quick else args.trials)
    if "lag" in parts:
        print("\nEvent-loop lag while a decode runs in the server's worker thread", flush=True)
        shape = (10, 32, 4096) if args.quick else (100, 64, 1 << 16)
        lag = loop_lag_during_decode(*shape)
        report["loop_lag"] = lag
        print(
            f"  (n, k, d) = {shape}: decode {lag['decode_seconds']:.2f} s, "
            f"{lag['wakeups']} wake-ups, lag p50 {lag['lag_p50_ms']:.1f} ms, "
            f"p99 {lag['lag_p99_ms']:.1f} ms, max {lag['lag_max_ms']:.1f} ms",
            flush=True,
        )
    report["machine"]["load_avg_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
