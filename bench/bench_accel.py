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
   8, 16 threads (OMP/BLAS thread variables and the decode's own ``threads``).

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
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEPS = ROOT / "bench" / ".accel-deps"  # optional: pip install --target it (e.g. fht-cpu)
for _path in (ROOT / "common", DEPS):
    if _path.is_dir() and str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

T0 = time.perf_counter()
RESULTS: dict[str, Any] = {}


def load_native() -> str:
    """Make ``rpsagg._fast`` importable before rpsagg is: built in place, or compiled here.

    Without an install the compiled kernels (the GIL-free FWHT the threaded decode uses
    when fht-cpu is absent) are missing; compile ``common/rpsagg/_fast.c`` with the
    machine's C compiler into a temporary directory when it has one. Returns how.
    """
    import importlib.util
    import shutil
    import sysconfig
    import tempfile

    if os.environ.get("RPSAGG_NATIVE") == "0":
        return "disabled (RPSAGG_NATIVE=0)"
    built = os.environ.get("RPSAGG_BENCH_NATIVE")
    if not built:
        pkg = importlib.util.find_spec("rpsagg")  # finds the package, imports nothing
        suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
        places = list(pkg.submodule_search_locations or []) if pkg is not None else []
        if any((Path(p) / f"_fast{suffix}").exists() for p in places):
            return "built in the tree"
        cc = shutil.which("cc") or shutil.which("gcc")
        include = sysconfig.get_paths()["include"]
        if cc is None or not (Path(include) / "Python.h").exists():
            return "absent (no C compiler or Python headers)"
        out = Path(tempfile.mkdtemp(prefix="rpsagg-native-")) / (
            "_fast" + str(sysconfig.get_config_var("EXT_SUFFIX")))
        proc = subprocess.run([cc, "-O3", "-shared", "-fPIC", f"-I{include}",
                               str(ROOT / "common" / "rpsagg" / "_fast.c"), "-o", str(out)],
                              capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            return f"absent (compile failed: {proc.stderr[-300:]})"
        built = str(out)
        os.environ["RPSAGG_BENCH_NATIVE"] = built  # the CPU workers load the same file
    spec = importlib.util.spec_from_file_location("rpsagg._fast", built)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["rpsagg._fast"] = module
    return f"compiled for this run ({built})"


def log(msg: str) -> None:
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    print(f"[{stamp} +{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def save(path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(RESULTS, indent=2, default=str))


def section(name: str, path: Path | None, fn: Callable[[], dict[str, Any]]) -> None:
    log(f"== {name}")
    start = time.perf_counter()
    try:
        RESULTS[name] = fn()
    except Exception as exc:  # one failing section must not lose the others
        traceback.print_exc()
        RESULTS[name] = {"error": f"{type(exc).__name__}: {exc}"}
    RESULTS[name]["section_seconds"] = round(time.perf_counter() - start, 2)
    log(f"== {name} done in {time.perf_counter() - start:.1f}s")
    save(path)


def avg_c(n: int) -> float:
    from rpsagg._transform import parse_transform

    return float(parse_transform("avg", n, None).c_for(n))


def seeds_for(n: int, salt: int) -> list[int]:
    from rpsagg.spec import mix64

    return [mix64(salt * 1_000_003 + i) for i in range(n)]


def encode_messages(n: int, k: int, d: int, seeds: list[int]) -> np.ndarray:
    """The clients' numpy encode of correlated vectors x_i = u + 0.5 g_i (float32 values)."""
    from rpsagg._srht import srht_encode

    rng = np.random.default_rng(12345)
    base = rng.standard_normal(d)
    y = np.empty((n, k), dtype=np.float32)
    for i, s in enumerate(seeds):
        x = base + 0.5 * rng.standard_normal(d)
        y[i] = srht_encode(x, s, k, d).astype(np.float32)
    return y


def sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# ---------------------------------------------------------------------------------------
def env_section(device: str, native: str) -> dict[str, Any]:
    import scipy
    import torch

    import rpsagg
    from rpsagg import spec as _spec

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
    for key, val in out.items():
        log(f"  {key}: {val}")
    return out


def check_section(device: str, smoke: bool) -> dict[str, Any]:
    import torch

    from rpsagg._decode import joint_solve
    from rpsagg._srht import JointSRHT
    from rpsagg._torch import TorchJointSRHT, joint_solve_torch

    cases = [(20, 100, 2**12, "avg"), (30, 40, 2**12, "corr2"), (10, 60, 2**10, "max")]
    if not smoke:
        cases.append((100, 64, 2**16, "avg"))
    rows = []
    worst = 0.0
    for n, k, d, tr in cases:
        c = {"avg": avg_c(n), "corr2": None, "max": 1.0}[tr]
        if c is None:
            from rpsagg._transform import parse_transform

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
    from rpsagg._torch import TorchJointSRHT, joint_solve_torch

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
    np.save(_messages_path(), y)
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

    from rpsagg._srht import srht_encode
    from rpsagg._torch import TorchJointSRHT, joint_solve_torch

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


def _messages_path() -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"rpsagg-bench-accel-{os.getpid()}.npy"


def cpu_worker(args: argparse.Namespace) -> None:
    """One numpy decode measurement in this (fresh) process; prints one JSON line."""
    import inspect

    import scipy.sparse.linalg  # noqa: F401  (imported here, not inside the first timing)

    from rpsagg._decode import joint_solve
    from rpsagg._srht import JointSRHT

    y = np.load(args.messages).astype(np.float64)
    n, k = y.shape
    d = args.d
    seeds = seeds_for(n, 2020)
    c = avg_c(n)
    kwargs: dict[str, Any] = {}
    if "threads" in inspect.signature(JointSRHT.from_seeds).parameters:
        kwargs["threads"] = args.threads
    times = []
    info = None
    for _ in range(args.repeats):
        t = time.perf_counter()
        op = JointSRHT.from_seeds(seeds, k, d, **kwargs)
        _, info = joint_solve(op, y, c, method="cg")
        times.append(time.perf_counter() - t)
    assert info is not None
    import rpsagg

    print(json.dumps({"threads": args.threads, "all_s": times, "min_s": min(times),
                      "iterations": info.iterations, "decode_threads_param": bool(kwargs),
                      "fwht_backend": rpsagg.FWHT_BACKEND}))


def cpu_threads_section(smoke: bool, counts: list[int], deadline: float) -> dict[str, Any]:
    import rpsagg

    d = 2**10 if smoke else 2**20
    if rpsagg.FWHT_BACKEND == "numpy" and not smoke:
        # the numpy butterfly takes ~0.25 s per 2^20 transform: ~10 minutes per decode
        raise RuntimeError("only the numpy FWHT here (no fht-cpu, no compiled kernels)")
    msgs = _messages_path()
    if not msgs.exists():
        raise RuntimeError("no messages: the decode_2_20 section did not get to encode them")
    rows = []
    for t in counts:
        left = deadline - time.perf_counter()
        if left < 20:
            log(f"  skipping {t} threads: {left:.0f}s left")
            rows.append({"threads": t, "skipped": "time"})
            continue
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(t)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "common")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                      if p])
        repeats = 1 if (t == 1 and not smoke) else 2
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cpu-worker",
               "--messages", str(msgs), "--d", str(d), "--threads", str(t),
               "--repeats", str(repeats)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=max(10.0, left - 10))
        except subprocess.TimeoutExpired:
            rows.append({"threads": t, "error": "timeout"})
            log(f"  {t} threads: timed out")
            continue
        if proc.returncode != 0:
            rows.append({"threads": t, "error": proc.stderr[-2000:]})
            log(f"  {t} threads failed: {proc.stderr[-500:]}")
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        log(f"  {t} threads: {row['min_s']:.2f}s (runs {row['all_s']}), "
            f"{row['iterations']} it")
    base = next((r["min_s"] for r in rows if r.get("threads") == 1 and "min_s" in r), None)
    for r in rows:
        if base is not None and "min_s" in r:
            r["speedup"] = base / r["min_s"]
            r["efficiency"] = r["speedup"] / r["threads"]
    return {"n": 100, "d": d, "rows": rows, "target_efficiency": 0.7}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, device cpu")
    p.add_argument("--device", default=None, help="torch device (default cuda, or cpu)")
    p.add_argument("--json", type=Path, default=None, help="output file")
    p.add_argument("--budget-s", type=float, default=330.0, help="stop starting work after")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads-list", default="1,2,4,8,16")
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
    if args.smoke:
        counts = [t for t in counts if t <= 2]
    log(f"bench_accel: device {device}, smoke={args.smoke}, budget {args.budget_s:.0f}s, "
        f"json -> {out_path}")
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("env", lambda: env_section(device, native)),
        ("check", lambda: check_section(device, args.smoke)),
        ("decode_2_20", lambda: decode_2_20_section(device, args.smoke, args.repeats)),
        ("decode_2_27", lambda: decode_2_27_section(device, args.smoke,
                                                    deadline - 150 if not args.smoke
                                                    else deadline)),
        ("cpu_threads", lambda: cpu_threads_section(args.smoke, counts, deadline)),
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
        _messages_path().unlink(missing_ok=True)
        if native.startswith("compiled for this run"):
            import shutil

            shutil.rmtree(Path(os.environ["RPSAGG_BENCH_NATIVE"]).parent, ignore_errors=True)
        RESULTS["total_seconds"] = round(time.perf_counter() - T0, 1)
        save(out_path)
    log(f"done in {time.perf_counter() - T0:.1f}s")


if __name__ == "__main__":
    main()
