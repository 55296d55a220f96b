"""The gRPC port's connection bounds, with real sockets against ``rpsagg-server``.

The server runs under a lowered descriptor limit (``RLIMIT_NOFILE`` 1,024 or 256, set in
the child before exec) with its dashboard on; a flood of connections to its gRPC port that
stays just under the limit (1,000 or 232 sockets) either sends nothing, sends only the
HTTP/2 preface, or completes the preface and SETTINGS and then stays idle. While it is held:

* the process never holds more descriptors than its limit (gRPC's cap closes the sockets
  beyond its share at accept: ``grpc.max_allowed_incoming_connections``);
* fresh clients Join on new channels, and ``/readyz`` answers 200;
* every flood socket is closed by the server within its deadline: the handshake deadline
  for the first two kinds, the idle deadline for the third (2 s each here), plus slack.

The start-up log states the descriptor budget of both ports.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from service_util import make_certs, server_command, wait_until
from test_http_exposure import MAX_JOBS, connect, http_get, metric, server, wait_closed

from rpsagg_client import AggregationClient
from rpsagg_server.jobs.endedjobs import READERS
from rpsagg_server.settings.descriptors import descriptor_budget

pytestmark = pytest.mark.service

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame, stream 0
FIRST = {"nothing": b"", "preface": PREFACE, "settings": PREFACE + SETTINGS}
DEADLINE = 2.0  # --grpc-handshake-timeout and --grpc-idle-timeout here
# what the automatic budget gives gRPC with the dashboard on, after the reserves and the
# jobs' descriptors: 1024 - 256 - 128 - 28 and 256 - 64 - 128 - 28
GRPC_CAP = {lim: descriptor_budget(0, 0, lim, (MAX_JOBS, READERS)).grpc for lim in (1024, 256)}


def _limit(n: int) -> Callable[[], None]:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return set_limit


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["nothing", "preface", "settings"])
@pytest.mark.parametrize("limit", [1024, 256])
def test_a_grpc_flood_leaves_room_for_fresh_joins(tmp_path: Path, limit: int, kind: str) -> None:
    flood_n = limit - 24
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < flood_n + 300:  # this process holds the flood's other ends
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, flood_n + 500), hard))
    flags = ["--grpc-handshake-timeout", str(DEADLINE), "--grpc-idle-timeout", str(DEADLINE)]
    with server(tmp_path, *flags, preexec=_limit(limit)) as srv:
        flood: list[socket.socket] = []
        clients: list[AggregationClient] = []
        try:
            started = time.monotonic()
            for _ in range(flood_n):
                flood.append(connect(srv.grpc_port, FIRST[kind]))
            assert srv.open_fds() <= limit
            # fresh clients on new channels Join while the flood is held (those refused at
            # the cap retry; the deadlines free the cap's places)
            for i in range(10):
                c = AggregationClient(f"127.0.0.1:{srv.grpc_port}", f"c{i}", insecure=True,
                                      timeout=10, retry_budget=30)
                clients.append(c)
                assert c.join().client_index == i
                assert srv.open_fds() <= limit
            status, body = http_get(f"http://127.0.0.1:{srv.http_port}/readyz")
            assert status == 200, body
            # every flood socket is closed by the server within its deadline
            wait_closed(flood, timeout=DEADLINE + 20.0)
            assert time.monotonic() - started >= DEADLINE or kind == "nothing"
            assert srv.proc.poll() is None
        finally:
            for c in clients:
                c.close()
            for s in flood:
                with contextlib.suppress(OSError):
                    s.close()
        log = srv.close()
    budget = re.search(r"file descriptors: limit (\d+); gRPC connections at most (\d+), "
                       r"dashboard connections at most (\d+)", log)
    assert budget is not None, log[-2000:]
    assert budget.groups() == (str(limit), str(GRPC_CAP[limit]), str(limit // 4))


@pytest.mark.timeout(60)
def test_the_budget_refuses_caps_beyond_the_limit(tmp_path: Path) -> None:
    proc = subprocess.run(server_command([
        "--insecure", "--grpc-port", "0", "--http-port", "0", "--db", ":memory:",
        "--grpc-max-connections", "1000"]), preexec_fn=_limit(1024), capture_output=True,
        text=True, timeout=50)
    assert proc.returncode != 0
    assert "--grpc-max-connections 1000" in proc.stderr and "ulimit -n" in proc.stderr, \
        proc.stderr[-1000:]


def _metric_wait(base: str, name: str, want: Callable[[float], bool], timeout: float,
                 ctx: ssl.SSLContext | None = None) -> float:
    """Poll ``/metrics`` until ``want(value)``; fails after ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        value = metric(http_get(base + "/metrics", ctx=ctx)[1].decode(), name)
        if want(value):
            return value
        assert time.monotonic() < end, f"{name} = {value} after {timeout} s"
        time.sleep(0.05)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("limit", [1024, 256])
