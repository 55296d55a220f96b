"""Benchmark of the core library: SRHT encode and Rand-Proj-Spatial joint decode.

Encode: median wall-clock time of ``Estimator.encode`` (public API, float64 in, float32 out)
and of the bare ``srht_encode`` for one vector at several dimensions.

Decode: median wall-clock time of ``Estimator.decode_with_info`` for several (n, k, d) and
transforms, next to a dense reference decoder written the paper's way (build
``S = sum_i G_i^T G_i`` densely from :func:`rpsagg.srht_matrix`, eigendecompose it, apply
``beta T(S)^+ sum_i G_i^T y_i``) for ``d' <= 4096``. beta is computed (or loaded from the
disk cache at ``$RPSAGG_CACHE_DIR``) before any decode is timed; that one-off time is
reported separately.

Usage::

    python bench/bench_core.py                  # full run, prints a table
    python bench/bench_core.py --json out.json  # also write the figures as JSON
    python bench/bench_core.py --quick          # small sizes only (smoke test)

Host against container (``--container IMAGE``): the same rounds (the same messages, written
to a folder the container mounts) decoded here and inside ``IMAGE`` (``docker run`` with this
script mounted read-only; the Docker engine of the environment, e.g. ``scripts/engine.sh
up``), one untimed decode on each side, then timed ones alternating decode by decode (on a
shared machine both sides then see the same load), at least ``--decode-repeats`` on each
side and until the host's took ``--container-seconds``; medians of the wall-clock and of the
CPU seconds (every thread of the process; under load the wall clock also measures the
scheduler's shares) side by side, each side's estimate compared with the other's bit for
bit, and each side's product path (``rpsagg.projections.product_path``)::

    python bench/bench_core.py --container rpsagg-server:latest --transform avg \
        --case 20,100,4096 --case 100,1024,1048576 --decode-repeats 11
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

import rpsagg
from rpsagg import beta as rbeta
from rpsagg.projections import product_path, srht_encode

FloatArray = NDArray[np.float64]

ENCODE_DIMS = (2**10, 2**16, 2**20)
DECODE_CASES = ((10, 102, 1024), (50, 20, 1024), (20, 100, 4096), (100, 64, 65536))
QUICK_ENCODE_DIMS = (2**10, 2**12)
QUICK_DECODE_CASES = ((10, 102, 1024), (8, 16, 256))
TRANSFORMS = ("avg", "max")
DENSE_MAX_DPAD = 4096

# Targets of the core-library issue.
TARGET_ENCODE_MS_2_20 = 10.0
TARGET_SPEEDUP_4096 = 30.0
TARGET_REL_DIFF_EXACT = 1e-9
TARGET_DECODE_S_65536 = 10.0


@dataclass
class EncodeRow:
    """Encode timings for one dimension."""

    d: int
    k: int
    encode_ms: float
    core_ms: float
    repeats: int


@dataclass
class DecodeRow:
    """Decode timings for one (n, k, d, transform)."""

    n: int
    k: int
    d: int
    transform: str
    c: float
    beta: float
    beta_method: str
    beta_rel_se: float
    beta_seconds: float
    beta_cached: bool
    solve: str
    iterations: int
    residual: float
    decode_s: float
    decode_min_s: float
    repeats: int
    dense_s: float | None
    speedup: float | None
    rel_diff: float | None


def median_time(fn: Callable[[int], object], repeats: int) -> tuple[float, float]:
    """Median and minimum wall-clock seconds of ``fn(r)`` for ``r = 0 .. repeats-1``."""
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - start)
    return float(np.median(times)), float(np.min(times))


def bench_encode(d: int, k: int, repeats: int) -> EncodeRow:
    """Time one-vector encodes at dimension ``d`` with budget ``k``."""
    est = rpsagg.make_estimator("rand-proj-spatial", n=2, k=k, d=d)
    x = np.random.default_rng(d).standard_normal(d)
    padded = np.zeros(est.d_pad)  # type: ignore[attr-defined]
    padded[:d] = x
    est.encode(x, seed=1)  # warm-up
    enc, _ = median_time(lambda r: est.encode(x, seed=1000 + r), repeats)
    core, _ = median_time(lambda r: srht_encode(padded, 2000 + r, k), repeats)
    return EncodeRow(d, k, 1e3 * enc, 1e3 * core, repeats)


def dense_decode(msgs: list[rpsagg.Encoded], k: int, d: int, c: float, beta: float) -> FloatArray:
    """The paper's decoder: eigendecomposition of the dense d' x d' matrix S."""
    g = np.vstack([rpsagg.srht_matrix(m.seed, k, d) for m in msgs])  # (nk, d')
    y = np.concatenate([m.values.astype(np.float64) for m in msgs])
    s = g.T @ g
    b = g.T @ y
    w, v = scipy.linalg.eigh(s, check_finite=False)
    d_pad = s.shape[0]
    tol = max(float(w.max()), 1.0) * d_pad * float(np.finfo(np.float64).eps)
    t = (1.0 - c) + c * w
    f = np.where(w > tol, 1.0 / np.where(w > tol, t, 1.0), 0.0)
    return np.asarray(beta * (v @ (f * (v.T @ b)))[:d])


