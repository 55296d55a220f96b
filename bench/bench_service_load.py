"""Load benchmark (acceptance 7; not a test): 200 concurrent clients in one round.

Starts an in-process server (grpc.aio, SQLite WAL on a temporary file, group commit),
joins 200 clients, pre-encodes one Rand-Proj-Spatial submission each (k=128, d=4096), then
fires all submissions concurrently from an asyncio client and reports submissions/s and
p50/p99 submit latency. Afterwards it checks that every acked submission is committed in
the database and that the round decoded with n'=200.

    python bench/bench_service_load.py [--clients 200] [--k 128] [--d 4096] [--db PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np

from rpsagg import make_estimator
from rpsagg._spec import derive_round_seed
from rpsagg.v1 import serde
from rpsagg.v1.serde import JoinRequest, Submission, VectorPayload
from rpsagg_server.config import ServerConfig
from rpsagg_server.server import create_server
from rpsagg_server.store import Store


async def main_async(args: argparse.Namespace) -> None:
    n, k, d = args.clients, args.k, args.d
    db = args.db or str(Path(tempfile.mkdtemp(prefix="rpsagg-load-")) / "load.db")
    cfg = replace(ServerConfig(insecure=True), grpc_port=0, http_port=0, host="127.0.0.1",
                  n=n, k=k, d=d, task="mean", rounds=1, round_timeout=600.0, db=db,
                  transform="one")  # c = 0: beta is exact, so no Monte Carlo in the way
    running, port = await create_server(cfg)
    try:
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts)
                    for _ in range(args.channels)]
        join = [ch.unary_unary(serde.method_path("Join"), serde.serializer("Join"),
                               serde.deserializer("Join")) for ch in channels]
        submit = [ch.unary_unary(serde.method_path("Submit"), serde.serializer("Submit"),
                                 serde.deserializer("Submit")) for ch in channels]
        ids = [f"load-{i:04d}" for i in range(n)]
        for i, cid in enumerate(ids):
            await join[i % len(join)](JoinRequest(cid), timeout=30)
        rnd = running.engine.round_info()
        est = make_estimator("rand-proj-spatial", n=n, k=k, d=d)
        xs = np.random.default_rng(0).standard_normal((n, d))
        subs = []
        for i, cid in enumerate(ids):
            seed = secrets.randbits(64)
            enc = est.encode(xs[i], derive_round_seed(seed, rnd.nonce, cid, 0))
            subs.append(Submission(rnd.round_id, cid, seed, (VectorPayload(enc.values),)))
        latencies: list[float] = []

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            await submit[i % len(submit)](subs[i], timeout=120)
            latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - start
        res = await running.engine.result(rnd.round_id, True, 600)
        for ch in channels:
            await ch.close()
    finally:
        await running.stop(0.5)
    store = Store(db)
    committed = len(store.submissions(rnd.round_id))
    store.close()
    lat = np.array(latencies) * 1000
    print(f"clients={n} k={k} d={d} channels={args.channels} db={db}")
    print(f"acked={len(latencies)} committed={committed} decoded n'={res.n_prime} "
          f"state={res.state} decode={res.decode_seconds:.2f}s")
    print(f"throughput: {n / wall:.0f} submissions/s ({wall * 1000:.0f} ms for all)")
    print(f"submit latency: p50 {np.percentile(lat, 50):.1f} ms, "
          f"p99 {np.percentile(lat, 99):.1f} ms, max {lat.max():.1f} ms")
    if committed != n or len(latencies) != n or res.n_prime != n:
        raise SystemExit("LOST SUBMISSIONS")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--k", type=int, default=128)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--channels", type=int, default=8, help="client-side HTTP/2 connections")
    p.add_argument("--db", default=None)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
