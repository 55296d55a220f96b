"""Blockwise decode time against d: local threads and Ray workers (docs/scaling.md).

For each d, n clients encode blockwise (blocks of ``--block``); the decode of the round is
timed locally with 1, 2, ... threads and on a local Ray cluster with 1, 2, ... worker CPUs
(``ray.init(num_cpus=W)``, tasks with one thread each, one warm-up decode first). beta is
computed (and cached) before any timing. Ray's estimate is checked to equal the local one
bit for bit. Prints a table; ``--json`` writes the figures.

    python bench/bench_scaling.py --d-log 20,22 --threads 1,2 --ray-workers 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import rpsagg


def timed(fn: Any, repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--k-per-block", type=int, default=256, help="floats per block")
    p.add_argument("--block", type=int, default=2**18)
    p.add_argument("--d-log", default="20,22")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--ray-workers", default="1,2")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    load = os.getloadavg()
    print(f"FWHT {rpsagg.FWHT_BACKEND}, cores {os.cpu_count()}, load {load[0]:.1f}")
    for log_d in [int(x) for x in args.d_log.split(",")]:
        d = 2**log_d
        blocks = max(1, d // args.block)
        k = args.k_per_block * blocks
        est = rpsagg.make_estimator("rand-proj-spatial", n=args.n, k=k, d=d,
                                    block_size=args.block, method="cg")
        rng = np.random.default_rng(log_d)
        base = rng.standard_normal(d)
        batch = [est.encode(base + rng.standard_normal(d), 1000 + i) for i in range(args.n)]
        t = time.perf_counter()
        est.block_betas(args.n)  # type: ignore[attr-defined]
        beta_s = time.perf_counter() - t
        row: dict[str, Any] = {"d": d, "n": args.n, "k": k, "blocks": blocks,
                               "beta_s": beta_s, "local": {}, "ray": {}}
        want = None
        for threads in [int(x) for x in args.threads.split(",")]:
            one = est.with_threads(threads)  # type: ignore[attr-defined]
            sec, res = timed(lambda one=one, b=batch: one.decode_with_info(b), args.repeats)
            want = res.estimate
            row["local"][threads] = sec
            print(f"d=2^{log_d} local {threads} thread(s): {sec:.2f}s "
                  f"({res.solve.iterations} it)", flush=True)
        workers = [int(x) for x in args.ray_workers.split(",") if x]
        if workers:
            import ray

            from rpsagg_server.decode import raydecode

            single = est.with_threads(1)  # type: ignore[attr-defined]
            for w in workers:
                ray.init(num_cpus=w, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
                try:
                    raydecode.decode_vectors(single, [batch])  # warm-up: workers start
                    sec, res = timed(
                        lambda s=single, b=batch: raydecode.decode_vectors(s, [b]),
                        args.repeats)
                finally:
                    ray.shutdown()
                    raydecode._remote = None
                same = bool(np.array_equal(res[0].estimate, want))
                row["ray"][w] = {"seconds": sec, "bitwise_equal_local": same}
                print(f"d=2^{log_d} ray {w} worker(s): {sec:.2f}s (equal to local: {same})",
                      flush=True)
        payload = 8 * args.n + 4 * args.n * k
        row["object_store_put_bytes"] = payload
        row["results_bytes"] = 8 * blocks * args.block
        rows.append(row)
    out = {"fwht": rpsagg.FWHT_BACKEND, "cores": os.cpu_count(), "load_start": load,
           "load_end": os.getloadavg(), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