def client_vectors(n: int, d: int, seed: int) -> FloatArray:
    """Moderately correlated client vectors: a shared direction plus individual noise."""
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(d)
    return np.asarray(common[None, :] + 0.5 * rng.standard_normal((n, d)))


def bench_decode(
    n: int, k: int, d: int, transform: str, repeats: int, dense: bool, seed: int
) -> DecodeRow:
    """Time the joint decode of ``n`` messages, and the dense reference when asked."""
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=transform)
    assert isinstance(est, rpsagg.RandProjSpatial)
    c = est.transform.c_for(n)
    xs = client_vectors(n, d, seed)
    base = (seed << 20) + 1
    msgs = [est.encode(x, seed=base + i) for i, x in enumerate(xs)]

    cached = c == 0.0 or rbeta.cached_estimate(n, k, est.d_pad, c) is not None
    start = time.perf_counter()
    beta_est = est.beta_details(n)
    beta_seconds = time.perf_counter() - start

    results: list[rpsagg.DecodeResult] = []

    def run(_: int) -> None:
        results.append(est.decode_with_info(msgs))

    decode_s, decode_min = median_time(run, repeats)
    info = results[-1].solve
    assert info is not None
    dense_s = speedup = rel_diff = None
    if dense and est.d_pad <= DENSE_MAX_DPAD:
        start = time.perf_counter()
        ref = dense_decode(msgs, k, d, c, results[-1].beta)
        dense_s = time.perf_counter() - start
        speedup = dense_s / decode_s
        fast = results[-1].estimate
        rel_diff = float(np.linalg.norm(fast - ref) / np.linalg.norm(ref))
    return DecodeRow(
        n,
        k,
        d,
        transform,
        c,
        beta_est.beta,
        beta_est.method,
        beta_est.rel_se,
        beta_seconds,
        cached,
        info.method,
        info.iterations,
        info.residual,
        decode_s,
        decode_min,
        repeats,
        dense_s,
        speedup,
        rel_diff,
    )


@dataclass
class ContainerRow:
    """One round decoded on the host and inside a container image, side by side."""

    n: int
    k: int
    d: int
    transform: str
    solve: str
    host_s: float
    container_s: float
    ratio: float
    host_cpu_s: float
    container_cpu_s: float
    cpu_ratio: float
    host_times: list[float]
    container_times: list[float]
    host_cpu: list[float]
    container_cpu: list[float]
    host_products: str
    container_products: str
    bit_identical: bool
    rel_diff: float


