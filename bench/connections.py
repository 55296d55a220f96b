"""Connection floods against a real server (not a test): what fresh clients and probes see.

A server subprocess runs with ``RLIMIT_NOFILE`` ``--limit`` (default 1,024), its dashboard
on and the default bounds (--grpc-handshake-timeout 5 s, --grpc-idle-timeout 10 s,
--http-header-timeout 30 s) and ``--max-jobs`` (default 16; under a limit of 256 at most 5
fit, and 2 leave gRPC 36 connections). For each flood — ``--flood`` sockets (default 1,000)
on the gRPC port sending nothing, only the HTTP/2 preface, or the preface and SETTINGS; on the
dashboard port with cut-off headers — held open by this process from time 0, it measures
for ``--window`` seconds (default 10):

* fresh Joins, one every 20 ms or so, each on a new channel (latency from its start to its
  reply; a Join refused at the cap retries inside the client), p50/p99/max (the max is
  the first Join's, which waits for the flood's deadline when the flood fills the cap);
* fresh ``GET /readyz``, one after another, p50/max and how many were not 200;
* when the server closed the flood's sockets (the last one, from the flood's first
  connect), against the stated deadline;
* the most descriptors the server held (sampled), against its limit.

    python bench/connections.py                  # all four floods at 1,024
    python bench/connections.py --limit 256 --flood 232 --max-jobs 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import selectors
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from rpsagg_client import AggregationClient
from rpsagg_experiments.launch import server_command, wait_port_file

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
FLOODS = {  # name: (port, first bytes, the deadline that closes them, s)
    "grpc-nothing": ("grpc", b"", 5.0),
    "grpc-preface": ("grpc", PREFACE, 5.0),
    "grpc-settings": ("grpc", PREFACE + SETTINGS, 10.0),
    "http-headers": ("http", b"GET /api/status HTTP/1.1\r\nHost: x\r\n", 30.0),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(name: str, limit: int, flood_n: int, window: float, max_jobs: int) -> None:
    which, first, deadline = FLOODS[name]
    http_port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        proc = subprocess.Popen(
            server_command(["--insecure", "--host", "127.0.0.1",
             "--grpc-port", "0", "--http-port", str(http_port), "--http-host", "127.0.0.1",
             "--n", "2000", "--k", "8", "--d", "64", "--task", "mean", "--rounds", "1",
             "--round-timeout", "600", "--db", ":memory:", "--linger", "-1",
             "--port-file", str(port_file), "--max-jobs", str(max_jobs)]),
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)))
        try:
            grpc_port = wait_port_file(port_file, proc)
            port = grpc_port if which == "grpc" else http_port
            most = [0]
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    with contextlib.suppress(OSError):
                        most[0] = max(most[0], len(os.listdir(f"/proc/{proc.pid}/fd")))
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t0 = opening = time.monotonic()
            flood = []
            for _ in range(flood_n):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                if first:
                    s.sendall(first)
                s.setblocking(False)
                flood.append(s)
            opened = time.monotonic() - t0
            closed_at: list[float] = []

            def watch() -> None:
                sel = selectors.DefaultSelector()
                for s in flood:
                    sel.register(s, selectors.EVENT_READ)
                left = set(flood)
                while left and time.monotonic() - opening < deadline + 60:
                    for key, _ in sel.select(0.2):
                        s = key.fileobj
                        assert isinstance(s, socket.socket)
                        try:
                            data = s.recv(65536)
                        except OSError:
                            data = b""
                        if not data:
                            sel.unregister(s)
                            left.discard(s)
                            closed_at.append(time.monotonic() - opening)
                sel.close()

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            joins: list[float] = []
            failed = 0
            readyz: list[float] = []
            not_ok = 0

            def probe() -> None:
                nonlocal not_ok
                while time.monotonic() - t0 < window:
                    t = time.monotonic()
                    try:
                        with urllib.request.urlopen(
                                f"http://127.0.0.1:{http_port}/readyz", timeout=10) as r:
                            ok = r.status == 200
                    except (urllib.error.URLError, OSError):
                        ok = False
                    readyz.append(time.monotonic() - t)
                    not_ok += not ok
                    time.sleep(0.05)

            t0 = time.monotonic()  # the window starts once the flood is open
            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            i = 0
            while time.monotonic() - t0 < window:
                t = time.monotonic()
                c = AggregationClient(f"127.0.0.1:{grpc_port}", f"b{i}", insecure=True,
                                      timeout=10, retry_budget=30)
                try:
                    c.join()
                    joins.append(time.monotonic() - t)
                except Exception as exc:  # counted
                    print("join failed:", type(exc).__name__, str(exc)[:200], flush=True)
                    failed += 1
                finally:
                    c.close()
                i += 1
                time.sleep(0.02)
            prober.join()
            watcher.join(timeout=deadline + 65)
            stop.set()
            sampler.join()
            for s in flood:
                s.close()
            joins = joins or [float("nan")]
            readyz = readyz or [float("nan")]
            last = max(closed_at) if len(closed_at) == flood_n else float("nan")
            print(f"{name:14s} limit {limit} flood {flood_n}: joins {len(joins)} ok {failed} "
                  f"failed, p50 {statistics.median(joins) * 1e3:.1f} ms p99 "
                  f"{_pct(joins, 0.99) * 1e3:.0f} ms max {max(joins) * 1e3:.0f} ms; /readyz "
                  f"{len(readyz)} p50 {statistics.median(readyz) * 1e3:.1f} ms max "
                  f"{max(readyz) * 1e3:.0f} ms, {not_ok} not 200; flood closed "
                  f"{len(closed_at)}/{flood_n}, the last at {last:.1f} s (deadline "
                  f"{deadline:g} s; opening took {opened:.1f} s); descriptors at most "
                  f"{most[0]} of {limit}", flush=True)
        finally:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=1024)
    ap.add_argument("--flood", type=int, default=1000)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--only", choices=sorted(FLOODS), action="append")
    ap.add_argument("--max-jobs", type=int, default=16, help="the server's --max-jobs")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.flood + 1000)), hard))
    for name in args.only or list(FLOODS):
        run(name, args.limit, args.flood, args.window, args.max_jobs)


if __name__ == "__main__":
    main()
