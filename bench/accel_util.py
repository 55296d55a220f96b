"""Helpers of ``bench/bench_accel.py``: the import path and compiled kernels without an
install, timestamped progress, sections that record their failure, and the messages.

Imported before :mod:`rpsagg` is: it puts ``common/`` (and ``bench/.accel-deps``) on the
import path, and :func:`load_native` makes the compiled kernels importable.
"""

from __future__ import annotations

import contextlib
import json
import os
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
    from rpsagg.linalg import parse_transform

    return float(parse_transform("avg", n, None).c_for(n))


def seeds_for(n: int, salt: int) -> list[int]:
    from rpsagg.spec import mix64

    return [mix64(salt * 1_000_003 + i) for i in range(n)]


def encode_messages(n: int, k: int, d: int, seeds: list[int]) -> np.ndarray:
    """The clients' numpy encode of correlated vectors x_i = u + 0.5 g_i (float32 values)."""
    from rpsagg.projections import srht_encode

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


def messages_path() -> Path:
    """Where the decode_2_20 section leaves its messages for the cpu_threads workers."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"rpsagg-bench-accel-{os.getpid()}.npy"


def cpu_topology() -> dict[str, Any]:
    """What ``lscpu`` says about the cores: logical CPUs, physical cores, threads per core.

    From ``/sys/devices/system/cpu/cpu*/topology`` (core_id, physical_package_id,
    thread_siblings_list), else ``/proc/cpuinfo`` (``physical id``, ``core id``): 16 vCPUs
    may be 16 cores or 8 cores with two hyper-threads each, which decides what a thread
    count can gain. Also the caches of cpu0 and the NUMA nodes.
    """
    out: dict[str, Any] = {"logical_cpus": os.cpu_count()}
    with contextlib.suppress(AttributeError, OSError):
        out["affinity_cpus"] = len(os.sched_getaffinity(0))
    base = Path("/sys/devices/system/cpu")
    cores: set[tuple[str, str]] = set()
    siblings: set[str] = set()
    for cpu in sorted(base.glob("cpu[0-9]*")):
        topo = cpu / "topology"
        try:
            core = (topo / "core_id").read_text().strip()
            pkg = (topo / "physical_package_id").read_text().strip()
            sib = (topo / "thread_siblings_list").read_text().strip()
        except OSError:
            continue
        cores.add((pkg, core))
        siblings.add(sib)
    how = "sysfs"
    if not cores:
        how = "/proc/cpuinfo"
        try:
            pkg = core = ""
            with open("/proc/cpuinfo") as fh:
                for line in fh:
                    key, _, val = line.partition(":")
                    key, val = key.strip(), val.strip()
                    if key == "physical id":
                        pkg = val
                    elif key == "core id":
                        core = val
                    elif not key and (pkg or core):  # the blank line ending one CPU
                        cores.add((pkg, core))
                        pkg = core = ""
            if pkg or core:
                cores.add((pkg, core))
        except OSError:
            pass
    if cores:
        logical = os.cpu_count() or len(cores)
        out.update({
            "physical_cores": len(cores),
            "sockets": len({p for p, _ in cores}),
            "threads_per_core": round(logical / len(cores), 2),
            "topology_from": how,
        })
        if siblings:
            out["thread_siblings_examples"] = sorted(siblings)[:4]
    else:
        out["physical_cores"] = "unknown (no sysfs topology, no core id in /proc/cpuinfo)"
    caches = {}
    for idx in sorted((base / "cpu0" / "cache").glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
            shared = (idx / "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        caches[f"L{level}{'' if kind == 'Unified' else kind[0].lower()}"] = (
            f"{size} (shared by CPUs {shared})")
    if caches:
        out["caches_cpu0"] = caches
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    if nodes:
        out["numa_nodes"] = len(nodes)
    return out
