"""The blockwise Rand-Proj-Spatial decode at the Flower benchmark's 2M-parameter shape.

    python bench/bench_blockwise.py                  # 8-bit and float32, error_tol off/1e-3/1e-2
    python bench/bench_blockwise.py --bits 8 --tols none 0.01 --repeat 9

The shape of ``examples/flower-fashion-mnist/benchmark.py``'s wide model: d = 2,002,001,
n = 5, blocks of 2^18 (8 blocks), k = 80,080 8-bit codes or 20,020 float32 values (k/100
of d at 32 bits, the same bytes at 8), vectors ``x_i = base + 0.5 g_i`` (correlated, as
clients' updates are). For each value width and ``error_tol`` it prints the decode time
(``decode_with_info``: best and median of ``--repeat`` decodes of the same messages, after
one to warm the caches), the conjugate-gradient iterations over all blocks, and how far
the estimate lies from a solve to rtol 1e-12, as a share of that solve's error
``||x* - x_bar||`` (the estimator's own error on these vectors).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import rpsagg

D, N, BLOCK = 2_002_001, 5, 1 << 18
K = {8: 80_080, 32: 20_020}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, nargs="+", default=[8, 32], choices=[8, 32])
    ap.add_argument("--tols", nargs="+", default=["none", "1e-3", "1e-2"],
                    help="error_tol values ('none': off, the default)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    base = rng.standard_normal(D)
    xs = [base + 0.5 * rng.standard_normal(D) for _ in range(N)]
    x_bar = np.mean(xs, axis=0)
    print(f"d = {D:,}, n = {N}, blocks of 2^18; {os.cpu_count()} CPUs (threads: all of them)")
    print("| values | k | error_tol | decode best / median | CG iterations | "
          "||x - x*|| / ||x* - x_bar|| |\n|" + " --- |" * 6)
    for bits in args.bits:
        common = {"n": N, "k": K[bits], "d": D, "block_size": BLOCK,
                  **({"value_bits": bits} if bits < 32 else {})}
        tight = rpsagg.make_estimator("rand-proj-spatial", rtol=1e-12, **common)
        msgs = [tight.encode(x, seed=100 + i) for i, x in enumerate(xs)]
        exact = tight.decode(msgs)
        err = float(np.linalg.norm(exact - x_bar))
        for tol_s in args.tols:
            tol = None if tol_s == "none" else float(tol_s)
            est = rpsagg.make_estimator("rand-proj-spatial", error_tol=tol, **common)
            est.decode(msgs)  # warm: beta, the plans
            runs = [est.decode_with_info(msgs) for _ in range(args.repeat)]
            secs = [r.seconds for r in runs]
            last = runs[-1]
            assert last.solve is not None
            dev = float(np.linalg.norm(last.estimate - exact)) / err
            print(f"| {'8-bit' if bits == 8 else 'float32'} | {K[bits]:,} | {tol_s} | "
                  f"{min(secs):.3f} / {float(np.median(secs)):.3f} s | "
                  f"{last.solve.iterations} | {dev:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
