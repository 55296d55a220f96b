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

Several jobs in one server (``--jobs N``): the server starts with no default job
(``--no-default-job``) and every job is created over the HTTP API (``POST /api/jobs``), so
that one job and N jobs take the same path. Each job has ``--clients`` clients (default 10)
with ``--k`` (default 64) and ``--d`` (4096); its clients join it, and round by round (the
jobs in step) every job's submissions are pre-encoded, then all jobs' submissions are sent at
once (interleaved: client 0 of every job, then client 1...), while a GetResult call per job
waits for its round. It prints, per round: the ingest rate of all jobs together and each
job's round latency (its first submission sent -> its result back), p50 and max across the
jobs; per run: the server's CPU per submission (its event-loop thread and its other threads)
and RSS. The same per-job configuration is run first with one job (a fresh server, same
invocation), and the two ratios are printed: (a) ingest of N jobs / ingest of one job
(target >= 0.8) and (b) the worst round latency of any job over the one job's latency in the
same round (target <= 2). Afterwards every acked submission must be committed in its job's
database (``<db>.d/<id>.db``) and every round of every job decoded with n' = n.

    python bench/bench_service_load.py --jobs 20 --rounds 3            # 20 jobs of n=10, k=64
    python bench/bench_service_load.py --jobs 20 --repeat 3            # 3 (one job, 20 jobs) pairs
    python bench/bench_service_load.py --jobs 20 --profile /tmp/jobs.txt  # py-spy, 20-job run