def make_round(n: int, k: int, d: int, transform: str, seed: int
               ) -> tuple[rpsagg.RandProjSpatial, list[rpsagg.Encoded]]:
    """The estimator and the n messages of one round (those :func:`bench_decode` times)."""
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=transform)
    assert isinstance(est, rpsagg.RandProjSpatial)
    base = (seed << 20) + 1
    return est, [est.encode(x, seed=base + i) for i, x in enumerate(client_vectors(n, d, seed))]


def save_round(path: str, est: rpsagg.Estimator, msgs: list[rpsagg.Encoded],
               transform: str) -> None:
    """The round as an .npz: what :func:`load_round` needs to decode it anywhere."""
    m = msgs[0]
    np.savez(path, nkd=np.array([len(msgs), m.k, m.d]), transform=np.array(transform),
             scheme=np.array(est.name), spec_version=np.array(m.spec_version),
             seeds=np.array([x.seed for x in msgs], dtype=np.uint64),
             values=np.stack([x.values for x in msgs]))


def load_round(path: str) -> tuple[rpsagg.RandProjSpatial, list[rpsagg.Encoded]]:
    """The estimator and messages :func:`save_round` wrote."""
    with np.load(path) as f:
        n, k, d = (int(v) for v in f["nkd"])
        est = rpsagg.make_estimator(str(f["scheme"]), n=n, k=k, d=d,
                                    transform=str(f["transform"]))
        assert isinstance(est, rpsagg.RandProjSpatial)
        msgs = [rpsagg.Encoded(str(f["scheme"]), int(s), k, d, v,
                               spec_version=str(f["spec_version"]))
                for s, v in zip(f["seeds"], f["values"], strict=True)]
    return est, msgs


def one_decode(est: rpsagg.RandProjSpatial, msgs: list[rpsagg.Encoded]
               ) -> tuple[float, float, rpsagg.DecodeResult]:
    """The wall-clock and CPU seconds (all the process's threads) of one decode, and its
    result."""
    start, cpu = time.perf_counter(), time.process_time()
    result = est.decode_with_info(msgs)
    return time.perf_counter() - start, time.process_time() - cpu, result


def serve_round(path: str) -> None:
    """The container's side of ``--container``: load the round at ``path``, compute beta and
    decode once (untimed), then answer on two named pipes beside ``path`` (not on stdin and
    stdout, which Docker relays through its daemon, whose threads would then share the
    CPUs with the timed decode): ``ready``; then one timed decode per ``decode`` line read
    from ``cmd``, its seconds written to ``ans``; at ``end``, one JSON line: the estimate's
    float64 bytes (hex), the product path and the versions."""
    est, msgs = load_round(path)
    est.beta_details(len(msgs))
    *_, result = one_decode(est, msgs)
    folder = os.path.dirname(path)
    with open(os.path.join(folder, "cmd")) as cmd, \
            open(os.path.join(folder, "ans"), "w") as ans:
        ans.write("ready\n")
        ans.flush()
        for line in cmd:
            if line.strip() == "decode":
                took, cpu, result = one_decode(est, msgs)
                ans.write(f"{took!r} {cpu!r}\n")
            elif line.strip() == "end":
                ans.write(json.dumps({
                    "estimate": np.ascontiguousarray(result.estimate, "<f8").tobytes().hex(),
                    "products": product_path(), "numpy": np.__version__,
                    "scipy": scipy.__version__, "python": platform.python_version()}) + "\n")
                return
            ans.flush()