def test_health_probes_answer_while_the_dashboard_cap_is_full(tmp_path: Path,
                                                              limit: int) -> None:
    flood_n = limit - 24
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < flood_n + 300:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, flood_n + 500), hard))
    with server(tmp_path, "--http-header-timeout", "120", preexec=_limit(limit)) as srv:
        base = f"http://127.0.0.1:{srv.http_port}"
        # the cap full of requests that never finish, then connections that send nothing
        # (they take the probes' reserve until displaced)
        flood = [connect(srv.http_port, b"GET /api/status HTTP/1.1\r\nHost: x\r\n")
                 for _ in range(flood_n)]
        silent: list[socket.socket] = []
        clients: list[AggregationClient] = []
        try:
            end = time.monotonic() + 30
            while True:  # the cap is full: a fresh non-probe request is refused
                if http_get(base + "/api/status")[0] == 503:
                    break
                assert time.monotonic() < end, "the cap never filled"
                time.sleep(0.05)
            silent = [connect(srv.http_port) for _ in range(40)]
            assert srv.open_fds() <= limit
            for _ in range(10):
                for path in ("/healthz", "/readyz"):
                    t0 = time.monotonic()
                    status, body = http_get(base + path)
                    assert status == 200, (path, body)
                    assert time.monotonic() - t0 < 5.0  # (bench/connections.py times it)
            c = AggregationClient(f"127.0.0.1:{srv.grpc_port}", "c0", insecure=True,
                                  timeout=10, retry_budget=30)
            clients.append(c)
            assert c.join().client_index == 0
            assert srv.open_fds() <= limit
        finally:
            for c in clients:
                c.close()
            for s in [*flood, *silent]:
                s.close()
        assert srv.proc.poll() is None


@pytest.mark.timeout(120)
def test_a_response_nobody_reads_is_aborted_at_the_write_deadline(tmp_path: Path) -> None:
    timeout = 2.0
    with server(tmp_path, "--http-header-timeout", str(timeout)) as srv:
        base = f"http://127.0.0.1:{srv.http_port}"
        readers: list[socket.socket] = []
        request = b"GET /static/dashboard.js HTTP/1.1\r\nHost: x\r\n\r\n"
        try:
            for _ in range(5):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(("127.0.0.1", srv.http_port))
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    s.send(request * 2000)  # pipelined, never read
                readers.append(s)
            # each stalls its response (the server's buffer above its high mark), then is
            # aborted once the write deadline passes; nothing else is held
            _metric_wait(base, "rpsagg_http_writes_timed_out_total", lambda v: v == 5,
                         timeout + 20.0)
            _metric_wait(base, "rpsagg_http_connections_open", lambda v: v == 1, 10.0)
        finally:
            for s in readers:
                s.close()


def _closed_within(s: ssl.SSLSocket, bound: float) -> tuple[bytes, float]:
    """What ``s`` received until the server closed the TCP connection (not only its TLS
    session: this client never sends its own close_notify), and when (fails after
    ``bound``)."""
    got = b""
    t0 = time.monotonic()
    s.settimeout(bound)
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        except TimeoutError:
            raise AssertionError(f"still open {bound} s later; got {got[:80]!r}") from None
        if not chunk:  # the server's close_notify: now the TCP close
            with socket.socket(fileno=os.dup(s.fileno())) as raw:
                raw.settimeout(max(0.01, bound - (time.monotonic() - t0)))
                try:
                    while raw.recv(65536):
                        pass
                except ConnectionResetError:
                    pass
                except TimeoutError:
                    raise AssertionError(f"TLS closed, TCP still open {bound} s later; "
                                         f"got {got[:80]!r}") from None
            break
        got += chunk
    return got, time.monotonic() - t0


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("tls")
    make_certs(tmp)
    return tmp


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_https_connections_close_at_their_deadlines(tmp_path: Path, tls_dir: Path,
                                                    loop: str) -> None:
    timeout = 1.0
    ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    tls = ["--tls-cert", str(tls_dir / "server.pem"), "--tls-key", str(tls_dir / "server.key"),
           "--http-tls"]
    with server(tmp_path, *tls, "--http-header-timeout", str(timeout), "--event-loop", loop,
                ) as srv:
        def tls_conn() -> ssl.SSLSocket:
            raw = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10)
            return ctx.wrap_socket(raw, server_hostname="localhost")

        # a request cut off: 408 at the deadline, and the socket closed then (no wait for
        # the client's close_notify)
        cut = tls_conn()
        cut.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        got, took = _closed_within(cut, timeout + 10.0)
        assert got.startswith(b"HTTP/1.1 408 "), got[:80]
        assert took < timeout + 2.0, took
        cut.close()
        # an idle keep-alive: closed at uvicorn's 5 s as over plain HTTP
        kept = tls_conn()
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        got, took = _closed_within(kept, 30.0)
        assert got.startswith(b"HTTP/1.1 200 "), got[:80]
        assert took < 5.0 + 2.0, took
        kept.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["nothing", "settings"])
