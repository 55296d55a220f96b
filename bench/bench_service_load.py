"""Load benchmark (not a test): many concurrent clients submitting in one round.

For each configuration it starts ``rpsagg-server`` as a separate process (grpc.aio, SQLite
WAL with ``synchronous=FULL`` on a temporary file, group commit), joins the clients from
this process, pre-encodes one Rand-Proj-Spatial submission each, then sends the
submissions from one asyncio process over a few HTTP/2 connections, either all at once (a
burst: every latency includes the queue of the whole burst) or open loop at an offered rate
(submission i at i/rate seconds: the latency at that load), and prints: submissions/s
(clients / time from the first send to the last ack), Submit latency p50/p99/max, the server's
RSS (now and peak), and the CPU time the server and this load generator spent in the burst
(CPU ms per submission is what the 2-core machine's other load does not change much; the
wall figures move with it, so the load average is printed too). Afterwards it checks that
every acked submission is committed in the database and that the round decoded with n' = n.

    python bench/bench_service_load.py                 # 200 clients k=128, 1000 clients k=64
    python bench/bench_service_load.py --repeat 3      # each configuration 3 times
    python bench/bench_service_load.py --clients 500 --k 64 --d 4096
    python bench/bench_service_load.py --profile /tmp/server.txt   # py-spy stacks of the burst
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from rpsagg import make_estimator
from rpsagg.spec import derive_round_seed
from rpsagg_server import eventloop
from rpsagg_server.launch import ServerExited, ServerProcess
from rpsagg_server.store import Store
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import (
    GetResultRequest,
    GetRoundRequest,
    JoinRequest,
    Submission,
    VectorPayload,
)

CONFIGS = ((200, 128, 4096), (1000, 64, 4096))  # (clients, k, d): the two cases
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _py_spy() -> str:
    """py-spy on PATH, else beside this interpreter (a virtual environment not activated)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else "py-spy")


def _rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out["VmRSS"], out["VmHWM"]


async def run_once(n: int, k: int, d: int, channels_n: int, profile: str | None,
                   db_path: str | None, rate: float = 0.0,
                   server_loop: str = "auto") -> dict[str, Any]:
    """One server, one round of ``n`` submissions; returns the figures.

    ``rate`` 0: all at once (a burst: every latency includes the queue of the whole burst);
    ``rate`` > 0: open loop, submission i sent at ``i / rate`` seconds (the latency at that
    offered load).
    """
    work = Path(tempfile.mkdtemp(prefix="rpsagg-load-"))
    try:
        return await _run_in(work, n, k, d, channels_n, profile, db_path, rate, server_loop)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the run's own database and port file


