"""Any d without padding loss: the candidate projections compared at d not a power of two.

Candidates (all with random signs, uniform rows and, for the two new ones, a random cyclic
shift, which makes ``E[T(S)^+ G_i^T G_i]`` a multiple of the identity):

* ``srht-pad``: the SRHT on x zero-padded to d' (library, ``projection="srht"``);
* ``dct``: the subsampled randomized DCT of length d (library, ``projection="dct"``);
* ``hblocks``: two overlapping power-of-two Hadamard blocks of length b = 2^floor(log2 d)
  (library, ``projection="hblocks"``, the default for d not a power of two);
* ``blocks``: an exact split of d into power-of-two blocks (its binary expansion, e.g.
  300 = 256 + 32 + 8 + 4) with a normalized Hadamard per block; rows uniform over all d, so
  every block keeps the ratio k/d in expectation (a fixed per-block budget cannot: at
  k = 9, d = 300 the blocks' shares are 7.68, 0.96, 0.24, 0.12). A dense prototype here
  (numpy randomness, not a wire format), to measure what the split would give.

MSE: every candidate decoded by the same dense formula ``beta A^T f(K) y`` with its own Monte
Carlo beta (``d_op / E[sum_j l_j / T(l_j)]``, separate seeds); printed with the standard
error over the trials. Encode: median time of one encode of a vector of length d (srht-pad
at d', dct and hblocks at d, blocks: one FWHT per block, as an encoder would do it), the
candidates timed in turn within every repetition (interleaved, so that the load of the
shared machine falls on all alike); and two ways out for the DCT that were not built,
timed as prototypes: ``dct5`` (the DCT of x zero-padded to the next 5-smooth length,
``scipy.fft.next_fast_len``) and ``dct32`` (the DCT of length d in float32).

Usage (one BLAS thread: on a loaded 2-core machine OpenBLAS's threads make a 400 x 400
eigendecomposition 40x slower)::

    OPENBLAS_NUM_THREADS=1 python bench/bench_anyd.py          # MSE at the targets, encode
    OPENBLAS_NUM_THREADS=1 python bench/bench_anyd.py --quick  # fewer trials and sizes
    python bench/bench_anyd.py --sections encode-proc  # encodes, one projection per process
    python bench/bench_anyd.py --sections encode-proc --gap-ms 5  # ... one encode per round
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from rpsagg import spec
from rpsagg.projections import (
    dct_encode,
    dct_matrix,
    fwht,
    hblocks_encode,
    hblocks_matrix,
    srht_encode,
    srht_matrix,
)
from rpsagg.spec import TAG_ROWS, dct_shift, padded_dim, sample_distinct, sign_factors

FloatArray = NDArray[np.float64]
Maker = Callable[[int, int, int], FloatArray]  # (seed, k, d) -> dense k x d_op matrix


def block_sizes(d: int) -> list[int]:
    """The binary expansion of d, largest block first."""
    return [1 << b for b in range(d.bit_length() - 1, -1, -1) if d >> b & 1]


def _hadamard(m: int) -> FloatArray:
    h = np.ones((1, 1))
    while h.shape[0] < m:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(m)


def blocks_matrix(seed: int, k: int, d: int) -> FloatArray:
    """Dense G = E W P D of the block-split prototype (W = blockdiag of Hadamards)."""
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], size=d)
    shift = int(rng.integers(d))
    rows = rng.choice(d, size=k, replace=False)
    w = np.zeros((d, d))
    lo = 0
    for b in block_sizes(d):
        w[lo : lo + b, lo : lo + b] = _hadamard(b)
        lo += b
    perm = (np.arange(d) + shift) % d  # (P v)[(j + s) mod d] = v[j]
    wp = w[:, perm]  # W P: column j of W P is column (j + s) mod d of W
    return np.asarray(wp[rows] * signs[None, :])


def srht_pad_matrix(seed: int, k: int, d: int) -> FloatArray:
    return srht_matrix(seed, k, d)


MAKERS: dict[str, Maker] = {"srht-pad": srht_pad_matrix, "dct": dct_matrix,
                            "hblocks": hblocks_matrix, "blocks": blocks_matrix}


def spectral_sum(a: FloatArray, c: float) -> float:
    """sum_j l_j / T(l_j) over the non-zero eigenvalues of K = A A^T."""
    w = np.linalg.eigvalsh(a @ a.T)
    w = w[w > 1e-9 * max(1.0, float(w.max()))]
    return float(np.sum(w / ((1.0 - c) + c * w)))


def mse(maker: Maker, xs: FloatArray, k: int, c: float, beta_samples: int,
        salt: int) -> tuple[float, float]:
    """Mean and standard error of ||x_hat - x_bar||^2 over the trials xs (T, n, d)."""
    trials, n, d = xs.shape
    d_op = maker(0, 1, d).shape[1]
    sums = [spectral_sum(np.vstack([maker(10**9 + s * n + i, k, d) for i in range(n)]), c)
            for s in range(beta_samples)]
    beta = d_op / float(np.mean(sums))
    errors = np.empty(trials)
    for t in range(trials):
        a = np.vstack([maker(salt + t * n + i, k, d) for i in range(n)])
        xpad = np.zeros((n, d_op))
        xpad[:, :d] = xs[t]
        y = np.concatenate([a[i * k : (i + 1) * k] @ xpad[i] for i in range(n)])
        kmat = a @ a.T
        if c == 1.0:
            z = np.linalg.pinv(kmat, rcond=1e-10, hermitian=True) @ y
        else:
            z = np.linalg.solve((1.0 - c) * np.eye(n * k) + c * kmat, y)
        est = beta * (a.T @ z)[:d]
        err = est - xs[t].mean(axis=0)
        errors[t] = err @ err
    return float(errors.mean()), float(errors.std(ddof=1) / math.sqrt(trials))


def blocks_encode(x: FloatArray, seed: int, k: int) -> FloatArray:
    """What an encoder of the block split does: signs, shift, one FWHT per block, k rows."""
    d = x.shape[0]
    rng = np.random.default_rng(seed)
    v = np.roll(x * rng.choice(np.array([-1.0, 1.0]), size=d), int(rng.integers(d)))
    lo = 0
    for b in block_sizes(d):
        fwht(v[lo : lo + b], inplace=True)
        lo += b
    return np.take(v, rng.choice(d, size=k, replace=False))


def dct_smooth_encode(x: FloatArray, seed: int, k: int) -> FloatArray:
    """Prototype: the library's DCT encode, on x zero-padded to the next 5-smooth length."""
    import scipy.fft

    d = x.shape[0]
    padded = np.zeros(scipy.fft.next_fast_len(d, real=True))
    padded[:d] = x
    return dct_encode(padded, seed, k)