def bench_container(image: str, n: int, k: int, d: int, transform: str, repeats: int,
                    seconds: float, seed: int, env: list[str]) -> ContainerRow:
    """One round decoded here and in ``image`` (one container process for the whole case),
    alternating one decode at a time (host first, then container first), so both see the
    same load, at least ``repeats`` times and until the host's decodes took ``seconds``;
    the medians, and the two estimates compared."""
    est, msgs = make_round(n, k, d, transform, seed)
    here = os.path.dirname(os.path.abspath(__file__))
    host_times: list[float] = []
    container_times: list[float] = []
    host_cpu: list[float] = []
    container_cpu: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rpsagg-bench-") as io_dir:
        save_round(os.path.join(io_dir, "round.npz"), est, msgs, transform)
        os.mkfifo(os.path.join(io_dir, "cmd"))
        os.mkfifo(os.path.join(io_dir, "ans"))
        run = ["docker", "run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}",
               "-e", "RPSAGG_CACHE_DIR=/tmp/rpsagg-cache", "-v", f"{here}:/bench:ro",
               "-v", f"{io_dir}:/io", *[a for e in env for a in ("-e", e)],
               "--entrypoint", "python", image, "/bench/bench_core.py",
               "--serve-round", "/io/round.npz"]
        with subprocess.Popen(run, stdin=subprocess.DEVNULL) as proc:
            done = threading.Event()

            def unblock() -> None:
                """A container that ended opens none of its pipes' ends: open them, so that
                ours open (and read an end of file)."""
                proc.wait()
                while not done.is_set():
                    for name, mode in (("cmd", os.O_RDONLY), ("ans", os.O_WRONLY)):
                        with contextlib.suppress(OSError):
                            os.close(os.open(os.path.join(io_dir, name), mode | os.O_NONBLOCK))
                    time.sleep(0.1)

            threading.Thread(target=unblock, daemon=True).start()
            est.beta_details(n)
            *_, result = one_decode(est, msgs)  # untimed, as the container's first
            with open(os.path.join(io_dir, "cmd"), "w") as cmd, \
                    open(os.path.join(io_dir, "ans")) as ans:

                def ask(line: str) -> str:
                    cmd.write(line + "\n")
                    cmd.flush()
                    answer = ans.readline()
                    if not answer:
                        raise SystemExit(f"the container ended ({proc.wait()}): its stderr "
                                         "is above")
                    return answer

                if ans.readline().strip() != "ready":
                    raise SystemExit(f"the container ended ({proc.wait()}): its stderr is "
                                     "above")
                r = 0
                while r < repeats or sum(host_times) < seconds:
                    r += 1
                    for side in ("host", "container") if r % 2 else ("container", "host"):
                        if side == "host":
                            took, cpu, result = one_decode(est, msgs)
                            host_times.append(took)
                            host_cpu.append(cpu)
                        else:
                            took, cpu = (float(v) for v in ask("decode").split())
                            container_times.append(took)
                            container_cpu.append(cpu)
                meta = json.loads(ask("end"))
            done.set()
    print(f"# {(n, k, d)} {transform}: host {np.median(host_times):.4f} s, container "
          f"{np.median(container_times):.4f} s ({r} each)", file=sys.stderr, flush=True)
    ours = result.estimate
    theirs = np.frombuffer(bytes.fromhex(meta["estimate"]), dtype="<f8").reshape(ours.shape)
    info = result.solve
    host_s, container_s = float(np.median(host_times)), float(np.median(container_times))
    host_c, container_c = float(np.median(host_cpu)), float(np.median(container_cpu))
    rel = float(np.linalg.norm(ours - theirs) / np.linalg.norm(ours))
    return ContainerRow(n, k, d, transform, info.method if info else "-", host_s, container_s,
                        container_s / host_s, host_c, container_c, container_c / host_c,
                        host_times, container_times, host_cpu, container_cpu, product_path(),
                        meta["products"], bool(np.array_equal(ours, theirs)), rel)


