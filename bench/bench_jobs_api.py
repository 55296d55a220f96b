"""Job-creation latency benchmark (not a test): ``POST /api/jobs`` while other jobs ingest.

It starts ``rpsagg-server`` as its own process (no default job, ``--insecure``, the
dashboard on a free port), creates ``--load-jobs`` jobs (default 3: n = 10, k = 64,
d = 4096, transform one, rounds 0 = until stopped) and drives them from a separate process
(the background load: each job's clients send a round's submissions at once, pre-encoded,
wait for its result and go again, without pause), waits until every one of them has
finished ``--warm`` rounds, then creates ``--creations`` small jobs (default 100: n = 10,
k = 16, d = 256, one round) one after another, each over a fresh HTTP connection as a
command-line client would, and times each answer (request sent -> 201 read). It prints the
creation latency p50/p99/max (target: p99 <= 100 ms), the states the 201s gave, and the
background load's ingest (submissions/s) and round latency (a round's first submission sent
-> its result back) in the creation window and in a window of the same length just before
it, the server's CPU (both windows) and its RSS.

Modes (``--modes``, default both, each with a fresh server):

- ``queued``: ``--max-jobs`` = the load jobs, so every created job is queued (``201``
  with state ``queued``): what a creation costs is validating it and recording it in the
  catalog (one SQLite transaction with ``synchronous=FULL``: an fsync).
- ``started``: ``--max-jobs`` with room for every creation, so each created job starts
  right after its ``201`` (its own database, engine and first round row, durably; the
  bench waits until ``GET`` says running and prints that time too); each one is then
  cancelled (``DELETE /api/jobs/{id}``, timed too), so that running jobs stay at the
  load jobs plus one, as an operator who frees slots would.

Afterwards ``GET /api/jobs`` must list every created job, and every background round must
have decoded with n' = n.

    python bench/bench_jobs_api.py                        # both modes, 100 creations each
    python bench/bench_jobs_api.py --modes started --repeat 3
    python bench/bench_jobs_api.py --load-jobs 5 --creations 200
    python bench/bench_jobs_api.py --profile /tmp/create.txt  # py-spy of the creation window
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import signal
import subprocess
import tempfile
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

import numpy as np
from bench_service_load import (
    JOB_SETTINGS,
    Stubs,
    _py_spy,
    _rss_mib,
    _thread_cpu,
    encode_round,
    http_json,
    next_round,
    start_service,
)

from rpsagg import make_estimator
from rpsagg_server.process import eventloop
from rpsagg_wire.v1.serde import GetResultRequest, JoinRequest

#: a created job of the measurement: small, one round, transform one (no Monte Carlo beta)
SMALL = dict(JOB_SETTINGS, n=10, k=16, d=256, rounds=1)
TARGET_MS = 100.0


# -- the background load (its own process: its event loop and GIL are not the timer's) -----

async def _drive(port: int, jobs: list[str], n: int, k: int, d: int, warm: int,
                 stop: MpEvent, ready: Connection) -> list[tuple[float, float, str, int, int]]:
    """Every job's rounds, again and again, until ``stop``; returns per round (first send,
    result back, job, submissions acked, n')."""
    stubs = Stubs(port, 4)
    clients = [f"bg-{i:04d}" for i in range(n)]
    await asyncio.gather(*(stubs.join[x % 4](JoinRequest(c, job=j), timeout=60)
                           for x, (j, c) in enumerate((j, c) for j in jobs for c in clients)))
    est = make_estimator("rand-proj-spatial", n=n, k=k, d=d)
    xs = np.random.default_rng(1).standard_normal((n, d))
    records: list[tuple[float, float, str, int, int]] = []
    warmed: set[str] = set()

    async def job_loop(job: str) -> None:
        last, done = 0, 0
        while not stop.is_set():
            info = await next_round(stubs, job, last)
            last = info.round_id
            subs = encode_round(job, info, clients, xs, est)
            waiter = asyncio.ensure_future(stubs.get_result[0](
                GetResultRequest(info.round_id, True, job=job), timeout=600))
            t0 = time.monotonic()
            acks = await asyncio.gather(*(stubs.submit[i % 4](s, timeout=120)
                                          for i, s in enumerate(subs)))
            res = await waiter
            records.append((t0, time.monotonic(), job, len(acks), res.n_prime))
            done += 1
            if done == warm:
                warmed.add(job)
                if len(warmed) == len(jobs):
                    ready.send("ready")

    await asyncio.gather(*(job_loop(j) for j in jobs))
    await stubs.close()
    return records


def background(port: int, jobs: list[str], n: int, k: int, d: int, warm: int, stop: MpEvent,
               ready: Connection) -> None:
    """The background load's process: sends "ready" once warm, then its records at the end."""
    try:
        records = eventloop.run(_drive(port, jobs, n, k, d, warm, stop, ready), "uvloop")
    except BaseException as exc:  # the parent reports it
        ready.send(f"error: {exc!r}")
        raise
    ready.send(records)


# -- one measurement -----------------------------------------------------------------------