def dct32_encode(x: FloatArray, seed: int, k: int) -> FloatArray:
    """Prototype: the library's DCT encode (same signs, shift and rows) in float32."""
    import scipy.fft

    d = x.shape[0]
    v = (x * sign_factors(seed, d)).astype(np.float32)
    w = np.empty_like(v)
    s = dct_shift(seed, d)
    w[s:], w[:s] = v[: d - s], v[d - s :]
    out = scipy.fft.dct(w, type=2, norm="ortho", overwrite_x=True)
    return np.asarray(np.take(out, sample_distinct(seed, TAG_ROWS, k, d)))


_one_core_buffers: dict[int, FloatArray] = {}


def srht_one_core(x: FloatArray, seed: int, k: int, d_pad: int) -> FloatArray:
    """The library's SRHT encode on one core: its branch for d' below the two-core split,
    from the public pieces (the compiled sign multiply where built, one FWHT of length d')."""
    v = _one_core_buffers.get(d_pad)
    if v is None:
        v = _one_core_buffers[d_pad] = np.empty(d_pad)
    if spec.NATIVE is not None:
        spec.NATIVE.sign_multiply(x, spec.stream_key(seed, spec.TAG_SIGNS), v)
    else:
        v[: x.shape[0]] = x * spec.sign_factors(seed, d_pad)[: x.shape[0]]
        v[x.shape[0] :] = 0.0
    rows = spec.srht_rows(seed, k, d_pad)
    fwht(v, inplace=True)
    out = np.take(v, rows)
    out /= np.sqrt(d_pad)
    return out