def print_container(image: str, rows: list[ContainerRow]) -> None:
    """The host-against-container table."""
    print(f"\nDecode here and in {image} (same messages; medians of wall-clock and of CPU "
          "seconds; ratio = container / host)")
    print(f"{'n':>4} {'k':>5} {'d':>8} {'T':>4} {'solver':>15} {'host s':>8} {'cont. s':>8} "
          f"{'ratio':>6} {'host CPU':>8} {'cont. CPU':>9} {'ratio':>6} {'products':>13} "
          f"{'estimates':>14}")
    for r in rows:
        same = "bit for bit" if r.bit_identical else f"{r.rel_diff:.1e} rel"
        print(f"{r.n:>4} {r.k:>5} {r.d:>8} {r.transform:>4} {r.solve:>15} {r.host_s:>8.4f} "
              f"{r.container_s:>8.4f} {r.ratio:>6.2f} {r.host_cpu_s:>8.4f} "
              f"{r.container_cpu_s:>9.4f} {r.cpu_ratio:>6.2f} "
              f"{r.host_products + '/' + r.container_products:>13} {same:>14}")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_tables(enc: list[EncodeRow], dec: list[DecodeRow]) -> None:
    """Print both result tables and the target checks."""
    print(
        f"FWHT backend: {rpsagg.FWHT_BACKEND}; spec {rpsagg.SPEC_VERSION}; "
        f"beta cache: {rbeta.cache_dir()}"
    )
    if enc:
        print("\nEncode (rand-proj-spatial, one vector, median)")
        print(f"{'d':>9} {'k':>7} {'encode ms':>10} {'srht_encode ms':>15} {'reps':>5}")
        for e in enc:
            print(f"{e.d:>9} {e.k:>7} {e.encode_ms:>10.3f} {e.core_ms:>15.3f} {e.repeats:>5}")
    if dec:
        print("\nDecode (rand-proj-spatial; times exclude beta, which is computed first)")
        head = (
            f"{'n':>4} {'k':>4} {'d':>6} {'T':>4} {'solver':>15} {'it':>4} {'beta s':>8} "
            f"{'beta src':>13} {'decode s':>9} {'dense s':>8} {'speedup':>8} {'rel diff':>9}"
        )
        print(head)
        for r in dec:
            src = "cache" if r.beta_cached else r.beta_method
            print(
                f"{r.n:>4} {r.k:>4} {r.d:>6} {r.transform:>4} {r.solve:>15} {r.iterations:>4} "
                f"{r.beta_seconds:>8.2f} {src:>13} {r.decode_s:>9.4f} {_fmt(r.dense_s, '8.2f'):>8} "
                f"{_fmt(r.speedup, '8.1f'):>8} {_fmt(r.rel_diff, '9.1e'):>9}"
            )
    print("\nTargets")
    for line in check_targets(enc, dec):
        print("  " + line)


def check_targets(enc: list[EncodeRow], dec: list[DecodeRow]) -> list[str]:
    """Human-readable verdicts for the targets that this run measured."""
    out = []
    for e in enc:
        if e.d == 2**20:
            ok = e.encode_ms <= TARGET_ENCODE_MS_2_20
            out.append(
                f"encode d=2^20 (k={e.k}): {e.encode_ms:.2f} ms <= "
                f"{TARGET_ENCODE_MS_2_20} ms: {'met' if ok else 'MISSED'}"
            )
    for r in dec:
        exact = r.solve.startswith("exact")
        if (r.n, r.k, r.d) == (20, 100, 4096) and r.speedup is not None:
            ok = r.speedup >= TARGET_SPEEDUP_4096
            out.append(
                f"decode (20,100,4096) {r.transform}: {r.speedup:.1f}x faster than dense "
                f"(>= {TARGET_SPEEDUP_4096}x): {'met' if ok else 'MISSED'}"
            )
        if exact and r.rel_diff is not None:
            ok = r.rel_diff <= TARGET_REL_DIFF_EXACT
            out.append(
                f"rel diff ({r.n},{r.k},{r.d}) {r.transform} [{r.solve}]: "
                f"{r.rel_diff:.1e} <= {TARGET_REL_DIFF_EXACT}: "
                f"{'met' if ok else 'MISSED'}"
            )
        if (r.n, r.k, r.d) == (100, 64, 65536):
            ok = r.decode_s <= TARGET_DECODE_S_65536
            out.append(
                f"decode (100,64,65536) {r.transform}: {r.decode_s:.2f} s <= "
                f"{TARGET_DECODE_S_65536} s: {'met' if ok else 'MISSED'}"
            )
    return out


