"""The joint SRHT products' time against the tile size (``rpsagg._srht_plan.tile_bits``).

    python bench/bench_tiles.py                 # the shapes of docs/scaling.md's table
    python bench/bench_tiles.py --shape 5 10010 18 --threads 2 --repeat 15

For each shape (n clients, k rows, d' = 2^log_d) it times one adjoint plus one forward
product of ``JointSRHT`` (the compiled tile kernels) at every tile size m from 12 to 16
(those below 7 or above log2 d' left out), the sizes interleaved round by round so that
a change in the machine's load hits them alike, and prints the best and the median of the
repeats in milliseconds, with the m the rule picks.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from rpsagg.projections import JointSRHT, product_path, tile_bits

SHAPES = [(5, 10010, 18), (5, 2503, 18), (10, 1024, 16), (20, 4096, 16), (100, 1024, 20)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", nargs=3, type=int, action="append", metavar=("N", "K", "LOG_D"),
                    help="a shape to time (repeatable; default: docs/scaling.md's)")
    ap.add_argument("--threads", type=int, default=2, help="threads per product (default 2)")
    ap.add_argument("--repeat", type=int, default=15, help="rounds (default 15; 3 at 2^20)")
    args = ap.parse_args(argv)
    if product_path() != "tiles":
        ap.error("the compiled tile kernels are not built (rpsagg._fast)")
    print("| n, k, d' | " + " | ".join(f"m = {m}" for m in range(12, 17))
          + " | rule |\n|" + " --- |" * 7, flush=True)
    for n, k, log_d in args.shape or SHAPES:
        d_pad = 1 << log_d
        base = JointSRHT.from_seeds(list(range(1, n + 1)), k, d_pad, threads=args.threads)
        rng = np.random.default_rng(0)
        z, u = rng.standard_normal((n, k)), rng.standard_normal(d_pad)
        ops = {m: dataclasses.replace(base, tile_log2=m) for m in range(12, 17)
               if 7 <= m <= log_d}
        times: dict[int, list[float]] = {m: [] for m in ops}
        for _ in range(args.repeat if log_d < 20 else min(args.repeat, 3)):
            for m, op in ops.items():
                t0 = time.perf_counter()
                op.adjoint(z)
                op.forward(u)
                times[m].append(time.perf_counter() - t0)
        cells = [f"{1e3 * min(times[m]):.2f} / {1e3 * float(np.median(times[m])):.2f}"
                 if m in times else "" for m in range(12, 17)]
        print(f"| {n}, {k:,}, 2^{log_d} | " + " | ".join(cells)
              + f" | {tile_bits(k, d_pad)} |", flush=True)
    print(f"\nms (best / median) for one adjoint and one forward, {args.threads} thread(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