def interleaved_ms(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median ms of each function, timed in turn within every repetition, in a new random
    order each time (seeded): what one encode leaves behind (the two-core SRHT's spinning
    OpenMP threads, the caches) then falls on every function alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    order = np.random.default_rng(0)
    for _ in range(reps):
        for i in order.permutation(len(names)):
            name, fn = names[i], fns[names[i]]
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def median_ms(fn: Callable[[], object], reps: int, gap_s: float = 0.0) -> float:
    """Median ms of ``fn`` over ``reps`` calls, each ``gap_s`` seconds after the last."""
    fn()
    times = []
    for _ in range(reps):
        if gap_s:
            time.sleep(gap_s)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def decode_times() -> None:
    """Median decode time (avg, beta computed first) of the padded SRHT, the DCT and hblocks."""
    import rpsagg

    print("\ndecode, avg, median of 3 (beta computed before timing)")
    for n, k, d in ((10, 30, 300), (20, 100, 3000), (20, 64, 30_000)):
        xs = np.random.default_rng(1).standard_normal((n, d))
        for proj in ("srht", "dct", "hblocks"):
            est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="avg",
                                        projection=proj)
            _ = est.beta_bar
            msgs = [est.encode(x, 100 + i) for i, x in enumerate(xs)]
            times, info = [], None
            for _rep in range(3):
                start = time.perf_counter()
                info = est.decode_with_info(msgs).solve
                times.append(time.perf_counter() - start)
            assert info is not None
            print(f"  {(n, k, d)} {proj:4s} dim {est.d_pad:6d}: {np.median(times):.3f} s "  # type: ignore[attr-defined]
                  f"({info.method}, {info.iterations} iterations)", flush=True)


def max_near_full_rank() -> None:
    """Relative MSE of max and avg on correlated, non-identical vectors as nk approaches d."""
    import rpsagg
    from rpsagg.synthetic import correlated_vectors

    n, d, trials = 10, 100, 300
    xs = correlated_vectors(n, d, 4.0, seed=5) * np.linspace(0.5, 2.0, d)
    x_bar = xs.mean(axis=0)
    print(f"\nrelative MSE, R = 4, n = {n}, d = {d}, {trials} trials: mean (median)")
    for k in (10, 9, 8, 5):
        cells = []
        for proj in ("hblocks", "dct", "srht"):
            for transform in ("max", "avg"):
                est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d,
                                            transform=transform, projection=proj)
                errs = np.empty(trials)
                for t in range(trials):
                    msgs = [est.encode(x, 40_000 + t * n + i) for i, x in enumerate(xs)]
                    e = est.decode(msgs) - x_bar
                    errs[t] = (e @ e) / (x_bar @ x_bar)
                cells.append(f"{proj} {transform} {errs.mean():.4g} ({np.median(errs):.4g})")
        print(f"  k = {k:2d} (nk = {n * k}): " + "; ".join(cells), flush=True)


ENCODERS = ("srht-pad", "hblocks", "hblocks-1c")
_ENCODE_DIMS = (30_000, 50_000, 70_000, 100_000, 140_000, 200_000, 300_000, 400_000, 600_000,
                800_000, 1_000_000, 999_983)