def parse_case(text: str) -> tuple[int, int, int]:
    """``"n,k,d"`` -> (n, k, d)."""
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"a case is n,k,d; got {text!r}")
    return parts[0], parts[1], parts[2]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    p.add_argument("--encode-repeats", type=int, default=31, help="encodes per dimension")
    p.add_argument(
        "--encode-ratio", type=int, default=32, help="encode budget k = d / RATIO (default 32)"
    )
    p.add_argument("--decode-repeats", type=int, default=5, help="decodes per case")
    p.add_argument(
        "--case",
        type=parse_case,
        action="append",
        metavar="N,K,D",
        help="decode case (repeatable); default: the four cases of the issue",
    )
    p.add_argument(
        "--transform",
        action="append",
        choices=("avg", "max", "one"),
        help="transform (repeatable); default: avg and max",
    )
    p.add_argument("--no-encode", action="store_true", help="skip the encode benchmark")
    p.add_argument("--no-decode", action="store_true", help="skip the decode benchmark")
    p.add_argument("--no-dense", action="store_true", help="skip the dense reference decoder")
    p.add_argument("--seed", type=int, default=7, help="seed of the synthetic data")
    p.add_argument("--container", metavar="IMAGE",
                   help="decode the cases here and inside IMAGE (docker run), side by side; "
                        "no encode, no dense reference")
    p.add_argument("--container-seconds", type=float, default=10.0,
                   help="with --container: decode each case at least --decode-repeats times "
                        "and until the host's decodes took this long (default 10)")
    p.add_argument("--container-env", action="append", default=[], metavar="NAME=VALUE",
                   help="with --container: an environment variable of the container "
                        "(repeatable; e.g. RPSAGG_NATIVE=0)")
    p.add_argument("--serve-round", metavar="NPZ", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.serve_round:  # inside the container of --container
        serve_round(args.serve_round)
        return 0

    dims = QUICK_ENCODE_DIMS if args.quick else ENCODE_DIMS
    cases = args.case or list(QUICK_DECODE_CASES if args.quick else DECODE_CASES)
    transforms = args.transform or list(TRANSFORMS)

    if args.container:
        if args.decode_repeats < 1:
            p.error("--decode-repeats must be >= 1")
        rows = [bench_container(args.container, n, k, d, t, args.decode_repeats,
                                args.container_seconds, args.seed, args.container_env)
                for n, k, d in cases for t in transforms]
        print(f"load average {os.getloadavg()[0]:.1f}; host FWHT {rpsagg.FWHT_BACKEND}")
        print_container(args.container, rows)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"image": args.container, "container_env": args.container_env,
                           "numpy": np.__version__, "scipy": scipy.__version__,
                           "python": platform.python_version(), "cpus": os.cpu_count(),
                           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "rows": [asdict(r) for r in rows]}, fh, indent=1)
        return 0

    enc: list[EncodeRow] = []
    if not args.no_encode:
        for d in dims:
            enc.append(bench_encode(d, max(1, d // args.encode_ratio), args.encode_repeats))
            e = enc[-1]
            print(f"# encode d={d}: {e.encode_ms:.3f} ms", file=sys.stderr, flush=True)
    dec: list[DecodeRow] = []
    for n, k, d in [] if args.no_decode else cases:
        for t in transforms:
            dec.append(bench_decode(n, k, d, t, args.decode_repeats, not args.no_dense, args.seed))
            r = dec[-1]
            print(
                f"# decode {(n, k, d)} {t}: {r.decode_s:.4f} s [{r.solve}], beta "
                f"{r.beta_seconds:.1f} s, dense {_fmt(r.dense_s, '.2f')} s",
                file=sys.stderr,
                flush=True,
            )
    print_tables(enc, dec)
    if args.json:
        payload: dict[str, Any] = {
            "spec_version": rpsagg.SPEC_VERSION,
            "fwht_backend": rpsagg.FWHT_BACKEND,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "encode": [asdict(e) for e in enc],
            "decode": [asdict(r) for r in dec],
            "targets": check_targets(enc, dec),
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