async def _run_in(work: Path, n: int, k: int, d: int, channels_n: int, profile: str | None,
                  db_path: str | None, rate: float, server_loop: str) -> dict[str, Any]:
    db = db_path or str(work / "load.db")
    # transform one: c = 0 and beta is exact, so no Monte Carlo in the way
    server = ServerProcess([
        "--insecure", "--host",
        "127.0.0.1", "--grpc-port", "0", "--http-port", "0", "--n", str(n), "--k", str(k),
        "--d", str(d), "--task", "mean", "--rounds", "1", "--round-timeout", "600",
        "--db", db, "--transform", "one", "--linger", "-1", "--event-loop", server_loop,
    ], work / "port", env=dict(os.environ, RPSAGG_LOG_LEVEL="WARNING"), start_timeout=120)
    try:
        await asyncio.to_thread(server.start)
    except (ServerExited, TimeoutError) as exc:
        raise SystemExit(f"server failed to start: {exc}") from None
    port = server.port
    assert server.proc is not None
    pid = server.proc.pid
    spy: subprocess.Popen[bytes] | None = None
    try:
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts)
                    for _ in range(channels_n)]
        join = [ch.unary_unary(serde.method_path("Join"), serde.serializer("Join"),
                               serde.deserializer("Join")) for ch in channels]
        # requests are serialized before the burst (as each client machine would have done
        # on its own CPU): the stubs send the bytes as they are
        submit = [ch.unary_unary(serde.method_path("Submit"), None,
                                 serde.deserializer("Submit")) for ch in channels]
        ids = [f"load-{i:04d}" for i in range(n)]
        await asyncio.gather(*(join[i % len(join)](JoinRequest(cid), timeout=60)
                               for i, cid in enumerate(ids)))
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
            subs.append(serde.serializer("Submit")(Submission(
                rnd.round_id, cid, seed, (VectorPayload(enc.values),),
                spec_version=rnd.spec_version)))
        latencies: list[float] = []

        start = 0.0
        done_at: list[float] = []

        async def one(i: int) -> None:
            if rate:  # open loop: submission i is sent at start + i / rate, whatever came back
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            t0 = time.perf_counter()
            await submit[i % len(submit)](subs[i], timeout=120)
            done_at.append(time.perf_counter())
            latencies.append(done_at[-1] - t0)

        if profile:  # sample the server during the burst only, native frames included
            spy = subprocess.Popen([_py_spy(), "record", "--pid", str(pid), "--native",
                                    "--threads", "--rate", "200",
                                    "--format", "raw", "-o", profile],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            await asyncio.sleep(1.0)  # py-spy attaches (no state to wait on: it says nothing)
        load = os.getloadavg()[0]
        cpu_server0 = _cpu_seconds(pid)
        cpu_self0 = time.process_time()
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = max(done_at) - start
        cpu_self = time.process_time() - cpu_self0
        cpu_server = _cpu_seconds(pid) - cpu_server0
        rss, hwm = _rss_mib(pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes the profile on SIGINT
            _, err = await asyncio.to_thread(spy.communicate, None, 30)
            if not Path(profile).exists():
                print(f"py-spy wrote no profile: {err.decode(errors='replace').strip()}")
        res = await get_result(GetResultRequest(rnd.round_id, True), timeout=600)
        for ch in channels:
            await ch.close()
    finally:
        server.stop()
    store = Store(db)
    committed = len(store.submissions(rnd.round_id))
    store.close()
    lat = np.array(latencies) * 1000
    if committed != n or len(latencies) != n or res.n_prime != n:
        raise SystemExit(f"LOST SUBMISSIONS: acked={len(latencies)} committed={committed} "
                         f"decoded n'={res.n_prime}")
    acks = sorted(done_at)
    ack_rate = (n - 1) / (acks[-1] - acks[0]) if n > 1 and acks[-1] > acks[0] else float("nan")
    return {"n": n, "k": k, "d": d, "offered": rate, "rate": n / wall, "ack_rate": ack_rate,
            "wall_ms": wall * 1000,
            "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "max": float(lat.max()), "rss": rss, "hwm": hwm, "load": load,
            "server_cpu_ms": cpu_server * 1000 / n, "client_cpu_ms": cpu_self * 1000 / n,
            "committed": committed, "n_prime": res.n_prime}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=None,
                   help="one configuration with this many clients (default: both cases)")
    p.add_argument("--k", type=int, default=128)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--channels", type=int, default=8, help="client-side HTTP/2 connections")
    p.add_argument("--repeat", type=int, default=1, help="runs per configuration")
    p.add_argument("--db", default=None)
    p.add_argument("--rate", default=None,
                   help="comma-separated offered loads in submissions/s (0 = a burst, all at "
                        "once); default: a burst, then 2500/s")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="this load generator's event loop (default uvloop: the generator "
                        "stands for many client machines, so it is made as cheap as it can be)")
    p.add_argument("--server-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                   help="the server's --event-loop")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="sample the server with py-spy (native frames, every thread, 200 "
                        "samples/s: py-spy stops the process for each, and at 1,000/s a "
                        "Submit came back CANCELLED) during the burst only and write its "
                        "raw collapsed stacks to FILE")
    args = p.parse_args()
    configs = CONFIGS if args.clients is None else ((args.clients, args.k, args.d),)
    print(f"{os.cpu_count()} CPUs; figures per run (load = 1-min load average at the burst); "
          f"generator loop {args.loop}, server --event-loop {args.server_loop}")
    rates = [0.0, 2500.0] if args.rate is None else [float(r) for r in args.rate.split(",")]
    print("offered: 'burst' = all submissions at once; N/s = open loop, one every 1/N s")
    print("subs/s = clients / (last ack - first send); acks/s = (clients - 1) / (last ack - "
          "first ack), the rate the server acknowledged at")
    print("clients    k     d  offered  subs/s  acks/s  wall ms  p50 ms  p99 ms  max ms  "
          "server RSS/peak MiB  CPU ms/sub server client  load")
    for n, k, d in configs:
        for rate in rates:
            for _ in range(args.repeat):
                r = eventloop.run(run_once(n, k, d, args.channels, args.profile, args.db, rate,
                                           args.server_loop), args.loop)
                offered = "burst" if not rate else f"{rate:.0f}/s"
                print(f"{n:7d} {k:4d} {d:5d} {offered:>8} {r['rate']:7.0f} {r['ack_rate']:7.0f} "
                      f"{r['wall_ms']:8.0f} "
                      f"{r['p50']:7.1f} {r['p99']:7.1f} {r['max']:7.1f} "
                      f"{r['rss']:10.0f}/{r['hwm']:<8.0f} "
                      f"{r['server_cpu_ms']:13.3f} {r['client_cpu_ms']:6.3f} {r['load']:5.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
