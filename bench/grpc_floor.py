"""The floor of Python gRPC on this machine (not a test): an echo server against a burst.

A grpc.aio server that answers every unary call with 4 bytes and does nothing else runs as
its own process; one asyncio process sends ``--calls`` calls of ``--size`` bytes at once
over ``--channels`` HTTP/2 connections, as bench/bench_service_load.py's burst mode does,
and prints calls/s and the latency p50/p99. What the real server adds per submission is the
difference to bench_service_load.py's figures (docs/reliability.md, "Load").

    python bench/grpc_floor.py                  # 3 bursts of 1,000 calls of 400 bytes
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from rpsagg_experiments.launch import wait_port_file
from rpsagg_server.process import eventloop


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(port_file: str, loop: str) -> None:
    """Run the echo server; write its port to ``port_file`` once it serves."""

    async def main() -> None:
        async def handler(request: bytes, context: object) -> bytes:
            return b"\x08\x01\x10\x01"

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "floor.Echo", {"Call": grpc.unary_unary_rpc_method_handler(handler)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        tmp = port_file + ".tmp"
        Path(tmp).write_text(str(port))
        os.replace(tmp, port_file)
        await server.wait_for_termination()

    eventloop.run(main(), loop)


async def burst(port: int, calls: int, channels: int, size: int) -> tuple[float, float, float]:
    """``calls`` calls at once; returns (calls/s, p50 ms, p99 ms)."""
    chans = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(channels)]
    stubs = [c.unary_unary("/floor.Echo/Call") for c in chans]
    payload = os.urandom(size)
    for stub in stubs:  # connect every channel first
        await stub(payload)
    latencies: list[float] = []

    async def one(i: int) -> None:
        t = time.perf_counter()
        await stubs[i % channels](payload)
        latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    wall = time.perf_counter() - t0
    for c in chans:
        await c.close()
    latencies.sort()
    return calls / wall, latencies[len(latencies) // 2] * 1e3, latencies[
        max(0, int(0.99 * len(latencies)) - 1)] * 1e3


def main() -> None:
    """Start the echo server, run the bursts, print one line each."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--size", type=int, default=400, help="request bytes")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="event loop of both processes (default uvloop, as the server and "
                        "bench_service_load.py's generator)")
    p.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.loop)
        return
    port_file = Path(tempfile.mkdtemp(prefix="grpc-floor-")) / "port"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file),
                               "--loop", args.loop])
    try:
        port = wait_port_file(port_file, server, timeout=60)
        print(f"load average {os.getloadavg()[0]:.2f}, {args.loop} loops")
        for _ in range(args.repeat):
            cpu0 = _cpu_seconds(server.pid)
            rate, p50, p99 = eventloop.run(burst(port, args.calls, args.channels, args.size),
                                           args.loop)
            cpu = (_cpu_seconds(server.pid) - cpu0) * 1e3 / args.calls
            print(f"{args.calls} calls of {args.size} B over {args.channels} channels: "
                  f"{rate:,.0f} calls/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
                  f"server CPU {cpu:.3f} ms per call")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
