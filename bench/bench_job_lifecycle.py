"""Jobs in a row (not a test): what a standing server holds after N jobs created, run and
finished, one after another.

It starts ``rpsagg-server`` as its own process (no default job, ``--insecure``), then
creates ``--jobs`` small jobs in a row (default 200: n = 4, k = 16, d = 256, one round, the
mean task), each run to its end by ``n`` clients of this process, and at each checkpoint
(``--at``, default 10 50 100 200) prints what the server holds once idle: threads, open
descriptors, RSS, its writes and CPU over ``--idle`` seconds with no job running (default
5), the job files (count, MiB), and one scrape of ``/metrics`` (bytes, ms). Target: after
the last job within 10 % of after job 10 (threads, descriptors, RSS, idle writes).

    python bench/bench_job_lifecycle.py
    python bench/bench_job_lifecycle.py --jobs 1000 --at 10 100 500 1000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from bench_service_load import http_json, start_service

from rpsagg_client import AggregationClient

SMALL = {"n": 4, "k": 16, "d": 256, "task": "mean", "rounds": 1, "round_timeout": 60}


def proc_usage(pid: int) -> dict[str, float]:
    """Threads, descriptors, RSS (MiB), bytes written and CPU seconds of ``pid``."""
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines())
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {"threads": int(status["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "rss": int(status["VmRSS"].split()[0]) / 1024, "written": int(io["write_bytes"]),
            "cpu": (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")}


def run_job(grpc_port: int, http_port: int) -> str:
    """Create one job and run its one round with its n clients; returns its id once the
    server says it is done."""
    status, job = http_json(http_port, "POST", "/api/jobs", SMALL)
    if status != 201:
        raise SystemExit(f"a creation answered {status}: {job}")
    n = SMALL["n"]

    def one(i: int) -> None:
        c = AggregationClient(f"127.0.0.1:{grpc_port}", f"c{i}", insecure=True, job=job["id"])
        try:
            c.join()
            rnd = c.current_round()
            c.submit(rnd, np.full(SMALL["d"], float(i)))
            if c.result(rnd.round_id, wait=True, timeout=60).state != "done":
                raise SystemExit(f"job {job['id']}: its round failed")
        finally:
            c.close()

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))
    end = time.monotonic() + 30
    while http_json(http_port, "GET", f"/api/jobs/{job['id']}")[1]["state"] != "done":
        if time.monotonic() > end:
            raise SystemExit(f"job {job['id']} did not end within 30 s")
        time.sleep(0.01)
    return str(job["id"])


def _checkpoint(pid: int, http_port: int, work: Path, done: int, idle: float) -> str:
    time.sleep(1.0)  # the last job's end settles (its writer stops after its last write)
    a = proc_usage(pid)
    time.sleep(idle)
    b = proc_usage(pid)
    files = [p for p in (work / "jobs.db.d").glob("*") if p.is_file()]
    mib = sum(p.stat().st_size for p in files) / 2**20
    t = time.perf_counter()
    _, metrics = http_json(http_port, "GET", "/metrics")
    ms = (time.perf_counter() - t) * 1e3
    size = len(str(metrics).encode()) / 1024
    return (f"{done:6d} {b['threads']:8d} {b['fds']:5d} {b['rss']:8.1f} "
            f"{(b['written'] - a['written']) / idle / 1024:10.1f} "
            f"{(b['cpu'] - a['cpu']) / idle * 100:8.1f} {len(files):6d} {mib:8.2f} "
            f"{size:9.1f} {ms:7.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--at", type=int, nargs="+", default=[10, 50, 100, 200])
    p.add_argument("--idle", type=float, default=5.0)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rpsagg-lifecycle-"))
    server, http_port = start_service(work, str(work / "jobs.db"), 4, "auto")
    assert server.proc is not None
    pid = server.proc.pid
    print(f"{os.cpu_count()} CPUs; {args.jobs} jobs in a row (n = {SMALL['n']}, "
          f"d = {SMALL['d']}, one round), idle {args.idle:g} s at each checkpoint")
    print("  jobs  threads   fds  RSS MiB  idle KiB/s  idle CPU%  files  files MiB  "
          "/metrics KiB  ms")
    try:
        print(_checkpoint(pid, http_port, work, 0, args.idle), flush=True)
        t0 = time.monotonic()
        for done in range(1, args.jobs + 1):
            run_job(server.port, http_port)
            if done in args.at:
                rate = done / (time.monotonic() - t0)
                print(_checkpoint(pid, http_port, work, done, args.idle),
                      f"  ({rate:.1f} jobs/s)", flush=True)
                t0 = time.monotonic() - done / rate  # the idle windows not counted
    finally:
        server.stop()


if __name__ == "__main__":
    main()
