"""Load benchmark (acceptance 7; not a test): 200 concurrent clients in one round.

Starts ``rpsagg-server`` as a separate process (grpc.aio, SQLite WAL on a temporary file,
group commit), joins 200 clients from this process, pre-encodes one Rand-Proj-Spatial
submission each (k=128, d=4096), then
fires all submissions concurrently from an asyncio client and reports submissions/s and
p50/p99 submit latency. Afterwards it checks that every acked submission is committed in
the database and that the round decoded with n'=200.

    python bench/bench_service_load.py [--clients 200] [--k 128] [--d 4096] [--db PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

from rpsagg import make_estimator
from rpsagg._spec import derive_round_seed
from rpsagg.v1 import serde
from rpsagg.v1.serde import (
    GetResultRequest,
    GetRoundRequest,
    JoinRequest,
    Submission,
    VectorPayload,
)
from rpsagg_server.store import Store


async def main_async(args: argparse.Namespace) -> None:
    n, k, d = args.clients, args.k, args.d
    work = Path(tempfile.mkdtemp(prefix="rpsagg-load-"))
    db = args.db or str(work / "load.db")
    port_file = work / "port"
    # transform one: c = 0 and beta is exact, so no Monte Carlo in the way
    server = subprocess.Popen([
        sys.executable, "-m", "rpsagg_server.server", "--insecure", "--host", "127.0.0.1",
        "--grpc-port", "0", "--http-port", "0", "--n", str(n), "--k", str(k), "--d", str(d),
        "--task", "mean", "--rounds", "1", "--round-timeout", "600", "--db", db,
        "--transform", "one", "--linger", "-1", "--port-file", str(port_file),
    ], env=dict(os.environ, RPSAGG_LOG_LEVEL="WARNING"))
    while not port_file.exists():
        if server.poll() is not None:
            raise SystemExit("server failed to start")
        await asyncio.sleep(0.05)
    port = int(port_file.read_text())
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
        get_round = channels[0].unary_unary(serde.method_path("GetRound"),
                                            serde.serializer("GetRound"),
                                            serde.deserializer("GetRound"))
        get_result = channels[0].unary_unary(serde.method_path("GetResult"),
                                             serde.serializer("GetResult"),
                                             serde.deserializer("GetResult"))
        rnd = await get_round(GetRoundRequest(), timeout=30)
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
        res = await get_result(GetResultRequest(rnd.round_id, True), timeout=600)
        for ch in channels:
            await ch.close()
    finally:
        server.terminate()
        server.wait(30)
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
