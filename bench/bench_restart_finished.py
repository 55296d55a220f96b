"""A restart with many finished jobs (not a test): what a server's start costs once it has
run many jobs, beside an empty server's, under a descriptor limit.

It runs one small job to its end on an ``rpsagg-server`` of its own (no default job; n = 4,
d = 256, one round), stops the server, copies that finished job ``--finished`` times
(``bench/finished_jobs.py``: catalog rows and database files, as if it had run them all),
then starts the server again under ``prlimit --nofile=LIMIT`` and prints: seconds from the
start to serving (the port file, written once both ports accept) and to ``/healthz`` 200;
``/api/jobs`` (seconds, jobs listed); its descriptors, threads and RSS once idle; and one
download of the oldest copy's estimate (a closed job opened to be read: seconds, and
whether its bytes are the original's). An empty server under the same limit is measured the
same way first. Target: with 10,000 finished jobs, healthy within 5 s under nofile 1,024.

    python bench/bench_restart_finished.py
    python bench/bench_restart_finished.py --finished 1000 --nofile 256 --max-jobs 4
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_job_lifecycle import proc_usage, run_job
from bench_service_load import http_json, start_service
from finished_jobs import clone_finished_job


def _get(port: int, path: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120) as res:
        body = res.read()
    return time.perf_counter() - t, body


def _start(work: Path, args: argparse.Namespace) -> tuple[str, object, int]:
    """Start the server on ``work``'s files under the limit; one line of figures."""
    (work / "port").unlink(missing_ok=True)
    prefix = ["prlimit", f"--nofile={args.nofile}", "--"]
    t0 = time.perf_counter()
    server, http_port = start_service(work, str(work / "jobs.db"), args.max_jobs, "auto",
                                      prefix=prefix, flags=["--keep-finished-jobs",
                                                            str(args.finished + 10)])
    serving = time.perf_counter() - t0
    while http_json(http_port, "GET", "/healthz", timeout=10)[0] != 200:
        time.sleep(0.005)
    healthy = time.perf_counter() - t0
    listed_s, raw = _get(http_port, "/api/jobs")
    listed = raw.count(b'"kind":')
    time.sleep(2.0)
    assert server.proc is not None
    use = proc_usage(server.proc.pid)
    return (f"serving {serving:6.2f} s  healthy {healthy:6.2f} s  /api/jobs {listed_s:6.2f} s "
            f"({listed} jobs)  fds {use['fds']:4.0f}  threads {use['threads']:3.0f}  "
            f"RSS {use['rss']:6.1f} MiB"), server, http_port


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--finished", type=int, default=10_000, help="finished jobs (copies)")
    p.add_argument("--nofile", type=int, default=1024, help="the descriptor limit")
    p.add_argument("--max-jobs", type=int, default=16, help="the server's --max-jobs")
    args = p.parse_args()
    print(f"{os.cpu_count()} CPUs; restart with {args.finished} finished jobs under "
          f"prlimit --nofile={args.nofile}, --max-jobs {args.max_jobs}")
    empty = Path(tempfile.mkdtemp(prefix="rpsagg-restart-empty-"))
    line, server, _ = _start(empty, args)
    server.stop()  # type: ignore[attr-defined]
    print(f"  empty server:         {line}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="rpsagg-restart-"))
    server, http_port = start_service(work, str(work / "jobs.db"), 4, "auto")
    job = run_job(server.port, http_port)
    _, original = _get(http_port, f"/api/jobs/{job}/rounds/1/estimate?format=npy")
    server.stop()
    t = time.perf_counter()
    ids = clone_finished_job(work / "jobs.db.d", job, args.finished)
    print(f"  ({args.finished} copies of job {job} made in {time.perf_counter() - t:.1f} s)")
    line, server, http_port = _start(work, args)
    try:
        print(f"  {args.finished:6d} finished jobs: {line}", flush=True)
        took, body = _get(http_port, f"/api/jobs/{ids[0]}/rounds/1/estimate?format=npy")
        print(f"  the oldest copy's estimate: {took * 1e3:.1f} ms, "
              f"{'the same bytes' if body == original else 'DIFFERENT bytes'}")
    finally:
        server.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