def _encode_one_process(name: str, gap_ms: float) -> None:
    """Child of ``--sections encode-proc``: median ms of ``name``'s encode at every d in this
    process (as a client runs one projection), back to back or each ``gap_ms`` after the
    last (a client encodes once per round: threads that waited for work have gone to sleep
    by then), printed as JSON."""
    import json

    out = {}
    for dim in _ENCODE_DIMS:
        x = np.random.default_rng(dim).standard_normal(dim)
        kk, dp = max(1, dim // 100), padded_dim(dim)
        fn = {"srht-pad": lambda: srht_encode(x, 1, kk, dp),  # noqa: B023
              "hblocks": lambda: hblocks_encode(x, 1, kk),  # noqa: B023
              "hblocks-1c": lambda: hblocks_encode(x, 1, kk, threads=1)}[name]  # noqa: B023
        out[dim] = (median_ms(fn, _gap_reps(gap_ms), gap_ms / 1e3) if gap_ms
                    else median_ms(fn, _encode_reps(dim)))
    print(json.dumps(out))


def encode_per_process(rounds: int, gap_ms: float) -> None:
    """Each projection's encodes in a process of its own, the processes alternated over
    ``rounds`` rounds (no projection's threads or caches fall on another's timing)."""
    import json
    import subprocess
    import sys

    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ENCODERS}
    for r in range(rounds):
        for name in ENCODERS if r % 2 == 0 else ENCODERS[::-1]:
            text = subprocess.run([sys.executable, __file__, "--encode-child", name,
                                   "--gap-ms", str(gap_ms)],
                                  check=True, capture_output=True, text=True).stdout
            runs[name].append({int(k): v for k, v in json.loads(text).items()})
    spacing = (f"{_gap_reps(gap_ms)} encodes each {gap_ms:g} ms after the last" if gap_ms
               else "back-to-back encodes")
    print(f"\nencode, one projection per process ({rounds} processes each, alternated; "
          f"median ms of {spacing} in each; k = d/100): the range over the "
          "processes, and hblocks / srht-pad of their medians")
    print(f"{'d':>9s} {'srht-pad':>15s} {'hblocks':>15s} {'hblocks-1c':>15s} {'ratio':>6s}")
    for dim in _ENCODE_DIMS:
        cells = {n: [run[dim] for run in runs[n]] for n in ENCODERS}
        ratio = float(np.median(cells["hblocks"]) / np.median(cells["srht-pad"]))
        print(f"{dim:9d} " + " ".join(f"{min(c):7.3f}-{max(c):<7.3f}" for c in cells.values())
              + f" {ratio:6.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=None, help="trials per MSE (400)")
    parser.add_argument("--beta-samples", type=int, default=None, help="beta samples (300)")
    parser.add_argument("--encode-child", choices=ENCODERS, help=argparse.SUPPRESS)
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="--sections encode-proc: time encodes spaced this far apart "
                             "(one per round, as a client) instead of back to back")
    parser.add_argument("--rounds", type=int, default=3,
                        help="processes per projection for --sections encode-proc")
    parser.add_argument("--sections", default="mse,encode,decode,max",
                        help="comma-separated subset of mse,encode,decode,max,encode-proc "
                             "(not in the default)")
    args = parser.parse_args()
    if args.encode_child:
        _encode_one_process(args.encode_child, args.gap_ms)
        return
    trials = args.trials or (100 if args.quick else 400)
    beta_samples = args.beta_samples or (50 if args.quick else 300)
    d = 300
    rng = np.random.default_rng(2026)
    cases = []
    # the targets: one on independent vectors, max on identical ones
    indep = rng.standard_normal((trials, 4, d))
    indep /= np.linalg.norm(indep, axis=2, keepdims=True)
    cases.append(("one, independent, n=4 k=100", indep, 100, 0.0, (d / 100 - 1) / 4))
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    cases.append(("max, identical, n=7 k=9", np.broadcast_to(u, (trials, 7, d)), 9, 1.0,
                  d / 63 - 1))
    # between the two: avg on correlated vectors (common part plus independent noise)
    corr = u[None, None, :] + 0.7 * rng.standard_normal((trials, 7, d)) / math.sqrt(d)
    cases.append(("avg, correlated, n=7 k=9", corr, 9, 7 / 12, float("nan")))
    sections = set(args.sections.split(","))
    if "mse" in sections:
        print(f"MSE at d = {d} (d' = {padded_dim(d)}), {trials} trials, beta from "
              f"{beta_samples} Monte Carlo samples; +- one standard error")
        print(f"{'case':32s} {'target':>8s} " + " ".join(f"{m:>18s}" for m in MAKERS))
    for label, xs, k, c, target in cases if "mse" in sections else []:
        cells = []
        for salt, maker in enumerate(MAKERS.values()):
            mean, se = mse(maker, np.asarray(xs), k, c, beta_samples, 1000 * (salt + 1))
            cells.append(f"{mean:9.4f} +- {se:6.4f}")
        print(f"{label:32s} {target:8.4f} " + " ".join(f"{c_:>18s}" for c_ in cells),
              flush=True)
    if "decode" in sections:
        decode_times()
    if "max" in sections:
        max_near_full_rank()
    if "encode-proc" in sections:
        encode_per_process(args.rounds, args.gap_ms)
    if "encode" not in sections:
        return
    print("\nencode, median ms (k = d/100). srht-pad (the library's SRHT at d', as it runs: "
          "from d' = 2^18 on the two halves on two cores), srht-1c (the SRHT on one core) "
          "hblocks (from b = 2^15 on, the halves of its FWHTs on two threads) and hblocks-1c "
          "(threads=1) interleaved over `reps` repetitions; then the DCTs and blocks "
          "interleaved over fewer; ratio = hblocks / srht-pad")
    print(f"{'d':>9s} {'d_pad':>9s} {'reps':>5s} {'srht-pad':>9s} {'srht-1c':>9s} "
          f"{'hblocks':>9s} {'ratio':>6s} {'hblocks-1c':>10s} {'dct':>9s} {'dct5':>9s} "
          f"{'dct32':>9s} {'blocks':>9s}")
    dims = (300, 3000, 100_000) if args.quick else (
        300, 3000, 30_000, 50_000, 70_000, 100_000, 140_000, 200_000, 300_000, 400_000, 600_000,
        800_000, 1_000_000, 999_983)
    # Two passes over the dims, so that the DCT variants (scipy's Bluestein DCT at a prime d
    # allocates and frees hundreds of MiB) do not disturb the SRHTs and hblocks.
    rows: dict[int, dict[str, float]] = {}
    for dim in dims:
        x = np.random.default_rng(dim).standard_normal(dim)
        kk, dp = max(1, dim // 100), padded_dim(dim)
        fns = {
            "srht": lambda: srht_encode(x, 1, kk, dp),  # noqa: B023
            "srht1": lambda: srht_one_core(x, 1, kk, dp),  # noqa: B023
            "hblocks": lambda: hblocks_encode(x, 1, kk),  # noqa: B023
            "hblocks1": lambda: hblocks_encode(x, 1, kk, threads=1),  # noqa: B023
        }
        rows[dim] = interleaved_ms(fns, _encode_reps(dim))
    for dim in dims:
        x = np.random.default_rng(dim).standard_normal(dim)
        kk = max(1, dim // 100)
        rows[dim].update(interleaved_ms({
            "dct": lambda: dct_encode(x, 1, kk),  # noqa: B023
            "dct5": lambda: dct_smooth_encode(x, 1, kk),  # noqa: B023
            "dct32": lambda: dct32_encode(x, 1, kk),  # noqa: B023
            "blocks": lambda: blocks_encode(x, 1, kk),  # noqa: B023
        }, max(5, _encode_reps(dim) // 20)))
    for dim in dims:
        t = rows[dim]
        print(f"{dim:9d} {padded_dim(dim):9d} {_encode_reps(dim):5d} {t['srht']:9.4f} "
              f"{t['srht1']:9.4f} {t['hblocks']:9.4f} {t['hblocks'] / t['srht']:6.2f} "
              f"{t['hblocks1']:10.4f} {t['dct']:9.4f} {t['dct5']:9.4f} {t['dct32']:9.4f} "
              f"{t['blocks']:9.4f}", flush=True)


def _gap_reps(gap_ms: float) -> int:
    """Encodes per d with ``--gap-ms`` (about 2 s of gaps per d, 21 to 101)."""
    return max(21, min(101, int(2000 / gap_ms)))


def _encode_reps(dim: int) -> int:
    """Repetitions of the interleaved SRHT/hblocks timing at ``dim`` (at most about 2 s)."""
    return max(301, min(5001, 300_000_000 // dim))

if __name__ == "__main__":
    main()