That is ``--arrivals lockstep`` (the default): the worst case, every job's burst in the same
instant, so the last job's round waits for the whole burst of N x n submissions. With
``--arrivals staggered`` each job runs its rounds on a task of its own, as independent jobs
with clients of their own would: after ``--warmup`` rounds (default 1, all jobs back to back,
not measured), job x starts its ``--rounds`` measured rounds (default 10) at an offset drawn
uniformly within one round period (``--seed``, plus the repeat's number), then runs them back
to back (no ``--round-rate``, or 0) or one every 1 / R s (``--round-rate R``, rounds per second
per job; ``--schedule poisson``: at exponential gaps of mean 1 / R s instead, so that the
jobs' phases change from round to round). A round that comes due while the job's previous
round still runs starts when that one is done. A round's submissions are encoded and its
``GetResult`` sent before it is due; when it is due its n submissions go out at once (a
burst, as in lockstep). For each rate it runs one job, then N jobs, each on a fresh server,
and prints per run: the offered load (N x n x R submissions/s), the load as sent, the
ingest, the round latency (first submission sent -> GetResult back) p50, the worst job's
p50, p99 and max over all rounds, how late rounds started, CPU per submission of the
server and of this generator, and how busy other processes kept the machine meanwhile
(cores, from /proc/stat; CPU and I/O pressure, from /proc/pressure); per pair, target (b)
as the worst job's p50 / the one job's p50 and the worst job's max / the one job's max (both
<= 2 to hold), and back to back (a).
``--load F,F...`` first measures the capacity (N jobs back to back: their ingest) and then
runs at those fractions of it (the rates derived from the first repeat's capacity).

    python bench/bench_service_load.py --jobs 20 --arrivals staggered --load 0.1,0.3,0.5
    python bench/bench_service_load.py --jobs 20 --arrivals staggered --round-rate 1,2 \
        --schedule poisson --repeat 2 --json /tmp/jobs.json   # raw latencies of every round
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from rpsagg import make_estimator
from rpsagg.spec import derive_round_seed
from rpsagg_experiments.launch import ServerExited, ServerProcess
from rpsagg_server.process import eventloop
from rpsagg_server.store.database import Store
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


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's event-loop thread (``main``: its first thread) and of its
    other live threads together (``other``: store writers, decode workers, gRPC's own), from
    ``/proc/PID/task/*/schedstat`` (nanoseconds; /proc/PID/stat counts 10 ms ticks, too
    coarse for a round of a few tens of ms). Python 3.11 does not name its threads for the
    kernel, so they cannot be told apart further here (py-spy can: ``--profile``)."""
    out = {"main": 0.0, "other": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
        out["main" if task.name == str(pid) else "other"] += ns / 1e9
    return out


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores; /proc/stat: all but idle
    and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def _pressure() -> dict[str, float]:
    """Seconds some task waited for a CPU and for I/O, machine-wide, since boot (Linux PSI,
    ``/proc/pressure/{cpu,io}``, the ``some`` line; absent where the kernel has no PSI)."""
    out = {}
    for what in ("cpu", "io"):
        try:
            line = Path(f"/proc/pressure/{what}").read_text().split("\n", 1)[0]
            out[what] = int(line.rsplit("total=", 1)[1]) / 1e6
        except (OSError, ValueError, IndexError):
            pass
    return out


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


# -- several jobs in one server (--jobs N) --------------------------------------------------

#: what every job of ``--jobs`` mode is created with besides n, k, d and rounds (transform
#: one, as the single-job runs: c = 0 and beta is exact, so no Monte Carlo in the way)
JOB_SETTINGS: dict[str, Any] = {"estimator": "rand-proj-spatial", "task": "mean",
                                "transform": "one", "round_timeout": 600}


def free_port() -> int:
    """A loopback port that was free a moment ago (the dashboard needs a fixed --http-port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_json(port: int, method: str, path: str, body: Any = None,
              timeout: float = 60.0) -> tuple[int, Any]:
    """``(status, decoded JSON)`` of one request to the dashboard at 127.0.0.1:``port``, over
    a connection of its own (as a command-line client makes one)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        res = conn.getresponse()
        raw = res.read()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return res.status, decoded
    finally:
        conn.close()


def start_service(work: Path, db: str, max_jobs: int, server_loop: str,
                  stderr: Any = None, prefix: Sequence[str] = (),
                  flags: Sequence[str] = ()) -> tuple[ServerProcess, int]:
    """An ``rpsagg-server`` with no default job and its dashboard on a free port (its
    warnings on ``stderr``, default this process's; run under the command ``prefix``, with
    more ``flags``); returns it (started) and the dashboard's port."""
    http_port = free_port()
    server = ServerProcess([
        "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", str(http_port),
        "--no-default-job", "--max-jobs", str(max_jobs), "--db", db, "--linger", "-1",
        "--event-loop", server_loop, *flags,
    ], work / "port", env=dict(os.environ, RPSAGG_LOG_LEVEL="WARNING"), stderr=stderr,
        start_timeout=120, prefix=prefix)
    try:
        server.start()
    except (ServerExited, TimeoutError) as exc:
        raise SystemExit(f"server failed to start: {exc}") from None
    return server, http_port


def wait_running(http_port: int, ids: list[str], timeout: float = 60.0) -> None:
    """Until every job of ``ids`` is ``running`` (a created job may answer ``queued`` and
    start right after its answer)."""
    end = time.monotonic() + timeout
    for job in ids:
        while True:
            status, body = http_json(http_port, "GET", f"/api/jobs/{job}")
            state = body.get("state") if isinstance(body, dict) else None
            if status == 200 and state == "running":
                break
            if state not in ("queued", "running") or time.monotonic() > end:
                raise SystemExit(f"job {job} did not start: {status} {body}")
            time.sleep(0.01)


class Stubs:
    """Join, GetRound, GetResult and Submit (bytes as they are) over ``channels_n`` HTTP/2
    connections to 127.0.0.1:``port``; call ``i`` of a kind goes on connection ``i % n``."""

    def __init__(self, port: int, channels_n: int) -> None:
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        self.channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts)
                         for _ in range(channels_n)]

        def stubs(name: str, serialize: bool = True) -> list[Any]:
            return [ch.unary_unary(serde.method_path(name),
                                   serde.serializer(name) if serialize else None,
                                   serde.deserializer(name)) for ch in self.channels]

        self.join = stubs("Join")
        self.get_round = stubs("GetRound")
        self.get_result = stubs("GetResult")
        self.submit = stubs("Submit", serialize=False)

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close()


async def next_round(stubs: Stubs, job: str, after: int, timeout: float = 120.0) -> Any:
    """The RoundInfo of ``job``'s first round after round ``after``, once it collects."""
    end = time.monotonic() + timeout
    while True:
        info = await stubs.get_round[0](GetRoundRequest(job=job), timeout=30)
        if info.round_id > after and info.state in ("open", "collecting"):
            return info
        if info.job_done or time.monotonic() > end:
            raise SystemExit(f"job {job}: no round after {after} (state {info.state}, "
                             f"job_done {info.job_done} {info.job_failure})")
        await asyncio.sleep(0.01)


def encode_round(job: str, info: Any, ids: list[str], xs: np.ndarray, est: Any) -> list[bytes]:
    """Each client's serialized Submit of ``job``'s round ``info`` (as each client machine
    would have encoded it on its own CPU)."""
    out = []
    for i, cid in enumerate(ids):
        seed = secrets.randbits(64)
        enc = est.encode(xs[i], derive_round_seed(seed, info.nonce, cid, 0))
        out.append(serde.serializer("Submit")(Submission(
            info.round_id, cid, seed, (VectorPayload(enc.values),),
            spec_version=info.spec_version, job=job)))
    return out


async def burst(stubs: Stubs, ids: list[str], infos: list[Any], subs: dict[str, list[bytes]],
                n: int, pid: int, failures: list[str]) -> dict[str, Any]:
    """One round of every job: each job's result waited for, then every submission sent at
    once; returns the round's figures (``failures`` gets what went wrong)."""
    channels_n = len(stubs.channels)
    first_sent: dict[str, float] = {}
    result_at: dict[str, float] = {}
    ack_at: list[float] = []
    sub_lat: list[float] = []

    async def one(x: int, job: str, i: int) -> None:
        t0 = time.perf_counter()
        first_sent.setdefault(job, t0)
        await stubs.submit[x % channels_n](subs[job][i], timeout=120)
        ack_at.append(time.perf_counter())
        sub_lat.append(ack_at[-1] - t0)

    async def result(x: int, job: str, round_id: int) -> None:
        res = await stubs.get_result[x % channels_n](
            GetResultRequest(round_id, True, job=job), timeout=600)
        result_at[job] = time.perf_counter()
        if res.state != "done" or res.n_prime != n:
            failures.append(f"job {job} round {round_id}: {res.state} n'={res.n_prime} "
                            f"{res.reason}")

    # each job's result is waited for from before the burst (the calls reach the server
    # first: 0.2 s before any submission, outside the measured window)
    waiters = [asyncio.ensure_future(result(x, j, info.round_id))
               for x, (j, info) in enumerate(zip(ids, infos, strict=True))]
    await asyncio.sleep(0.2)
    load = os.getloadavg()[0]
    cpu0 = _thread_cpu(pid)
    start = time.perf_counter()
    # interleaved: client 0 of every job, then client 1, ... (all jobs at once)
    await asyncio.gather(*(one(x, j, i) for x, (i, j) in
                           enumerate((i, j) for i in range(n) for j in ids)))
    await asyncio.gather(*waiters)
    cpu1 = _thread_cpu(pid)
    cpu = {name: t - cpu0.get(name, 0.0) for name, t in cpu1.items()}
    acks = sorted(ack_at)
    return {"wall": acks[-1] - start, "acks": acks, "load": load, "cpu": cpu,
            "lat": [result_at[j] - first_sent[j] for j in ids],
            "sub_p99": float(np.percentile(np.array(sub_lat) * 1000, 99)),
            "acked": len(ack_at)}


async def staggered(stubs: Stubs, ids: list[str], clients: list[str], xs: np.ndarray, est: Any,
                    rounds: int, warmup: int, rate: float, period: float, seed: int,
                    schedule: str, pid: int, round_ids: dict[str, list[int]],
                    failures: list[str]) -> dict[str, Any]:
    """``--arrivals staggered``: every job runs its rounds on a task of its own.

    First each job runs ``warmup`` rounds back to back (all jobs at once, not measured: the
    server's first rounds warm its code paths). Then job ``x`` starts its measured rounds at
    ``t0 + offset[x]``, the offsets drawn uniformly in ``[0, period)`` (``seed``; zero for a
    single job), and its round ``m`` is due at ``t0 + offset[x] + m / rate`` (``rate`` rounds/s
    per job; ``schedule`` periodic), or after gaps drawn from an exponential distribution
    of mean ``1 / rate`` (``schedule`` poisson: each job's rounds a Poisson process, so the
    jobs' relative phases change from round to round), or at once when its previous round
    is done (``rate`` 0: back to back). A round that comes due while the job's previous
    round is still running starts when that one is done (its lateness is recorded). Before
    a round is due its submissions are encoded and its ``GetResult`` is sent; when it is
    due, its ``n`` submissions go out at once (a burst, as in lockstep). A round's latency
    is its first submission sent -> its ``GetResult`` back. Returns the measured phase's
    figures."""
    channels_n = len(stubs.channels)
    n = len(clients)
    jobs = len(ids)
    rng = np.random.default_rng(seed)
    offsets = rng.uniform(0.0, period, jobs) if jobs > 1 else np.zeros(1)
    if rate and schedule == "poisson":
        gaps = rng.exponential(1.0 / rate, (jobs, rounds))
        gaps[:, 0] = 0.0
        dues = offsets[:, None] + np.cumsum(gaps, axis=1)
    else:
        dues = offsets[:, None] + (np.arange(rounds) / rate if rate else np.zeros(rounds))
    lat = np.zeros((jobs, rounds))
    starts = np.zeros((jobs, rounds))
    late = np.zeros((jobs, rounds))
    sends: list[float] = []
    ack_at: list[float] = []
    sub_lat: list[float] = []
    infos: list[Any] = list(await asyncio.gather(*(next_round(stubs, j, 0) for j in ids)))

    async def one_round(x: int, due: float | None) -> tuple[float, float]:
        """Job ``x``'s current round, sent at ``due`` (None: at once); (start, latency)."""
        job, info = ids[x], infos[x]
        round_ids[job].append(info.round_id)
        subs = encode_round(job, info, clients, xs, est)
        ch = x % channels_n
        waiter = asyncio.ensure_future(stubs.get_result[ch](
            GetResultRequest(info.round_id, True, job=job), timeout=600))
        if due is not None:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

        async def one(i: int) -> None:
            t = time.perf_counter()
            sends.append(t)
            await stubs.submit[(x * n + i) % channels_n](subs[i], timeout=120)
            ack_at.append(time.perf_counter())
            sub_lat.append(ack_at[-1] - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        res = await waiter
        t1 = time.perf_counter()
        if res.state != "done" or res.n_prime != n:
            failures.append(f"job {job} round {info.round_id}: {res.state} n'={res.n_prime} "
                            f"{res.reason}")
        return t0, t1 - t0

    async def advance(x: int) -> None:
        infos[x] = await next_round(stubs, ids[x], infos[x].round_id)

    async def warm(x: int) -> None:
        for _ in range(warmup):
            await one_round(x, None)
            await advance(x)

    await asyncio.gather(*(warm(x) for x in range(jobs)))
    sends.clear()
    ack_at.clear()
    sub_lat.clear()
    load = os.getloadavg()[0]
    busy0 = _machine_busy()
    psi0 = _pressure()
    cpu0 = _thread_cpu(pid)
    self0 = time.process_time()
    t_start = time.perf_counter() + 0.05

    async def job_task(x: int) -> None:
        for m in range(rounds):
            # back to back (rate 0): the first round at the job's offset, then at once
            due = (t_start + float(dues[x, m]) if rate or m == 0 else time.perf_counter())
            t0, lat[x, m] = await one_round(x, due)
            starts[x, m] = t0
            late[x, m] = max(0.0, t0 - due)
            if m < rounds - 1:
                await advance(x)

    await asyncio.gather(*(job_task(x) for x in range(jobs)))
    cpu1 = _thread_cpu(pid)
    gen_cpu = time.process_time() - self0
    busy = _machine_busy() - busy0
    psi = {w: (t - psi0[w]) for w, t in _pressure().items() if w in psi0}
    cpu = {name: t - cpu0.get(name, 0.0) for name, t in cpu1.items()}
    span = time.perf_counter() - t_start
    others = max(0.0, busy - sum(cpu.values()) - gen_cpu) / span
    psi = {w: t / span for w, t in psi.items()}  # share of the run's wall time
    total = jobs * n * rounds
    acks = sorted(ack_at)
    first = min(sends)
    # the load as sent: each job's rounds after its first over the time they spanned
    spans = starts[:, -1] - starts[:, 0]
    sent = (jobs * n * (rounds - 1) / float(spans.mean()) if rounds > 1 and spans.mean() > 0
            else float("nan"))
    return {"lat": lat, "late": late, "starts": starts - t_start, "sent": sent,
            "t0_unix": time.time() - (time.perf_counter() - t_start),
            "load": load, "load_end": os.getloadavg()[0],
            "cpu": cpu, "gen_cpu_ms": gen_cpu * 1000 / total, "acked": len(ack_at),
            "others": others, "psi": psi,
            "ingest": len(ack_at) / (acks[-1] - first), "window": acks[-1] - first,
            "sub_p99": float(np.percentile(np.array(sub_lat) * 1000, 99)),
            "offsets": offsets}


async def run_jobs(jobs: int, n: int, k: int, d: int, rounds: int, channels_n: int,
                   profile: str | None, db_path: str | None,
                   server_loop: str = "auto", arrivals: str = "lockstep", rate: float = 0.0,
                   period: float = 0.0, seed: int = 0, warmup: int = 1,
                   schedule: str = "periodic") -> dict[str, Any]:
    """One server, ``jobs`` jobs created over the API, ``rounds`` rounds of ``n``
    submissions each, the jobs in step (``arrivals`` lockstep) or each on its own
    (staggered: :func:`staggered`, with ``rate``, ``period``, ``seed``, ``warmup`` and
    ``schedule``);
    returns the figures (module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="rpsagg-jobs-"))
    try:
        return await _jobs_in(work, jobs, n, k, d, rounds, channels_n, profile,
                              db_path or str(work / "jobs.db"), server_loop, arrivals, rate,
                              period, seed, warmup, schedule)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _jobs_in(work: Path, jobs: int, n: int, k: int, d: int, rounds: int,
                   channels_n: int, profile: str | None, db: str,
                   server_loop: str, arrivals: str, rate: float, period: float, seed: int,
                   warmup: int, schedule: str) -> dict[str, Any]:
    server, http_port = await asyncio.to_thread(start_service, work, db, max(16, jobs),
                                                server_loop)
    assert server.proc is not None
    pid = server.proc.pid
    spy: subprocess.Popen[bytes] | None = None
    warmup = warmup if arrivals == "staggered" else 0
    settings = dict(JOB_SETTINGS, n=n, k=k, d=d, rounds=rounds + warmup)
    ids: list[str] = []
    clients = [f"load-{i:04d}" for i in range(n)]  # the same ids in every job (allowed)
    round_ids: dict[str, list[int]] = {}
    # per round: latency of each job (s), Submit latencies, ack times, the burst's wall
    per_round: list[dict[str, Any]] = []
    stag: dict[str, Any] = {}
    failures: list[str] = []
    try:
        for _ in range(jobs):  # one after another, as an operator would
            status, body = await asyncio.to_thread(http_json, http_port, "POST", "/api/jobs",
                                                   settings)
            if status != 201 or body.get("state") not in ("running", "queued"):
                raise SystemExit(f"job creation answered {status}: {body}")
            ids.append(body["id"])
        await asyncio.to_thread(wait_running, http_port, ids)
        round_ids = {j: [] for j in ids}
        stubs = Stubs(server.port, channels_n)
        await asyncio.gather(*(stubs.join[x % channels_n](JoinRequest(cid, job=j), timeout=60)
                               for x, (j, cid) in enumerate((j, c) for j in ids
                                                            for c in clients)))
        est = make_estimator("rand-proj-spatial", n=n, k=k, d=d)
        xs = np.random.default_rng(0).standard_normal((n, d))
        if profile:  # sample the server during the rounds only, native frames included
            spy = subprocess.Popen([_py_spy(), "record", "--pid", str(pid), "--native",
                                    "--threads", "--rate", "200",
                                    "--format", "raw", "-o", profile],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            await asyncio.sleep(1.0)
        cpu_server: dict[str, float] = {}
        if arrivals == "staggered":
            stag = await staggered(stubs, ids, clients, xs, est, rounds, warmup, rate,
                                   period, seed, schedule, pid, round_ids, failures)
            cpu_server = stag.pop("cpu")
        busy0, psi0, self0, t_lock = (_machine_busy(), _pressure(), time.process_time(),
                                      time.perf_counter())
        all0 = _thread_cpu(pid)  # the server's CPU over the whole span, not the bursts only
        for _ in range(rounds if arrivals == "lockstep" else 0):
            infos = await asyncio.gather(*(next_round(stubs, j, (round_ids[j] or [0])[-1])
                                           for j in ids))
            for j, info in zip(ids, infos, strict=True):
                round_ids[j].append(info.round_id)
            subs = {j: encode_round(j, info, clients, xs, est)
                    for j, info in zip(ids, infos, strict=True)}
            rnd = await burst(stubs, ids, infos, subs, n, pid, failures)
            for name, t in rnd.pop("cpu").items():
                cpu_server[name] = cpu_server.get(name, 0.0) + t
            per_round.append(rnd)
        if arrivals == "lockstep":  # the other processes' share of the machine meanwhile
            span = time.perf_counter() - t_lock
            busy = (_machine_busy() - busy0 - sum(_thread_cpu(pid).values())
                    + sum(all0.values()) - (time.process_time() - self0))
            stag = {"others": max(0.0, busy) / span,
                    "psi": {w: (t - psi0[w]) / span for w, t in _pressure().items()
                            if w in psi0}}
        rss, hwm = _rss_mib(pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            _, err = await asyncio.to_thread(spy.communicate, None, 30)
            if not Path(profile or "").exists():
                print(f"py-spy wrote no profile: {err.decode(errors='replace').strip()}")
        await stubs.close()
    finally:
        server.stop()
    # every acked submission committed in its job's database, every round done with n' = n
    for j in ids:
        store = Store(f"{db}.d/{j}.db")
        try:
            stored = {r.round_id: r for r in store.rounds(arrays=False)}
            for rid in round_ids[j]:
                committed = len(store.submissions(rid))
                row = stored.get(rid)
                n_prime = None if row is None else row.info.get("n_prime")
                if committed != n or row is None or row.state != "done" or n_prime != n:
                    failures.append(f"job {j} round {rid}: committed {committed} of {n} acked, "
                                    f"stored state {None if row is None else row.state}, "
                                    f"n'={n_prime}")
        finally:
            store.close()
    acked = stag["acked"] if "acked" in stag else sum(r["acked"] for r in per_round)
    if failures or acked != jobs * n * rounds:
        raise SystemExit("LOST SUBMISSIONS OR ROUNDS: acked "
                         f"{acked} of {jobs * n * rounds}; " + "; ".join(failures))
    total = jobs * n * rounds
    out = {"jobs": jobs, "n": n, "k": k, "d": d, "arrivals": arrivals,
           "server_cpu_ms": sum(cpu_server.values()) * 1000 / total,
           "threads_ms": {name: t * 1000 / total for name, t in cpu_server.items()},
           "rss": rss, "hwm": hwm}
    if arrivals == "staggered":  # lat: [job, round], seconds
        return dict(out, **stag, rate=stag["ingest"], round_rate=rate)
    return dict(out, rounds=per_round, others=stag["others"], psi=stag["psi"],
                rate=total / sum(r["wall"] for r in per_round),
                lat=np.array([r["lat"] for r in per_round]))  # [round, job], seconds


def print_jobs_run(r: dict[str, Any]) -> None:
    """One line per round of a ``run_jobs`` result."""
    for x, rnd in enumerate(r["rounds"]):
        acks = rnd["acks"]
        subs = len(acks)
        ack_rate = ((subs - 1) / (acks[-1] - acks[0]) if subs > 1 and acks[-1] > acks[0]
                    else float("nan"))
        lat = np.array(rnd["lat"]) * 1000
        print(f"{r['jobs']:4d} {r['n']:7d} {r['k']:4d} {r['d']:5d} {x + 1:5d} "
              f"{subs / rnd['wall']:7.0f} {ack_rate:7.0f} {rnd['sub_p99']:10.1f} "
              f"{np.median(lat):9.1f} {lat.max():8.1f} "
              f"{r['server_cpu_ms']:13.3f} {r['rss']:7.0f}/{r['hwm']:<6.0f} "
              f"{rnd['load']:5.1f}", flush=True)
    t = r["threads_ms"]
    print(f"     server CPU ms per submission: event-loop thread {t.get('main', 0):.3f}, "
          f"other threads {t.get('other', 0):.3f}; other processes meanwhile: "
          f"{r['others']:.2f} cores busy, psi cpu {r['psi'].get('cpu', float('nan')):.0%}, io "
          f"{r['psi'].get('io', float('nan')):.0%} of the time")


def compare_jobs(one: dict[str, Any], many: dict[str, Any]) -> tuple[float, float, float]:
    """(a) ingest of many jobs / ingest of one job; (b) the worst round latency of any job of
    ``many`` over the one job's latency in the same round; and the same with the medians
    over jobs and rounds."""
    a = many["rate"] / one["rate"]
    b = float((many["lat"] / one["lat"][:, :1]).max())
    b50 = float(np.median(many["lat"]) / np.median(one["lat"]))
    return a, b, b50


def print_staggered_run(r: dict[str, Any]) -> None:
    """One line for a ``run_jobs`` result with staggered arrivals."""
    lat = r["lat"] * 1000  # [job, round], ms
    rate = r["round_rate"]
    offered = f"{r['jobs'] * r['n'] * rate:8.0f}" if rate else "   b2b  "
    t = r["threads_ms"]
    print(f"{r['jobs']:4d} {r['n']:7d} {r['k']:4d} {r['d']:5d} {lat.shape[1]:6d} "
          f"{rate:7.2f} {offered} {r['sent']:6.0f} {r['ingest']:7.0f} {r['sub_p99']:7.1f} "
          f"{np.median(lat):7.1f} {np.median(lat, axis=1).max():8.1f} "
          f"{np.percentile(lat, 99):7.1f} {lat.max():7.1f} {r['late'].max() * 1000:7.1f} "
          f"{r['server_cpu_ms']:6.3f} ({t.get('main', 0):.2f}+{t.get('other', 0):.2f}) "
          f"{r['gen_cpu_ms']:5.3f} {r['rss']:5.0f}/{r['hwm']:<5.0f} "
          f"{r['load']:4.1f}-{r['load_end']:<4.1f} {r['others']:5.2f} "
          f"{r['psi'].get('cpu', float('nan')) * 100:4.0f}% "
          f"{r['psi'].get('io', float('nan')) * 100:3.0f}%", flush=True)


def compare_staggered(one: dict[str, Any], many: dict[str, Any]) -> dict[str, float]:
    """(b) for staggered arrivals: the worst job's round latency p50 over the one job's p50
    (``b50``), and the worst job's max over the one job's max (``bmax``); (a) ingest of many
    jobs / ingest of one (meaningful back to back only: at a set rate both follow it)."""
    return {"a": many["ingest"] / one["ingest"],
            "b50": float(np.median(many["lat"], axis=1).max() / np.median(one["lat"])),
            "bmax": float(many["lat"].max() / one["lat"].max())}


def _ok(met: bool) -> str:
    return "met" if met else "MISSED"


def main_staggered(args: argparse.Namespace, n: int, k: int, d: int, rounds: int) -> None:
    """``--jobs N --arrivals staggered``: per offered load, a run of one job, then one of N
    jobs, each job running its rounds on its own; ``--repeat`` times."""
    rates = ([] if args.round_rate is None
             else [float(x) for x in args.round_rate.split(",")])
    loads = [] if args.load is None else [float(x) for x in args.load.split(",")]
    if loads and 0.0 not in rates:
        rates.insert(0, 0.0)  # the capacity: N jobs back to back
    rates = rates or [0.0]
    print(f"arrivals staggered, schedule {args.schedule}: each job runs {args.warmup} warm-up "
          f"round(s) back to back (all jobs, not measured), then {rounds} measured rounds on "
          "its own task, starting at an offset drawn uniformly within one round period (seed "
          f"{args.seed} + repeat: 1/rate, or back to back the one job's mean cycle), then "
          + ("every 1/rate s" if args.schedule == "periodic" else
             "after exponential gaps of mean 1/rate s")
          + " (or when its previous round is done, if later); a round's n submissions go out "
          "at once")
    print("per run: rounds/s = each job's round rate (0: back to back, b2b); offered = jobs x "
          "n x rounds/s; sent = the load as sent: jobs x n x (rounds - 1) / the mean span of a "
          "job's round starts; ingest = acked submissions / (last ack - first send); round "
          "latency = a job's first submission sent -> its GetResult back: p50 and p99 and max "
          "over all jobs' rounds, worst p50 = the highest job's p50; late = how long a round "
          "started after it was due (max); CPU ms per submission: server (event-loop thread + "
          "others) and this generator; load = 1-min load average at the start-end; others = "
          "cores busy with other processes during the run (/proc/stat less the server and this "
          "generator); psi cpu, io = share of the run's time some task waited for a CPU, for "
          "I/O (/proc/pressure)")
    print("jobs clients    k     d rounds rounds/s  offered   sent  ingest Sub p99 rnd p50 "
          "worst p50 "
          "rnd p99 rnd max late ms server CPU/sub     gen RSS/peak  load    others psi cpu, io")
    capacity = 0.0
    results: dict[float, list[dict[str, float]]] = {}
    records: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        plan = list(rates)
        x = 0
        while x < len(plan):
            rate = plan[x]
            runs: list[dict[str, Any]] = []
            for jobs in (1, args.jobs):
                db = None if args.db is None else f"{args.db}.{jobs}jobs.{rep}.{x}"
                period = (1.0 / rate if rate else
                          runs[0]["window"] / rounds if runs else 0.0)
                r = eventloop.run(run_jobs(jobs, n, k, d, rounds, args.channels,
                                           args.profile if jobs > 1 else None, db,
                                           args.server_loop, "staggered", rate, period,
                                           args.seed + rep, args.warmup, args.schedule),
                                  args.loop)
                print_staggered_run(r)
                runs.append(r)
                records.append({"repeat": rep, "jobs": jobs, "round_rate": rate,
                                "schedule": args.schedule, "lat_ms": (r["lat"] * 1000).tolist(),
                                "starts_s": r["starts"].tolist(), "sent": r["sent"],
                                "t0_unix": r["t0_unix"],
                                "ingest": r["ingest"], "load": [r["load"], r["load_end"]],
                                "others": r["others"], "psi": r["psi"],
                                "server_cpu_ms": r["server_cpu_ms"]})
            c = compare_staggered(runs[0], runs[1])
            results.setdefault(rate, []).append(c)
            offered = args.jobs * n * rate
            what = (f"{rate:.2f} rounds/s per job, offered {offered:.0f} submissions/s"
                    + (f" = {offered / capacity:.2f} of capacity" if capacity else "")
                    if rate else "back to back")
            print(f"  {args.jobs} jobs vs one, {what}: (b) worst job's p50 / one job's p50 "
                  f"= {c['b50']:.2f} ({_ok(c['b50'] <= 2)}), worst job's max / one job's max "
                  f"= {c['bmax']:.2f} ({_ok(c['bmax'] <= 2)}); ingest "
                  f"{runs[1]['ingest']:.0f}/s" + (f", (a) vs one job's {runs[0]['ingest']:.0f}"
                                                  f"/s = {c['a']:.2f}" if not rate else ""),
                  flush=True)
            if not rate and loads and rep == 0:
                capacity = runs[1]["ingest"]
                derived = [f * capacity / (args.jobs * n) for f in loads]
                print(f"  capacity: {capacity:.0f} submissions/s ({args.jobs} jobs back to "
                      "back); loads " + ", ".join(f"{f:g} -> {r:.3f} rounds/s per job"
                                                  for f, r in zip(loads, derived, strict=True)),
                      flush=True)
                rates.extend(derived)
                plan.extend(derived)
            x += 1
    print(f"over {args.repeat} repeat(s)"
          + (f", capacity {capacity:.0f} submissions/s:" if capacity else ":"))
    for rate, cs in results.items():
        b50 = [c["b50"] for c in cs]
        bmax = [c["bmax"] for c in cs]
        load = f" ({args.jobs * n * rate / capacity:.2f} of capacity)" if capacity and rate else ""
        print(f"  {'back to back' if not rate else f'{rate:.3f} rounds/s per job'}{load}: "
              f"(b) p50 ratio {min(b50):.2f}-{max(b50):.2f} (met in {sum(v <= 2 for v in b50)}),"
              f" max ratio {min(bmax):.2f}-{max(bmax):.2f} (met in "
              f"{sum(v <= 2 for v in bmax)})")
    if args.json:
        Path(args.json).write_text(json.dumps({"capacity": capacity, "runs": records}))


def main_jobs(args: argparse.Namespace) -> None:
    """``--jobs N``: a run of one job, then one of N jobs, ``--repeat`` times."""
    n = args.clients or 10
    k = args.k or 64
    d = args.d
    print(f"{os.cpu_count()} CPUs; generator loop {args.loop}, server --event-loop "
          f"{args.server_loop}; every job created over POST /api/jobs on a server with "
          "--no-default-job")
    if args.arrivals == "staggered":
        main_staggered(args, n, k, d, args.rounds or 10)
        return
    rounds = args.rounds or 3
    print("per round: subs/s = all jobs' submissions / (last ack - first send); acks/s = "
          "(submissions - 1) / (last ack - first ack); round latency = a job's first "
          "submission sent -> its GetResult back, p50 and max over the jobs; load = 1-min "
          "load average; server CPU per submission and RSS/peak: the run's")
    print("jobs clients    k     d round  subs/s  acks/s  Submit p99  round p50  round max  "
          "CPU ms/sub  RSS/peak MiB  load")
    pairs = []
    for rep in range(args.repeat):
        runs = []
        for jobs in ((1, args.jobs) if args.jobs > 1 else (1,)):
            db = None if args.db is None else f"{args.db}.{jobs}jobs.{rep}"
            r = eventloop.run(run_jobs(jobs, n, k, d, rounds, args.channels,
                                       args.profile if jobs > 1 else None, db,
                                       args.server_loop), args.loop)
            print_jobs_run(r)
            runs.append(r)
        if len(runs) == 2:
            pairs.append(compare_jobs(runs[0], runs[1]))
            a, b, b50 = pairs[-1]
            print(f"  {args.jobs} jobs vs one: (a) ingest {runs[1]['rate']:.0f}/s vs "
                  f"{runs[0]['rate']:.0f}/s = {a:.2f} (target >= 0.8: "
                  f"{'met' if a >= 0.8 else 'MISSED'}); (b) worst round latency / the one "
                  f"job's in that round = {b:.2f} (target <= 2: "
                  f"{'met' if b <= 2 else 'MISSED'}); median latency ratio {b50:.2f}",
                  flush=True)
    if len(pairs) > 1:
        a_s, b_s = [p[0] for p in pairs], [p[1] for p in pairs]
        print(f"over {len(pairs)} pairs: (a) {min(a_s):.2f}-{max(a_s):.2f} "
              f"(met in {sum(x >= 0.8 for x in a_s)}), (b) {min(b_s):.2f}-{max(b_s):.2f} "
              f"(met in {sum(x <= 2 for x in b_s)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=None,
                   help="one configuration with this many clients (default: both cases)")
    p.add_argument("--k", type=int, default=None,
                   help="values per submission (default 128; 64 with --jobs)")
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="N jobs in one server, created over the HTTP API, each of --clients "
                        "(default 10) clients, --k (default 64) and --d, all submitting at "
                        "once, after a run of one such job (module docstring)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds per job with --jobs (default 3 in lockstep, 10 measured "
                        "rounds staggered)")
    p.add_argument("--arrivals", choices=("lockstep", "staggered"), default="lockstep",
                   help="with --jobs: lockstep (default) = every job's round sent at the same "
                        "instant, round by round; staggered = each job runs its rounds on "
                        "its own, the jobs' starts offset at random (module docstring)")
    p.add_argument("--round-rate", default=None, metavar="R[,R...]",
                   help="with --arrivals staggered: rounds per second per job, comma-separated "
                        "(0 = back to back; default 0)")
    p.add_argument("--load", default=None, metavar="F[,F...]",
                   help="with --arrivals staggered: offered loads as fractions of the "
                        "capacity, which is measured first in the same invocation (N jobs "
                        "back to back), e.g. 0.1,0.3,0.5")
    p.add_argument("--schedule", choices=("periodic", "poisson"), default="periodic",
                   help="with --arrivals staggered and a round rate: each job's rounds every "
                        "1/rate s (periodic, default) or at exponential gaps of mean 1/rate s "
                        "(poisson)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="with --arrivals staggered: write every run's round latencies and "
                        "start times to FILE")
    p.add_argument("--warmup", type=int, default=1,
                   help="with --arrivals staggered: unmeasured rounds per job first (default 1)")
    p.add_argument("--seed", type=int, default=0,
                   help="with --arrivals staggered: seed of the jobs' start offsets (repeat r "
                        "uses seed + r)")
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
    if args.jobs:
        if args.rate is not None:
            p.error("--jobs sends bursts only (no --rate)")
        if args.jobs < 1 or (args.rounds is not None and args.rounds < 1):
            p.error("--jobs and --rounds must be >= 1")
        if args.arrivals == "lockstep" and (args.round_rate or args.load):
            p.error("--round-rate and --load go with --arrivals staggered")
        main_jobs(args)
        return
    k = 128 if args.k is None else args.k
    configs = CONFIGS if args.clients is None else ((args.clients, k, args.d),)
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