def test_a_held_grpc_flood_is_displaced_for_fresh_clients(tmp_path: Path, kind: str) -> None:
    """With deadlines far away (60 s), only displacement makes room: the flood fills gRPC's
    cap, the guard shuts down the oldest connections without a call in flight, fresh
    clients then Join at their first attempt (no retry), and a call in flight (a GetResult
    waiting for its round) is never cut."""
    limit = 1024
    flood_n = limit - 24
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < flood_n + 300:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, flood_n + 500), hard))
    flags = ["--grpc-handshake-timeout", "60", "--grpc-idle-timeout", "60"]
    with server(tmp_path, *flags, preexec=_limit(limit)) as srv:
        base = f"http://127.0.0.1:{srv.http_port}"
        target = f"127.0.0.1:{srv.grpc_port}"
        flood: list[socket.socket] = []
        clients: list[AggregationClient] = []
        waiter = AggregationClient(target, "waiter", insecure=True, timeout=120,
                                   retry_budget=0)  # any cut is an error, not a retry
        failure: list[BaseException] = []
        try:
            waiter.join()
            round_id = waiter.current_round().round_id

            def wait_for_round() -> None:
                try:
                    waiter.result(round_id, wait=True, timeout=120)
                except BaseException as exc:  # reported below
                    failure.append(exc)

            waiting = threading.Thread(target=wait_for_round, daemon=True)
            waiting.start()
            for _ in range(flood_n):
                flood.append(connect(srv.grpc_port, FIRST[kind]))
            displaced = _metric_wait(base, "rpsagg_grpc_connections_displaced_total",
                                     lambda v: v > 0, 30)
            assert srv.open_fds() <= limit
            for i in range(10):  # a place is free: the first attempt succeeds
                c = AggregationClient(target, f"c{i}", insecure=True, timeout=10,
                                      retry_budget=0)
                clients.append(c)
                assert c.join().client_index == i + 1
            # the displaced sockets were closed by the server, the others are held (their
            # deadlines are 60 s away)
            closed = [s for s in flood if _closed(s)]
            assert displaced <= len(closed) < flood_n
            assert waiting.is_alive() and not failure, failure
            assert srv.proc.poll() is None
        finally:
            for c in clients:
                c.close()
            waiter.close()
            for s in flood:
                with contextlib.suppress(OSError):
                    s.close()
        log = srv.close()
    assert "displaced" in log and "without a call in flight" in log, log[-2000:]


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (what it sent read and dropped, then EOF or reset)."""
    try:
        while s.recv(65536):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.mark.timeout(180)
def test_a_flood_of_the_d0_stand_in_leaves_room_for_the_first_join(tmp_path: Path) -> None:
    """Before the first join of a ``--d 0`` job a stand-in serves the port: it has the
    job's connection bounds and displacement too, so a flood held open (deadlines 60 s
    away) does not keep the first client out."""
    limit = 1024
    flood_n = limit - 24
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < flood_n + 300:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, flood_n + 500), hard))
    flags = ["--d", "0", "--data", "external", "--grpc-handshake-timeout", "60",
             "--grpc-idle-timeout", "60"]
    with server(tmp_path, *flags, preexec=_limit(limit)) as srv:
        flood: list[socket.socket] = []
        try:
            for _ in range(flood_n):
                flood.append(connect(srv.grpc_port, FIRST["settings"]))
            assert srv.open_fds() <= limit
            # beyond the sockets gRPC's cap closed at accept, some were displaced
            closed: set[socket.socket] = set()

            def displaced() -> bool:
                closed.update(s for s in flood if s not in closed and _closed(s))
                return len(closed) > flood_n - GRPC_CAP[limit]

            wait_until(displaced, 30, "flood connections displaced")
            # the first attempt reaches the stand-in's handler (a place was free), which
            # takes d and asks for a retry against the job's server
            with AggregationClient(f"127.0.0.1:{srv.grpc_port}", "first", insecure=True,
                                   timeout=10, retry_budget=0) as first:
                with pytest.raises(grpc.RpcError) as refused:
                    first.join(d=100)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "the job starts with d = 100" in str(refused.value.details())
            with AggregationClient(f"127.0.0.1:{srv.grpc_port}", "first", insecure=True,
                                   timeout=10, retry_budget=30) as first:
                assert first.join(d=100).client_index == 0
            assert srv.proc.poll() is None
        finally:
            for s in flood:
                with contextlib.suppress(OSError):
                    s.close()
        log = srv.close()
    assert "takes d from the first client's join" in log and "displaced" in log, log[-2000:]
    assert "d = 100" in log, log[-2000:]