def _window(records: list[tuple[float, float, str, int, int]], t0: float,
            t1: float) -> dict[str, float]:
    """The background rounds that ended in [t0, t1): submissions/s, round latency."""
    inside = [r for r in records if t0 <= r[1] < t1]
    lat = np.array([r[1] - r[0] for r in inside]) * 1000
    return {"rounds": len(inside), "rate": sum(r[3] for r in inside) / (t1 - t0),
            "p50": float(np.median(lat)) if len(lat) else float("nan"),
            "p99": float(np.percentile(lat, 99)) if len(lat) else float("nan")}


def _until_running(http_port: int, job: str, timeout: float = 60.0) -> None:
    """Poll ``GET /api/jobs/{job}`` until it says running (bounded)."""
    end = time.monotonic() + timeout
    while True:
        status, body = http_json(http_port, "GET", f"/api/jobs/{job}")
        if status == 200 and body.get("state") == "running":
            return
        if time.monotonic() > end or (status == 200 and body.get("state") not in (
                "queued", "running")):
            raise SystemExit(f"job {job} did not start: {status} {body}")
        time.sleep(0.002)


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One server, its background load, ``args.creations`` timed creations."""
    work = Path(tempfile.mkdtemp(prefix="rpsagg-jobsapi-"))
    bg: multiprocessing.process.BaseProcess | None = None
    stop = multiprocessing.get_context("spawn").Event()
    spy: subprocess.Popen[bytes] | None = None
    max_jobs = args.load_jobs if mode == "queued" else args.load_jobs + args.creations + 1
    # the server's log goes to a file (each cancel logs a failed round): its tail is shown
    # if the run fails
    log = open(work / "server.log", "wb")  # noqa: SIM115 - closed in the finally below
    server, http_port = start_service(work, str(work / "jobs.db"), max_jobs, args.server_loop,
                                      stderr=log)
    ok = False
    assert server.proc is not None
    pid = server.proc.pid
    try:
        load = dict(JOB_SETTINGS, n=args.clients, k=args.k, d=args.d, rounds=0)
        ids = []
        for _ in range(args.load_jobs):
            status, body = http_json(http_port, "POST", "/api/jobs", load)
            if status != 201:
                raise SystemExit(f"a load job's creation answered {status}: {body}")
            ids.append(body["id"])
        for job in ids:  # a 201 says queued: the job starts right after it
            _until_running(http_port, job)
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        bg = ctx.Process(target=background, args=(server.port, ids, args.clients, args.k,
                                                  args.d, args.warm, stop, theirs),
                         daemon=True)
        bg.start()
        if not ours.poll(300):
            raise SystemExit("the background load did not warm up within 300 s")
        msg = ours.recv()
        if msg != "ready":
            raise SystemExit(f"the background load failed: {msg}")
        # a quiet window (the load alone), as long as the creations will take, roughly
        quiet = args.quiet
        rss0, _ = _rss_mib(pid)
        cpu_q0, q0 = _thread_cpu(pid), time.monotonic()
        time.sleep(quiet)
        cpu_q1, q1 = _thread_cpu(pid), time.monotonic()
        if args.profile:
            spy = subprocess.Popen([_py_spy(), "record", "--pid", str(pid), "--native",
                                    "--threads", "--rate", "200", "--format", "raw",
                                    "-o", f"{args.profile}.{mode}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1.0)
        lat: list[float] = []
        cancel_lat: list[float] = []
        start_lat: list[float] = []
        states: dict[str, int] = {}
        created: list[str] = []
        load_avg = os.getloadavg()[0]
        cpu_c0, c0 = _thread_cpu(pid), time.monotonic()
        for _ in range(args.creations):  # one after another
            t = time.perf_counter()
            status, body = http_json(http_port, "POST", "/api/jobs", SMALL)
            lat.append(time.perf_counter() - t)
            if status != 201:
                raise SystemExit(f"a creation answered {status}: {body}")
            created.append(body["id"])
            states[body["state"]] = states.get(body["state"], 0) + 1
            if mode == "started":
                t = time.perf_counter()
                _until_running(http_port, created[-1])
                start_lat.append(time.perf_counter() - t)
                t = time.perf_counter()
                status, body = http_json(http_port, "DELETE", f"/api/jobs/{created[-1]}")
                cancel_lat.append(time.perf_counter() - t)
                if status != 200:
                    raise SystemExit(f"a cancel answered {status}: {body}")
        cpu_c1, c1 = _thread_cpu(pid), time.monotonic()
        rss1, hwm = _rss_mib(pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            _, err = spy.communicate(None, 30)
            if not Path(f"{args.profile}.{mode}").exists():
                print(f"py-spy wrote no profile: {err.decode(errors='replace').strip()}")
        stop.set()
        if not ours.poll(120):
            raise SystemExit("the background load did not stop within 120 s")
        records = ours.recv()
        if not isinstance(records, list):
            raise SystemExit(f"the background load failed: {records}")
        bg.join(30)
        status, listing = http_json(http_port, "GET", "/api/jobs")
        listed = {j["id"]: j["state"] for j in listing["jobs"]}
        ok = True
    finally:
        stop.set()
        if bg is not None and bg.is_alive():
            bg.kill()
        server.stop()
        log.close()
        if not ok:
            tail = (work / "server.log").read_text(errors="replace").splitlines()[-20:]
            print("the server's log, last lines:\n" + "\n".join(tail))
        shutil.rmtree(work, ignore_errors=True)
    missing = [j for j in created if j not in listed]
    bad = [r for r in records if r[3] != args.clients or r[4] != args.clients]
    if missing or bad:
        raise SystemExit(f"{len(missing)} created jobs not listed; {len(bad)} background "
                         "rounds not acked or decoded in full")

    def cpu_ms_per_s(a: dict[str, float], b: dict[str, float], s: float) -> float:
        return sum(b[x] - a.get(x, 0.0) for x in b) * 1000 / s

    ms = np.array(lat) * 1000
    cms = np.array(cancel_lat) * 1000
    sms = np.array(start_lat) * 1000
    return {"mode": mode, "max_jobs": max_jobs, "load": load_avg, "states": states,
            "p50": float(np.median(ms)), "p99": float(np.percentile(ms, 99)),
            "max": float(ms.max()),
            "cancel_p50": float(np.median(cms)) if len(cms) else float("nan"),
            "cancel_p99": float(np.percentile(cms, 99)) if len(cms) else float("nan"),
            "start_p50": float(np.median(sms)) if len(sms) else float("nan"),
            "start_p99": float(np.percentile(sms, 99)) if len(sms) else float("nan"),
            "window_s": c1 - c0, "during": _window(records, c0, c1),
            "before": _window(records, q0, q1),
            "cpu_before": cpu_ms_per_s(cpu_q0, cpu_q1, q1 - q0),
            "cpu_during": cpu_ms_per_s(cpu_c0, cpu_c1, c1 - c0),
            "rss0": rss0, "rss1": rss1, "hwm": hwm}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="queued,started",
                   help="comma-separated: queued, started (module docstring)")
    p.add_argument("--creations", type=int, default=100, help="jobs created, one after another")
    p.add_argument("--load-jobs", type=int, default=3, help="jobs ingesting meanwhile")
    p.add_argument("--clients", type=int, default=10, help="clients of each load job")
    p.add_argument("--k", type=int, default=64, help="k of each load job")
    p.add_argument("--d", type=int, default=4096, help="d of each load job")
    p.add_argument("--warm", type=int, default=3,
                   help="rounds every load job finishes before the measurement")
    p.add_argument("--quiet", type=float, default=3.0,
                   help="seconds of the load alone, measured before the creations")
    p.add_argument("--repeat", type=int, default=1, help="runs per mode")
    p.add_argument("--server-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                   help="the server's --event-loop")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="py-spy the server during the creations (native frames, every "
                        "thread, 200 samples/s) into FILE.<mode> (raw collapsed stacks)")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("queued", "started") for m in modes):
        p.error("--modes: queued and/or started")
    print(f"{os.cpu_count()} CPUs; {args.load_jobs} load jobs (n = {args.clients}, "
          f"k = {args.k}, d = {args.d}) ingesting without pause from another process; "
          f"{args.creations} creations of n = {SMALL['n']}, k = {SMALL['k']}, "
          f"d = {SMALL['d']}, one after another, a fresh HTTP connection each")
    print("create ms: request sent -> 201 read; load: subs/s and round p50/p99 ms of the "
          "background jobs, before the creations | during them; server CPU ms/s likewise; "
          "load avg = 1-min load average")
    print("started: 201 read -> the job seen running (GET polled every 2 ms), p50/p99 ms")
    print("mode     max-jobs  states                   create p50    p99    max  cancel p50  "
          "p99 | load subs/s  round p50  p99 | CPU ms/s | RSS MiB before/after  load avg"
          " | started p50 p99")
    for mode in modes:
        for _ in range(args.repeat):
            r = run_mode(mode, args)
            states = ", ".join(f"{n} {s}" for s, n in sorted(r["states"].items()))
            b, w = r["before"], r["during"]
            verdict = "met" if r["p99"] <= TARGET_MS else "MISSED"
            print(f"{mode:8} {r['max_jobs']:8d}  {states:22} {r['p50']:11.1f} {r['p99']:6.1f} "
                  f"{r['max']:6.1f} {r['cancel_p50']:11.1f} {r['cancel_p99']:4.1f} | "
                  f"{b['rate']:5.0f} {w['rate']:5.0f}  {b['p50']:4.0f} {w['p50']:4.0f}  "
                  f"{b['p99']:4.0f} {w['p99']:4.0f} | {r['cpu_before']:4.0f} "
                  f"{r['cpu_during']:4.0f} | {r['rss0']:6.0f}/{r['rss1']:<6.0f} "
                  f"{r['load']:5.1f}   p99 <= {TARGET_MS:.0f} ms: {verdict} | "
                  f"{r['start_p50']:5.1f} {r['start_p99']:5.1f}", flush=True)


if __name__ == "__main__":
    main()
