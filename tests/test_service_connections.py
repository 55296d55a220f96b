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
import re
import resource
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from service_util import server_command
from test_http_exposure import connect, http_get, server, wait_closed

from rpsagg_client import AggregationClient

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame, stream 0
FIRST = {"nothing": b"", "preface": PREFACE, "settings": PREFACE + SETTINGS}
DEADLINE = 2.0  # --grpc-handshake-timeout and --grpc-idle-timeout here
# what the automatic budget gives gRPC with the dashboard on (connections.descriptor_budget)
GRPC_CAP = {1024: 1024 - 256 - 128, 256: 256 - 64 - 128}


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
