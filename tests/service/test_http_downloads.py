"""Estimate downloads under load, against a real ``rpsagg-server`` process and real sockets.

JSON and CSV bodies are formatted in a worker process of the server, once per round and
format, kept on disk within ``--http-body-cache-bytes`` (``rpsagg_server.http.renders``).
What is checked here, with the worker paused (SIGSTOP) or killed where a test needs a
render to last:

* concurrent downloads of one body are formatted once, and every copy is the estimate
  GetResult returned, bit for bit, with a ``Content-Length``;
* while renders are held, gRPC (GetRound, Join) and the health probes keep answering: the
  formatting is off the event loop;
* at most ``PENDING_MAX`` distinct bodies wait for a render; one more download is answered
  503 with ``Retry-After``, a download of a body already waiting is not refused;
* a worker killed mid-render fails its downloads with 503 and the reason, the next download
  renders in a new worker; a download whose client goes away leaves its render running, and
  the body is served from disk afterwards; a body directory that cannot be written to is
  503 with the reason, and downloads work again once it can;
* the bodies on disk stay within the byte bound (the least recently used removed);
* the worker runs at a lower priority than the server and dies with it on ``kill -9``; the
  directory a killed server left is removed by the next server; a stopped server removes
  its own.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from service_util import wait_until
from test_http_exposure import Server, http_get, metric

from rpsagg_client import AggregationClient
from rpsagg_server.http.renders import DIR_PREFIX, PENDING_MAX, WORKER_NICE

pytestmark = pytest.mark.service

D = 70_000  # two chunks of values per body; a JSON body is ~1.3 MB
ROUNDS = PENDING_MAX + 3


def _tmpdir(path: Path) -> Callable[[], None]:
    """In the server's child before exec: its temporary directory (the bodies' home)."""
    def set_tmpdir() -> None:
        os.environ["TMPDIR"] = str(path)
    return set_tmpdir


@contextmanager
def _job(tmp_path: Path, *flags: str, rounds: int = ROUNDS, run: str = "first"
         ) -> Iterator[tuple[Server, AggregationClient, dict[int, np.ndarray]]]:
    """A server whose ``rounds`` rounds are done (one client, its own vectors), the client
    and each round's estimate as GetResult returned it. Servers of one test share their
    temporary directory, ``tmp_path / "tmp"``."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    (tmp_path / run).mkdir()
    srv = Server(tmp_path / run, "--n", "1", "--min-clients", "1", "--k", "16", "--d", str(D),
                 "--rounds", str(rounds), "--data", "external", *flags,
                 preexec=_tmpdir(tmp))
    try:
        rng = np.random.default_rng(5)
        with AggregationClient(f"127.0.0.1:{srv.grpc_port}", "a", insecure=True,
                               timeout=30) as client:
            client.join()
            want = {}
            for _ in range(rounds):
                rnd = client.current_round()
                client.submit(rnd, rng.standard_normal(D))
                res = client.result(rnd.round_id, wait=True)
                assert res.state == "done"
                want[rnd.round_id] = np.asarray(res.estimate, dtype=np.float64)[0]
            yield srv, client, want
    finally:
        srv.close()


def _get(srv: Server, rid: int, fmt: str) -> tuple[int, dict[str, str], bytes]:
    url = f"http://127.0.0.1:{srv.http_port}/api/rounds/{rid}/estimate?format={fmt}"
    try:
        with urllib.request.urlopen(url, timeout=60) as res:
            return res.status, {k.lower(): v for k, v in res.headers.items()}, res.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def _values(fmt: str, body: bytes) -> np.ndarray:
    if fmt == "json":
        return np.array(json.loads(body)["estimate"], dtype=np.float64)
    if fmt == "csv":
        (row,) = csv.reader(io.StringIO(body.decode()))  # one line for m = 1
        return np.array(row, dtype=np.float64)
    return np.load(io.BytesIO(body), allow_pickle=False)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))


def _metric(srv: Server, name: str) -> float:
    status, text = http_get(f"http://127.0.0.1:{srv.http_port}/metrics")
    assert status == 200
    return metric(text.decode(), name)


