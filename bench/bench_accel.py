"""The decode on an accelerator and on every CPU core: one short script for a GPU machine.

Sections (each guarded: a failure is recorded and the next one runs):

1. ``env``: versions, devices, which FWHT and kernels the CPU side uses.
2. ``check``: float64 on the device against the numpy decode (same messages, same solver):
   ``A^T f(K) y`` relative difference and iteration counts, for CG (avg, corr) and LSQR (max).
3. ``decode_2_20``: (n, k, d) = (100, 1024, 2^20), Rand-Proj-Spatial(avg): messages from
   the clients' numpy encode; the device decode (seeds -> signs/rows on the host -> device,
   then CG) in float64 and float32, after a warm-up, median of several (target <= 0.1 s).
4. ``decode_2_27``: (100, 2^17, 2^27) in float32 (target <= 20 s). A numpy encode of one
   vector is timed and the encode of all 100 extrapolated; the messages are built on the
   device with the same signs and rows (``TorchJointSRHT.sketch``, which the test suite
   checks against the numpy encode).
5. ``cpu_threads``: the numpy decode at (100, 1024, 2^20) in fresh processes with 1, 2, 4,
   8, 16 threads (OMP/BLAS thread variables and the decode's own ``threads``), on the
   product path the process uses (``products``: the compiled tile kernels, else the numpy
   passes), with the time of the operator and of one forward and one adjoint product;
   then the numpy passes (``RPSAGG_PRODUCTS=passes``) at ``--passes-threads`` (1 and 16)
   as the baseline on the same machine. The env section records the CPU topology
   (physical cores, threads per core).

Decode times exclude beta (a cached, one-off Monte Carlo per (n', k, d', c)): they time
``A^T f(K) y``, the part of a decode that depends on the round's messages.

Run on the GPU machine from the repository root (no install needed)::

    PYTHONPATH=common python3 bench/bench_accel.py            # JSON to $OUT if set
    PYTHONPATH=common python3 bench/bench_accel.py --smoke    # tiny shapes on the CPU

Without an install the compiled kernels are compiled for the run when the machine has a C
compiler and Python headers (else the CPU section needs fht-cpu: put it in
``bench/.accel-deps`` with ``pip install --target bench/.accel-deps fht-cpu`` for the
machine's Python and carry that directory).

It prints progress with timestamps and writes ``$OUT/bench_accel.json`` (or ``--json``)
after every section, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from accel_util import (  # bench/, the script's directory: on the path when run as a script
    RESULTS,
    ROOT,
    T0,
    avg_c,
    cpu_topology,
    encode_messages,
    load_native,
    log,
    messages_path,
    save,
    section,
    seeds_for,
    sync,
)


# ---------------------------------------------------------------------------------------
def env_section(device: str, native: str) -> dict[str, Any]:
    import scipy
    import torch

    import rpsagg
    from rpsagg import spec as _spec
    from rpsagg.projections import product_path

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "fwht_backend": rpsagg.FWHT_BACKEND,
        "native_kernels": _spec.NATIVE is not None,
        "native_how": native,
        "decode_products": product_path(),
        # the Krylov solvers pin BLAS to one thread through threadpoolctl (else OpenBLAS
        # threads spin against the products' threads: set OPENBLAS_NUM_THREADS=1 then)
        "threadpoolctl": importlib.util.find_spec("threadpoolctl") is not None,
        "device": device,
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out["gpu"] = props.name
        out["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    try:
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        out["cpu"] = names[0] if names else out["cpu"]
    except OSError:
        pass
    out["cpu_topology"] = cpu_topology()
    for key, val in out.items():
        log(f"  {key}: {val}")
    return out


def check_section(device: str, smoke: bool) -> dict[str, Any]:
    import torch

    from rpsagg.device import TorchJointSRHT, joint_solve_torch
    from rpsagg.linalg import joint_solve
    from rpsagg.projections import JointSRHT

    cases = [(20, 100, 2**12, "avg"), (30, 40, 2**12, "corr2"), (10, 60, 2**10, "max")]
    if not smoke:
        cases.append((100, 64, 2**16, "avg"))
    rows = []
    worst = 0.0
    for n, k, d, tr in cases:
        c = {"avg": avg_c(n), "corr2": None, "max": 1.0}[tr]
        if c is None:
            from rpsagg.linalg import parse_transform

            c = float(parse_transform(2.0, n, None).c_for(n))
        seeds = seeds_for(n, d + k)
        y = encode_messages(n, k, d, seeds).astype(np.float64)
        want, info_np = joint_solve(JointSRHT.from_seeds(seeds, k, d), y, c, method="cg")
        op = TorchJointSRHT.from_seeds(seeds, k, d, device, dtype="float64")
        got, info_t = joint_solve_torch(op, torch.from_numpy(y).to(op.device), c, method="cg")
        diff = float(np.linalg.norm(got.cpu().numpy() - want) / np.linalg.norm(want))
        worst = max(worst, diff)
        row = {"n": n, "k": k, "d": d, "transform": tr, "rel_diff": diff,
               "method": info_t.method, "iterations_device": info_t.iterations,
               "iterations_numpy": info_np.iterations}
        rows.append(row)
        log(f"  {row}")
    return {"cases": rows, "worst_rel_diff": worst, "target": 1e-10, "met": worst <= 1e-10}


def device_decode(
    torch: Any, seeds: list[int], y: np.ndarray, k: int, d: int, c: float, device: str,
    dtype: str, threads: int, budget: int | None = None,
) -> tuple[float, float, Any]:
    """(total seconds, solve seconds, SolveInfo) of seeds + messages -> A^T f(K) y."""
    from rpsagg.device import TorchJointSRHT, joint_solve_torch

    dev = torch.device(device)
    sync(torch, dev)
    start = time.perf_counter()
    op = TorchJointSRHT.from_seeds(seeds, k, d, device, dtype=dtype, threads=threads,
                                   memory_budget=budget)
    yt = torch.from_numpy(y).to(op.device, op.dtype)
    sync(torch, dev)
    mid = time.perf_counter()
    xt, info = joint_solve_torch(op, yt, c, method="cg", maxiter=60)
    sync(torch, dev)
    end = time.perf_counter()
    del xt, op, yt
    return end - start, end - mid, info


def decode_2_20_section(device: str, smoke: bool, repeats: int) -> dict[str, Any]:
    import torch

    n, k, d = (8, 16, 2**10) if smoke else (100, 1024, 2**20)
    threads = os.cpu_count() or 1
    seeds = seeds_for(n, 2020)
    t = time.perf_counter()
    y = encode_messages(n, k, d, seeds)
    enc = time.perf_counter() - t
    log(f"  numpy encode of {n} vectors of {d}: {enc:.2f}s")
    np.save(messages_path(), y)
    c = avg_c(n)
    out: dict[str, Any] = {"n": n, "k": k, "d": d, "c": c, "encode_all_s": enc,
                           "target_s": 0.1}
    for dtype in ("float32", "float64"):
        device_decode(torch, seeds, y, k, d, c, device, dtype, threads)  # warm-up
        totals, solves, info = [], [], None
        for _ in range(repeats):
            total, solve, info = device_decode(torch, seeds, y, k, d, c, device, dtype, threads)
            totals.append(total)
            solves.append(solve)
        assert info is not None
        out[dtype] = {"median_s": statistics.median(totals), "all_s": totals,
                      "solve_median_s": statistics.median(solves),
                      "iterations": info.iterations, "residual": info.residual}
        log(f"  {device} {dtype}: median {statistics.median(totals):.4f}s "
            f"(solve {statistics.median(solves):.4f}s, {info.iterations} it, "
            f"residual {info.residual:.1e}) of {len(totals)}")
    return out


def decode_2_27_section(device: str, smoke: bool, deadline: float) -> dict[str, Any]:
    import torch

    from rpsagg.device import TorchJointSRHT, joint_solve_torch
    from rpsagg.projections import srht_encode

    n, k, d = (4, 64, 2**12) if smoke else (100, 2**17, 2**27)
    threads = os.cpu_count() or 1
    out: dict[str, Any] = {"n": n, "k": k, "d": d, "dtype": "float32", "target_s": 20.0}
    # the clients' encode, on one CPU core each: time one and extrapolate
    d_enc = min(d, 2**24)
    x = np.random.default_rng(1).standard_normal(d_enc)
    t = time.perf_counter()
    srht_encode(x, 1, max(1, k * d_enc // d), d_enc)
    one = (time.perf_counter() - t) * (d / d_enc) * (np.log2(d) / np.log2(d_enc))
    del x
    out["encode_one_estimate_s"] = one
    out["encode_all_estimate_s_on_all_cores"] = one * n / threads
    log(f"  encode of one vector of {d} (from {d_enc}): ~{one:.2f}s; "
        f"{n} on {threads} cores: ~{one * n / threads:.1f}s")
    dev = torch.device(device)
    c = avg_c(n)
    seeds = seeds_for(n, 2027)
    # messages on the device: x_i = u + 0.5 g_i, G_i x_i with the seeds' own signs and rows
    t = time.perf_counter()
    op = TorchJointSRHT.from_seeds(seeds, k, d, device, dtype="float32", threads=threads)
    gen = torch.Generator(device=dev)
    gen.manual_seed(7)
    base = torch.randn(d, generator=gen, device=dev, dtype=torch.float32)
    y = torch.empty((n, k), device=dev, dtype=torch.float32)
    step = max(1, min(n, (1 << 31) // (4 * d)))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        xs = base + 0.5 * torch.randn((hi - lo, d), generator=gen, device=dev,
                                      dtype=torch.float32)
        y[lo:hi] = op.sketch(xs, lo)
        del xs
    y_host = y.cpu().numpy()
    del op, y, base
    sync(torch, dev)
    out["messages_on_device_s"] = time.perf_counter() - t
    log(f"  messages built on {device} in {out['messages_on_device_s']:.1f}s")
    runs = []
    while not runs or (len(runs) < 2 and time.perf_counter() + 1.5 * runs[-1]["total_s"]
                       < deadline):
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        sync(torch, dev)
        t = time.perf_counter()
        op = TorchJointSRHT.from_seeds(seeds, k, d, device, dtype="float32", threads=threads)
        yt = torch.from_numpy(y_host).to(op.device)
        sync(torch, dev)
        built = time.perf_counter() - t
        # capped: CG needs ~10 iterations here; a float32 stall must not eat the run
        xt, info = joint_solve_torch(op, yt, c, method="cg", maxiter=60)
        sync(torch, dev)
        total = time.perf_counter() - t
        run = {"total_s": total, "operator_s": built, "solve_s": total - built,
               "iterations": info.iterations, "residual": info.residual,
               "finite": bool(torch.isfinite(xt).all())}
        if dev.type == "cuda":
            run["peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
        runs.append(run)
        log(f"  run {len(runs)}: {run}")
        del xt, op, yt
    out["runs"] = runs
    out["best_s"] = min(r["total_s"] for r in runs)
    out["met"] = out["best_s"] <= 20.0
    return out


def cpu_worker(args: argparse.Namespace) -> None:
    """One numpy decode measurement in this (fresh) process; prints one JSON line."""
    import inspect

    import scipy.sparse.linalg  # noqa: F401  (imported here, not inside the first timing)

    from rpsagg.linalg import joint_solve
    from rpsagg.projections import JointSRHT

    y = np.load(args.messages).astype(np.float64)
    n, k = y.shape
    d = args.d
    seeds = seeds_for(n, 2020)
    c = avg_c(n)
    kwargs: dict[str, Any] = {}
    if "threads" in inspect.signature(JointSRHT.from_seeds).parameters:
        kwargs["threads"] = args.threads
    times, operator_s, cpu_s = [], [], []
    info = None
    op = None
    for _ in range(args.repeats):
        t = time.perf_counter()
        cpu = time.process_time()  # CPU seconds of all the process's threads
        op = JointSRHT.from_seeds(seeds, k, d, **kwargs)
        operator_s.append(time.perf_counter() - t)
        _, info = joint_solve(op, y, c, method="cg")
        times.append(time.perf_counter() - t)
        cpu_s.append(time.process_time() - cpu)
    assert info is not None and op is not None
    # one product of each kind, alone (best of 3): A u and A^T z
    rng = np.random.default_rng(5)
    u, z = rng.standard_normal(op.d_pad), rng.standard_normal((n, k))
    products: dict[str, float] = {}
    for name, fn, arg in (("forward_s", op.forward, u), ("adjoint_s", op.adjoint, z)):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            fn(arg)
            best = min(best, time.perf_counter() - t)
        products[name] = best
    import rpsagg

    try:
        from rpsagg.projections import product_path

        path = product_path()
    except ImportError:  # a tree from before the tile products
        path = "passes"
    print(json.dumps({"threads": args.threads, "all_s": times, "min_s": min(times),
                      "operator_s": operator_s, "cpu_s": cpu_s, "iterations": info.iterations,
                      "decode_threads_param": bool(kwargs), "products": path, **products,
                      "fwht_backend": rpsagg.FWHT_BACKEND}))


def _cpu_run(msgs: Path, d: int, t: int, products: str, smoke: bool,
             deadline: float, repeats: int = 3) -> dict[str, Any]:
    """One row: the decode with ``t`` threads in a fresh process, ``products`` forced."""
    left = deadline - time.perf_counter()
    if left < 20:
        log(f"  skipping {products} with {t} threads: {left:.0f}s left")
        return {"threads": t, "skipped": "time"}
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(t)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "common")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["RPSAGG_PRODUCTS"] = products
    repeats = min(repeats, 2) if smoke else repeats  # the same for every thread count
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cpu-worker",
           "--messages", str(msgs), "--d", str(d), "--threads", str(t),
           "--repeats", str(repeats)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=max(10.0, left - 10))
    except subprocess.TimeoutExpired:
        log(f"  {products}, {t} threads: timed out")
        return {"threads": t, "error": "timeout"}
    if proc.returncode != 0:
        log(f"  {products}, {t} threads failed: {proc.stderr[-500:]}")
        return {"threads": t, "error": proc.stderr[-2000:]}
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    log(f"  {row['products']}, {t} threads: {row['min_s']:.2f}s (runs "
        f"{[round(x, 3) for x in row['all_s']]}, operator {min(row['operator_s']):.3f}s), "
        f"{row['iterations']} it; one forward {row['forward_s']:.4f}s, "
        f"one adjoint {row['adjoint_s']:.4f}s")
    return row


def _speedups(rows: list[dict[str, Any]]) -> None:
    base = next((r["min_s"] for r in rows if r.get("threads") == 1 and "min_s" in r), None)
    for r in rows:
        if base is not None and "min_s" in r:
            r["speedup"] = base / r["min_s"]
            r["efficiency"] = r["speedup"] / r["threads"]


def cpu_threads_section(smoke: bool, counts: list[int], passes_counts: list[int],
                        deadline: float, repeats: int = 3,
                        all_core: bool = False) -> dict[str, Any]:
    """The numpy decode with each thread count (``rows``: the default product path, the
    tile kernels when the compiled kernels load), then the numpy passes as a baseline on
    the same machine (``passes_rows``, thread counts ``passes_counts``)."""
    import rpsagg
    from rpsagg.projections import product_path

    d = 2**10 if smoke else 2**20
    path = product_path()
    if rpsagg.FWHT_BACKEND == "numpy" and path == "passes" and not smoke:
        # the numpy butterfly takes ~0.25 s per 2^20 transform: ~10 minutes per decode
        raise RuntimeError("only the numpy FWHT here (no fht-cpu, no compiled kernels)")
    msgs = messages_path()
    if not msgs.exists():
        raise RuntimeError("no messages: the decode_2_20 section did not get to encode them")
    log(f"  products: {path}")
    rows = [_cpu_run(msgs, d, t, path, smoke, deadline, repeats) for t in counts]
    _speedups(rows)
    out: dict[str, Any] = {"n": 100, "d": d, "products": path, "rows": rows,
                           "target_efficiency": 0.7}
    if all_core:  # the one-thread decode alone, then in every core's process at once
        procs = 2 if smoke else (os.cpu_count() or 1)
        with ThreadPoolExecutor(procs) as pool:
            together = list(pool.map(lambda _: _cpu_run(msgs, d, 1, path, smoke, deadline, 2),
                                     range(procs)))
        times = sorted(r["min_s"] for r in together if "min_s" in r)
        lone = next((r["min_s"] for r in rows if r.get("threads") == 1 and "min_s" in r), None)
        out["all_core"] = {"processes": procs, "seconds": times, "lone_s": lone}
        if times and lone:
            med = times[len(times) // 2]
            log(f"  {procs} one-thread decodes at once: median {med:.2f}s, "
                f"{med / lone:.2f}x the lone decode ({lone:.2f}s)")
    if path == "tiles" and passes_counts and (rpsagg.FWHT_BACKEND != "numpy" or smoke):
        passes = [_cpu_run(msgs, d, t, "passes", smoke, deadline, repeats)
                  for t in passes_counts]
        _speedups(passes)
        out["passes_rows"] = passes
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, device cpu")
    p.add_argument("--device", default=None, help="torch device (default cuda, or cpu)")
    p.add_argument("--json", type=Path, default=None, help="output file")
    p.add_argument("--budget-s", type=float, default=330.0, help="stop starting work after")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads-list", default="1,2,4,8,16")
    p.add_argument("--cpu-repeats", type=int, default=3,
                   help="decodes per cpu_threads row (the fastest counts)")
    p.add_argument("--all-core", action="store_true",
                   help="cpu_threads also runs one one-thread decode per core at once (how "
                        "much slower each is than alone: the machine's all-core limit)")
    p.add_argument("--passes-threads", default="1,16",
                   help="thread counts of the numpy-passes baseline rows ('' for none)")
    p.add_argument("--skip", default="", help="comma-separated sections to skip")
    p.add_argument("--cpu-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--messages", default=None, help=argparse.SUPPRESS)
    p.add_argument("--d", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    native = load_native()
    if args.cpu_worker:
        cpu_worker(args)
        return
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    out_path = args.json
    if out_path is None and os.environ.get("OUT"):
        out_path = Path(os.environ["OUT"]) / "bench_accel.json"
    deadline = T0 + args.budget_s
    skip = set(filter(None, args.skip.split(",")))
    counts = [int(t) for t in args.threads_list.split(",")]
    passes_counts = [int(t) for t in args.passes_threads.split(",") if t]
    if args.smoke:
        counts = [t for t in counts if t <= 2]
        passes_counts = [t for t in passes_counts if t <= 2]
    log(f"bench_accel: device {device}, smoke={args.smoke}, budget {args.budget_s:.0f}s, "
        f"json -> {out_path}")
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("env", lambda: env_section(device, native)),
        ("check", lambda: check_section(device, args.smoke)),
        ("decode_2_20", lambda: decode_2_20_section(device, args.smoke, args.repeats)),
        ("decode_2_27", lambda: decode_2_27_section(device, args.smoke,
                                                    deadline - 150 if not args.smoke
                                                    else deadline)),
        ("cpu_threads", lambda: cpu_threads_section(args.smoke, counts, passes_counts,
                                                    deadline, args.cpu_repeats,
                                                    args.all_core)),
    ]
    try:
        for name, fn in steps:
            if name in skip:
                continue
            if time.perf_counter() > deadline:
                log(f"== {name} skipped: over the time budget")
                RESULTS[name] = {"skipped": "time"}
                continue
            section(name, out_path, fn)
    finally:
        messages_path().unlink(missing_ok=True)
        if native.startswith("compiled for this run"):
            import shutil

            shutil.rmtree(Path(os.environ["RPSAGG_BENCH_NATIVE"]).parent, ignore_errors=True)
        RESULTS["total_seconds"] = round(time.perf_counter() - T0, 1)
        save(out_path)
    log(f"done in {time.perf_counter() - T0:.1f}s")


if __name__ == "__main__":
    main()
