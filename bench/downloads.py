"""Estimate downloads against running rounds (not a test): GetRound's latency with and without.

A server subprocess (d = ``--d``, default 2^20, n = 2, k = 64, rounds until stopped) and two
``rpsagg-client`` processes run rounds; once round ``--spread`` + 1 is open this process
times GetRound calls, one after another, for ``--seconds`` (default 10) with no download,
then again while ``--downloads`` threads (default 50) each download an estimate
(``--format``, default json) over and over, reading every byte: thread i takes round
``i % --spread + 1`` (default spread 1: every thread the same round; a larger spread makes
the server format distinct bodies). A download answered 503 (too many bodies being
formatted) waits its ``Retry-After`` and tries again. It prints GetRound's median, p99 and
max and the rounds finished per second in each phase, the downloads' count and bytes, and
the 503s.

    python bench/downloads.py
    python bench/downloads.py --spread 20
    python bench/downloads.py --format csv --downloads 20
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from rpsagg_client import AggregationClient
from rpsagg_experiments.launch import client_command, server_command, wait_port_file


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _phase(probe: AggregationClient, seconds: float) -> tuple[list[float], float]:
    """GetRound latencies for ``seconds``, and rounds finished per second meanwhile."""
    lat: list[float] = []
    first = probe.current_round().round_id
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        t = time.monotonic()
        rid = probe.current_round().round_id
        lat.append(time.monotonic() - t)
    return lat, (rid - first) / (time.monotonic() - t0)


def _show(name: str, lat: list[float], rate: float) -> None:
    s = sorted(lat)
    print(f"{name:10s} GetRound {len(s)} calls: median {statistics.median(s) * 1e3:.1f} ms, "
          f"p99 {s[int(0.99 * (len(s) - 1))] * 1e3:.1f} ms, max {s[-1] * 1e3:.0f} ms; "
          f"rounds {rate:.2f}/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, default=1 << 20)
    ap.add_argument("--downloads", type=int, default=50)
    ap.add_argument("--format", choices=["json", "csv", "npy"], default="json")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--spread", type=int, default=1,
                    help="download the first N rounds (thread i round i %% N + 1)")
    ap.add_argument("--server-log", help="write the server's stderr here")
    args = ap.parse_args()
    http_port = _free_port()
    with tempfile.TemporaryDirectory() as tmp, \
            open(args.server_log or os.devnull, "w") as log:
        port_file = Path(tmp) / "port"
        server = subprocess.Popen(server_command([
            "--insecure", "--host", "127.0.0.1", "--grpc-port", "0",
            "--http-port", str(http_port), "--http-host", "127.0.0.1", "--n", "2", "--k", "64",
            "--d", str(args.d), "--task", "mean", "--rounds", "0", "--round-timeout", "60",
            "--db", str(Path(tmp) / "job.db"), "--port-file", str(port_file)]),
            stderr=log)
        procs = [server]
        try:
            port = wait_port_file(port_file, server)
            target = f"127.0.0.1:{port}"
            for i in range(2):
                procs.append(subprocess.Popen(client_command([
                    "--server", target, "--client-id", f"client-{i}", "--insecure"]),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            probe = AggregationClient(target, "client-0", insecure=True, timeout=30)
            end = time.monotonic() + 300
            while probe.current_round().round_id < args.spread + 2:
                if time.monotonic() > end:
                    sys.exit("round 2 never finished")
                time.sleep(0.2)
            _show("idle", *_phase(probe, args.seconds))
            stop = threading.Event()
            done = [0, 0, 0]
            lock = threading.Lock()

            def download(i: int) -> None:
                url = (f"http://127.0.0.1:{http_port}/api/rounds/{i % args.spread + 1}"
                       f"/estimate?format={args.format}")
                while not stop.is_set():
                    n = 0
                    try:
                        with urllib.request.urlopen(url, timeout=120) as res:
                            while chunk := res.read(1 << 16):
                                n += len(chunk)
                    except (OSError, http.client.HTTPException) as exc:
                        if stop.is_set():  # the server is being stopped
                            return
                        if not isinstance(exc, urllib.error.HTTPError):
                            raise
                        if exc.code != 503:
                            raise
                        with lock:
                            done[2] += 1
                        time.sleep(float(exc.headers.get("Retry-After", "1")))
                        continue
                    with lock:
                        done[0] += 1
                        done[1] += n

            threads = [threading.Thread(target=download, args=(i,), daemon=True)
                       for i in range(args.downloads)]
            for t in threads:
                t.start()
            time.sleep(1.0)  # every download under way
            _show("downloads", *_phase(probe, args.seconds))
            stop.set()
            print(f"downloads: {args.downloads} at once ({args.format}, d = {args.d}), "
                  f"{done[0]} finished, {done[1] / 2**20:.0f} MiB, {done[2]} answered 503",
                  flush=True)
            probe.close()
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