def _workers(pid: int) -> list[int]:
    """The server's formatting worker processes (its children running ``spawn_main``)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmd:
                out.append(child)
    return sorted(set(out))


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class _Downloads:
    """Downloads running in threads; ``results()`` waits for them (bounded)."""

    def __init__(self, srv: Server, wanted: list[tuple[int, str]]) -> None:
        self.got: dict[int, tuple[int, dict[str, str], bytes]] = {}
        self.threads = [threading.Thread(target=self._run, args=(i, srv, rid, fmt), daemon=True)
                        for i, (rid, fmt) in enumerate(wanted)]
        for t in self.threads:
            t.start()

    def _run(self, i: int, srv: Server, rid: int, fmt: str) -> None:
        self.got[i] = _get(srv, rid, fmt)

    def results(self, timeout: float = 60.0) -> list[tuple[int, dict[str, str], bytes]]:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
            assert not t.is_alive(), "a download did not finish"
        return [self.got[i] for i in range(len(self.threads))]


@pytest.mark.timeout(240)
def test_downloads_are_formatted_once_off_the_event_loop(tmp_path: Path) -> None:
    with _job(tmp_path) as (srv, client, want):
        status, _, body = _get(srv, 1, "npy")
        assert status == 200 and _same_bits(_values("npy", body), want[1])
        # 12 concurrent downloads of each decimal format: one render each, every copy equal
        downloads = _Downloads(srv, [(1, fmt) for fmt in ("json", "csv") for _ in range(12)])
        for i, (status, headers, body) in enumerate(downloads.results()):
            fmt = "json" if i < 12 else "csv"
            assert status == 200, body[:200]
            assert int(headers["content-length"]) == len(body)
            assert _same_bits(_values(fmt, body), want[1]), fmt
        assert _metric(srv, "rpsagg_http_estimate_renders_total") == 2
        workers = _workers(srv.proc.pid)
        assert len(workers) == 1
        (worker,) = workers
        assert _nice(worker) == min(19, _nice(srv.proc.pid) + WORKER_NICE)  # 19 at most
        # renders held (the worker paused): PENDING_MAX distinct bodies wait
        os.kill(worker, signal.SIGSTOP)
        try:
            held = _Downloads(srv, [(r, "json") for r in range(2, 2 + PENDING_MAX)])
            wait_until(lambda: _metric(srv, "rpsagg_http_estimate_renders_pending")
                       == PENDING_MAX, 30, "the renders waiting")
            # the event loop is free: gRPC calls and the probes answer meanwhile
            assert client.current_round().d == D  # GetRound
            res = client.result(1)  # GetResult, the estimate on the wire
            assert _same_bits(np.asarray(res.estimate, dtype=np.float64)[0], want[1])
            for path in ("/healthz", "/readyz", "/api/status"):
                assert http_get(f"http://127.0.0.1:{srv.http_port}{path}")[0] == 200
            # one more distinct body is refused; one already waiting is not
            status, headers, body = _get(srv, ROUNDS, "json")
            assert status == 503 and headers["retry-after"] == "2", body
            assert b"being formatted" in body
            assert _metric(srv, "rpsagg_http_estimate_renders_refused_total") == 1
            again = _Downloads(srv, [(2, "json")])
            wait_until(lambda: _metric(srv, "rpsagg_http_estimate_renders_pending")
                       == PENDING_MAX, 5, "the repeat waiting")
        finally:
            os.kill(worker, signal.SIGCONT)
        for rid, (status, _, body) in zip(range(2, 2 + PENDING_MAX), held.results(),
                                          strict=True):
            assert status == 200 and _same_bits(_values("json", body), want[rid]), rid
        (status, _, body), = again.results()
        assert status == 200 and _same_bits(_values("json", body), want[2])
        assert _metric(srv, "rpsagg_http_estimate_renders_total") == 2 + PENDING_MAX
        assert _metric(srv, "rpsagg_http_estimate_render_failures_total") == 0
        # kill -9 of the server: the worker goes with it; its directory stays behind
        (bodies,) = (tmp_path / "tmp").glob(DIR_PREFIX + "*")
        srv.proc.kill()
        srv.proc.wait()
        wait_until(lambda: not _alive(worker), 10, "the worker ending with the server")
        assert bodies.is_dir()
    # the next server removes it at its first render, and its own when it stops
    with _job(tmp_path, rounds=1, run="second") as (srv, _, want):
        assert _get(srv, 1, "csv")[0] == 200
        (mine,) = (tmp_path / "tmp").glob(DIR_PREFIX + "*")
        assert mine != bodies and not bodies.exists()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=30)
        assert not mine.exists()


@pytest.mark.timeout(240)
def test_failed_renders_are_503_and_nothing_is_kept(tmp_path: Path) -> None:
    # room for two bodies, not three: a body is D values of 17.5 to 26 characters each
    bound = int(2.5 * 21 * D)
    with _job(tmp_path, "--http-body-cache-bytes", str(bound), rounds=4) as (
            srv, _, want):
        assert _get(srv, 1, "json")[0] == 200
        (worker,) = _workers(srv.proc.pid)
        # the worker killed while it formats: 503 with the reason, then a new worker
        os.kill(worker, signal.SIGSTOP)
        held = _Downloads(srv, [(2, "json")])
        wait_until(lambda: _metric(srv, "rpsagg_http_estimate_renders_pending") == 1, 30,
                   "the render waiting")
        os.kill(worker, signal.SIGKILL)
        (status, _, body), = held.results()
        assert status == 503 and b"the process formatting it exited" in body, body
        assert _metric(srv, "rpsagg_http_estimate_renders_pending") == 0
        status, _, body = _get(srv, 2, "json")
        assert status == 200 and _same_bits(_values("json", body), want[2])
        assert _workers(srv.proc.pid) != [worker]
        # a download whose client goes away while its body is formatted: the render goes
        # on, and the next download of it is served from disk
        worker = _workers(srv.proc.pid)[0]
        os.kill(worker, signal.SIGSTOP)
        try:
            with socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as gone:
                gone.sendall(b"GET /api/rounds/4/estimate?format=csv HTTP/1.1\r\n"
                             b"Host: x\r\n\r\n")
                wait_until(lambda: _metric(srv, "rpsagg_http_estimate_renders_pending") == 1,
                           30, "the render waiting")
        finally:
            os.kill(worker, signal.SIGCONT)
        renders = _metric(srv, "rpsagg_http_estimate_renders_total")
        wait_until(lambda: _metric(srv, "rpsagg_http_estimate_renders_total") == renders + 1,
                   30, "the render of a download whose client went away")
        hits = _metric(srv, "rpsagg_http_estimate_render_hits_total")
        status, _, body = _get(srv, 4, "csv")
        assert status == 200 and _same_bits(_values("csv", body), want[4])
        assert _metric(srv, "rpsagg_http_estimate_render_hits_total") == hits + 1
        # the directory replaced by a file: 503 with the reason, nothing kept
        (bodies,) = (tmp_path / "tmp").glob(DIR_PREFIX + "*")
        for f in bodies.iterdir():
            f.unlink()
        bodies.rmdir()
        bodies.write_bytes(b"not a directory")
        status, _, body = _get(srv, 3, "json")
        assert status == 503 and b"could not write it" in body, body
        assert _metric(srv, "rpsagg_http_estimate_render_failures_total") == 2
        bodies.unlink()
        status, _, body = _get(srv, 3, "json")  # the directory made again
        assert status == 200 and _same_bits(_values("json", body), want[3])
        # the byte bound: two bodies on disk, the least recently used out first
        renders = _metric(srv, "rpsagg_http_estimate_renders_total")
        hits = _metric(srv, "rpsagg_http_estimate_render_hits_total")
        for rid in (4, 3, 1, 4):  # {3} -> {3, 4} -> {4, 3} (a hit) -> {3, 1} -> {1, 4}
            status, _, body = _get(srv, rid, "json")
            assert status == 200 and _same_bits(_values("json", body), want[rid])
            on_disk = sum(f.stat().st_size for f in bodies.iterdir() if f.suffix == ".json")
            assert on_disk <= bound
            assert on_disk == _metric(srv, "rpsagg_http_estimate_bodies_bytes")
        assert _metric(srv, "rpsagg_http_estimate_renders_total") == renders + 3
        assert _metric(srv, "rpsagg_http_estimate_render_hits_total") == hits + 1


@pytest.mark.parametrize(("flags", "projection", "block_size", "value_bits"), [
    ((), "hblocks", 0, 32),  # d = 70000 is not a power of two
    (("--value-bits", "8"), "hblocks", 0, 8),
    (("--block-size", "8192"), "srht", 8192, 32),  # 9 blocks, each an SRHT
    (("--block-size", "8192", "--value-bits", "4"), "srht", 8192, 4),
], ids=["plain", "quantized", "blockwise", "blockwise-quantized"])
@pytest.mark.timeout(240)
def test_every_download_says_the_rounds_block_size_and_value_bits(
        tmp_path: Path, flags: tuple[str, ...], projection: str, block_size: int,
        value_bits: int) -> None:
    """A blockwise or quantized round is told from a plain round of its projection in every
    format (the headers of npy, JSON and CSV, the JSON document) and in /api/rounds: each
    carries the round's block size (0: one transform) and bits per value (32: float32)."""
    with _job(tmp_path, *flags, rounds=1) as (srv, _, want):
        for fmt in ("npy", "json", "csv"):
            status, headers, body = _get(srv, 1, fmt)
            assert status == 200, body[:200]
            assert _same_bits(_values(fmt, body), want[1]), fmt
            assert headers["x-rpsagg-projection"] == projection
            assert headers["x-rpsagg-block-size"] == str(block_size), fmt
            assert headers["x-rpsagg-value-bits"] == str(value_bits), fmt
            if fmt == "json":
                doc = json.loads(body)
                assert (doc["projection"], doc["block_size"], doc["value_bits"]) == (
                    projection, block_size, value_bits)
        base = f"http://127.0.0.1:{srv.http_port}/api/rounds"
        for url in (base, f"{base}/1"):
            status, body = http_get(url)
            assert status == 200
            doc = json.loads(body)
            row = doc["rounds"][0] if "rounds" in doc else doc
            assert (row["round_id"], row["projection"], row["block_size"],
                    row["value_bits"]) == (1, projection, block_size, value_bits), url
