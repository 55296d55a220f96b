"""The dashboard beyond loopback: bounded connections, bearer tokens and HTTPS.

Real sockets against ``rpsagg-server`` subprocesses on loopback, on both event loops where
the code paths differ (uvloop's and asyncio's TLS layers hand data on in another order):

1. Slow-loris: connections that never finish their request (headers cut short, a header
   trickled a byte at a time, nothing sent at all, half of a second request on a kept-alive
   connection) are closed once ``--http-header-timeout`` passes (1 s here; 408 where the
   request had begun), while a complete request is answered; ``/metrics`` counts them.
2. A flood under a small descriptor limit: the server runs with ``RLIMIT_NOFILE`` 256
   (automatic cap: 64 HTTP connections); 300 connections that never finish their headers
   (or, over HTTPS, their TLS handshake) hold at most 64 descriptors (the rest are answered
   503, or closed, at once), the process never holds more than its limit, and 20 gRPC
   clients Join meanwhile. Without the cap the flood alone would exceed the limit.
3. ``--http-tokens`` and ``--http-tls``: ``/api/*`` and ``/metrics`` need the bearer token
   (401 without or with a malformed or repeated header, 403 with a wrong one, the same body
   whatever the token), the health probes and the page do not; the TLS handshake verifies
   against the test CA, a stalled handshake is closed at the deadline; a real Prometheus
   (Debian's ``prometheus``) scrapes ``/metrics`` over HTTPS with its ``authorization``
   credentials file, and a second scrape job without it is refused.
"""

from __future__ import annotations

import contextlib
import json
import resource
import select
import selectors
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from http_util import free_port
from repo_paths import ROOT
from service_util import kill_all, make_certs, server_command, wait_port_file

from rpsagg_client import AggregationClient

pytestmark = pytest.mark.service

FD_LIMIT = 256
FLOOD = 300
CAP = FD_LIMIT // 4  # rpsagg_server.settings.descriptors.connection_cap(0, 256)
#: jobs running at once: few enough that the descriptor budget fits under FD_LIMIT
MAX_JOBS = 2


class Server:
    """An ``rpsagg-server`` subprocess with its dashboard on a loopback port."""

    def __init__(self, tmp_path: Path, *flags: str,
                 preexec: Callable[[], None] | None = None, insecure: bool = True) -> None:
        self.http_port = free_port()
        port_file = tmp_path / "grpc-port"
        self.proc = subprocess.Popen(server_command([
            *(["--insecure"] if insecure else []), "--host", "127.0.0.1", "--grpc-port", "0",
            "--http-port", str(self.http_port), "--http-host", "127.0.0.1", "--n", "20", "--k", "8",
            "--d", "64", "--task", "mean", "--rounds", "1", "--round-timeout", "60",
            "--db", ":memory:", "--linger", "-1", "--port-file", str(port_file),
            "--max-jobs", str(MAX_JOBS), *flags,
        ]), stderr=subprocess.PIPE, preexec_fn=preexec)
        try:
            self.grpc_port = wait_port_file(port_file, self.proc)
        except BaseException:
            self.close()
            raise

    def open_fds(self) -> int:
        return len(list(Path(f"/proc/{self.proc.pid}/fd").iterdir()))

    def close(self) -> str:
        kill_all([self.proc])
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")


@contextlib.contextmanager
def server(tmp_path: Path, *flags: str, preexec: Callable[[], None] | None = None,
           insecure: bool = True) -> Iterator[Server]:
    srv = Server(tmp_path, *flags, preexec=preexec, insecure=insecure)
    try:
        yield srv
    finally:
        srv.close()


def connect(port: int, first: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if first:
        s.sendall(first)
    s.setblocking(False)
    return s


def wait_closed(socks: list[socket.socket], timeout: float,
                tick: Callable[[], None] | None = None) -> dict[socket.socket, bytes]:
    """What each socket received until the server closed it; fails after ``timeout`` s.

    ``tick`` runs every 0.2 s meanwhile (the trickling clients send a byte then)."""
    sel = selectors.DefaultSelector()
    got: dict[socket.socket, bytes] = {s: b"" for s in socks}
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    open_ = set(socks)
    end = time.monotonic() + timeout
    while open_:
        left = end - time.monotonic()
        assert left > 0, f"{len(open_)} of {len(socks)} connections still open after {timeout} s"
        for key, _ in sel.select(min(0.2, left)):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                got[s] += data
            else:
                sel.unregister(s)
                open_.discard(s)
        if tick is not None:
            tick()
    sel.close()
    return got


def read_to_close(s: socket.socket, timeout: float) -> bytes:
    """What a non-blocking socket receives until the server closes it (EOF or reset); the
    answer and the close can arrive apart, so this waits for the close (``timeout`` s)."""
    data = b""
    end = time.monotonic() + timeout
    while True:
        try:
            chunk = s.recv(65536)
        except BlockingIOError:
            left = end - time.monotonic()
            assert left > 0, f"not closed within {timeout} s after {data[:80]!r}"
            select.select([s], [], [], left)
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def http_get(url: str, token: str | None = None, ctx: ssl.SSLContext | None = None,
             ) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", token)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as res:
            return res.status, res.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def metric(text: str, name: str) -> float:
    """The value of the sample ``name`` in a Prometheus text exposition: unlabelled (a
    server-wide series), or the default job's (``job="default"``, its only label)."""
    wanted = (name, f'{name}{{job="default"}}')
    values = [float(line.split()[1]) for line in text.splitlines()
              if line.split(" ", 1)[0] in wanted]
    assert len(values) == 1, (name, values)
    return values[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_requests_not_complete_within_the_timeout_are_closed(tmp_path: Path, loop: str) -> None:
    timeout = 1.0
    with server(tmp_path, "--http-header-timeout", str(timeout), "--event-loop", loop) as srv:
        port = srv.http_port
        started = time.monotonic()
        partial = [connect(port, b"GET /api/status HTTP/1.1\r\nHost: x\r\n") for _ in range(40)]
        silent = [connect(port) for _ in range(20)]
        trickle = [connect(port, b"GET /healthz HTTP/1.1\r\nX-Slow: ") for _ in range(5)]
        # a kept-alive connection: one complete request, then half of the next one
        kept = connect(port)
        kept.setblocking(True)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status":"ok"}'):  # the whole response
            chunk = kept.recv(65536)
            assert chunk, first
            first += chunk
        assert first.startswith(b"HTTP/1.1 200 ")
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        kept.setblocking(False)

        def more() -> None:  # the trickling clients keep sending: not an idle timeout
            for s in trickle:
                with contextlib.suppress(OSError):
                    s.send(b"a")

        # the bound: the timeout plus scheduling slack, well below the 30 s default
        got = wait_closed([*partial, *silent, *trickle, kept], timeout=15.0, tick=more)
        elapsed = time.monotonic() - started
        assert elapsed >= timeout  # a timer never fires early: the deadline, not a refusal
        for s in [*partial, *trickle, kept]:
            assert got[s].startswith(b"HTTP/1.1 408 "), got[s][:80]
        assert all(got[s] == b"" for s in silent)  # nothing asked, nothing answered
        # a complete request is answered as before (a WebSocket upgrade too, as plain HTTP:
        # there are no WebSocket routes, and the connection stays within the bounds)
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        with socket.create_connection(("127.0.0.1", port), timeout=10) as ws:
            ws.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                       b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                       b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            assert ws.recv(65536).startswith(b"HTTP/1.1 200 ")
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert metric(body.decode(), "rpsagg_http_requests_timed_out_total") == 66
        # every connection released its place: only the scrape's own is open
        end = time.monotonic() + 15
        while metric(http_get(f"http://127.0.0.1:{port}/metrics")[1].decode(),
                     "rpsagg_http_connections_open") != 1:
            assert time.monotonic() < end, "connections still counted as open"
            time.sleep(0.05)
        for s in [*partial, *silent, *trickle, kept]:
            s.close()


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("scheme", "loop"),
                         [("http", "uvloop"), ("https", "uvloop"), ("https", "asyncio")])
def test_a_flood_of_incomplete_requests_leaves_descriptors_for_grpc(
    tmp_path: Path, tls_dir: Path, scheme: str, loop: str
) -> None:
    # https: the flood never finishes its TLS handshake (half a ClientHello record); the
    # handshakes count against the cap, and one over it is closed without an answer
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FLOOD + 200:  # this process holds the flood's other ends
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, FLOOD + 400), hard))
    tls = ["--tls-cert", str(tls_dir / "server.pem"), "--tls-key", str(tls_dir / "server.key"),
           "--http-tls"] if scheme == "https" else []
    ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    first = (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" if scheme == "https"
             else b"GET /api/status HTTP/1.1\r\nHost: x\r\n")
    with server(tmp_path, "--http-header-timeout", "120", "--event-loop", loop, *tls,
                preexec=_low_fd_limit) as srv:
        limits = Path(f"/proc/{srv.proc.pid}/limits").read_text()
        assert any(line.startswith("Max open files") and f" {FD_LIMIT} " in line
                   for line in limits.splitlines())
        flood = [connect(srv.http_port, first) for _ in range(FLOOD)]
        try:
            # every connection beyond the cap is answered 503 (closed, for https) at once ...
            refused: list[socket.socket] = []
            sel = selectors.DefaultSelector()
            for s in flood:
                sel.register(s, selectors.EVENT_READ)
            end = time.monotonic() + 60
            while len(refused) < FLOOD - CAP:
                assert time.monotonic() < end, f"{len(refused)} refused of {FLOOD - CAP}"
                assert srv.open_fds() <= FD_LIMIT
                for key, _ in sel.select(0.2):
                    s = key.fileobj
                    assert isinstance(s, socket.socket)
                    data = read_to_close(s, timeout=10.0)
                    if scheme == "http":
                        assert data.startswith(b"HTTP/1.1 503 "), data[:80]
                    else:
                        assert data == b""
                    sel.unregister(s)
                    refused.append(s)
            # ... and the cap's worth stay open, waiting for their deadline (120 s)
            assert not sel.select(0.5)
            held = srv.open_fds()
            assert held <= FD_LIMIT - 100, held
            # gRPC still has descriptors: 20 clients Join while the flood holds its share
            clients = []
            try:
                for i in range(20):
                    # (with --tls-cert gRPC is TLS too: the same certificate)
                    c = AggregationClient(f"localhost:{srv.grpc_port}", f"c{i}",
                                          insecure=scheme == "http",
                                          tls_ca=str(tls_dir / "ca.pem") if tls else None,
                                          timeout=20, retry_budget=0)
                    clients.append(c)
                    assert c.join().client_index == i
                assert srv.open_fds() <= FD_LIMIT
            finally:
                for c in clients:
                    c.close()
            sel.close()
        finally:
            for s in flood:
                s.close()
        # the flood gone, the dashboard answers again
        base = f"{scheme}://localhost:{srv.http_port}"
        end = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                if http_get(base + "/healthz", ctx=ctx)[0] == 200:
                    break
            assert time.monotonic() < end, "the dashboard did not recover"
            time.sleep(0.1)
        # every flood connection released its place (those in a TLS handshake too): only
        # the scrape's own is open
        end = time.monotonic() + 15
        while True:
            text = http_get(base + "/metrics", ctx=ctx)[1].decode()
            if metric(text, "rpsagg_http_connections_open") == 1:
                break
            assert time.monotonic() < end, "connections still counted as open"
            time.sleep(0.05)
        assert metric(text, "rpsagg_http_connections_max") == CAP
        assert metric(text, "rpsagg_http_connections_refused_total") >= FLOOD - CAP
        assert metric(text, "rpsagg_http_requests_timed_out_total") == 0
        assert srv.proc.poll() is None


TOKEN = "dashboard-secret-7f3a"


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("http-tls")
    make_certs(tmp)
    (tmp / "http.tokens").write_text(f"# dashboard readers\n{TOKEN}\nsecond-token\n")
    return tmp


def _tls_flags(d: Path) -> list[str]:
    return ["--tls-cert", str(d / "server.pem"), "--tls-key", str(d / "server.key"),
            "--http-tls", "--http-tokens", str(d / "http.tokens")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_tokens_and_tls_guard_the_api_and_metrics(tmp_path: Path, tls_dir: Path,
                                                  loop: str) -> None:
    ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    with server(tmp_path, *_tls_flags(tls_dir), "--event-loop", loop,
                "--http-header-timeout", "2") as srv:
        base = f"https://localhost:{srv.http_port}"
        # the handshake verifies against the test CA; a client without it refuses the server
        with socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            assert tls.getpeercert()["subject"] == ((("commonName", "rpsagg-server"),),)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(base + "/healthz", timeout=10)
        # a handshake that never completes is closed at the deadline, without an answer
        stalled = [connect(srv.http_port), connect(srv.http_port, b"\x16\x03\x01\x02\x00")]
        got = wait_closed(stalled, timeout=15.0)
        assert all(got[s] == b"" for s in stalled)
        for s in stalled:
            s.close()
        # plain HTTP on the HTTPS port gets no answer
        with socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as plain:
            plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert not plain.recv(65536).startswith(b"HTTP/1.1 200")

        for path in ("/healthz", "/readyz", "/", "/static/dashboard.js"):
            assert http_get(base + path, ctx=ctx)[0] == 200, path
        bodies = set()
        for path in ("/api/status", "/api/rounds", "/api/rounds/1", "/api/clients",
                     "/api/rounds/export.csv", "/metrics"):
            for header, want in ((None, 401), ("Bearer", 401), ("Basic " + TOKEN, 401),
                                 (TOKEN, 401), ("Bearer wrong", 403),
                                 ("Bearer " + TOKEN[:-1], 403), ("Bearer " + TOKEN + "x", 403)):
                status, body = http_get(base + path, header, ctx)
                assert status == want, (path, header, status)
                bodies.add(body)
            for token in (TOKEN, "second-token"):
                status, body = http_get(base + path, "Bearer " + token, ctx)
                assert status == 200, (path, status)
        # nothing about the tokens in a refusal: one body for 401, one for 403
        assert bodies == {b'{"detail": "unauthorized"}', b'{"detail": "forbidden"}'}
        status, body = http_get(base + "/api/status", "Bearer " + TOKEN, ctx)
        config = json.loads(body)["config"]["settings"]
        assert config["http_tokens"] is True and "http.tokens" not in body.decode()
        # two Authorization headers are refused (no "last one wins")
        with socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                        + TOKEN.encode() + b"\r\nAuthorization: Bearer " + TOKEN.encode()
                        + b"\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := tls.recv(65536):
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 401 ")


needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="needs Debian's prometheus package (scripts/setup-env.sh test installs it as root)")


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as res:
        body = json.load(res)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result




def readme_blocks() -> tuple[str, dict[str, Any]]:
    """The commands and Prometheus job for a published dashboard (docs/dashboard.md,
    "Dashboard and metrics"): the bash block and the parsed YAML block."""
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "docs" / "dashboard.md").read_text()
    section = text[text.index("# Dashboard and metrics"):]
    bash = section[section.index("```bash\n") + 8:]
    bash = bash[:bash.index("```")]
    block = section[section.index("```yaml\n") + 8:]
    config: dict[str, Any] = yaml.safe_load(block[:block.index("```")])
    return bash, config


@needs_prometheus
@pytest.mark.skipif(shutil.which("openssl") is None, reason="make-test-ca.sh needs openssl")
@pytest.mark.timeout(180)
def test_prometheus_scrapes_over_https_with_its_token(tmp_path: Path) -> None:
    # docs/dashboard.md's set-up as written: the test CA of scripts/make-test-ca.sh, its commands
    # for the token files, its server flags (loopback instead of 0.0.0.0) and its scrape
    # job (the paths and the target put in); a second job without the token is refused.
    bash, readme = readme_blocks()
    subprocess.run([str(ROOT / "scripts" / "make-test-ca.sh"), "-o", "certs", "localhost"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    setup, server_line = [], ""
    for line in bash.replace("\\\n", " ").splitlines():
        command = line.split("#")[0].strip()
        if command.startswith("rpsagg-server "):
            server_line = command
        elif command:
            setup.append(command)
    subprocess.run(["bash", "-euc", "\n".join(setup)], cwd=tmp_path, check=True, timeout=30)
    flags = server_line.split()[1:]
    flags[flags.index("--http-host") + 1] = "127.0.0.1"
    flags = [str(tmp_path / f) if f.startswith("certs/") else f for f in flags]
    with server(tmp_path, *flags, insecure=False) as srv:
        prom_port = free_port()
        job = readme["scrape_configs"][0]
        assert job["scheme"] == "https" and "authorization" in job
        job["tls_config"]["ca_file"] = str(tmp_path / job["tls_config"]["ca_file"])
        job["authorization"]["credentials_file"] = str(
            tmp_path / job["authorization"]["credentials_file"])
        job["static_configs"] = [{"targets": [f"localhost:{srv.http_port}"]}]
        without = {k: v for k, v in job.items() if k != "authorization"}
        without["job_name"] = "without-token"
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [job, without],
        }))
        prometheus = subprocess.Popen([
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
        ], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            prom = f"http://127.0.0.1:{prom_port}"
            end = time.monotonic() + 90
            while True:
                assert prometheus.poll() is None, prometheus.communicate()[1].decode()[-2000:]
                with contextlib.suppress(OSError):
                    up = {r["metric"]["job"]: r["value"][1] for r in _query(prom, "up")}
                    if len(up) == 2:
                        break
                assert time.monotonic() < end, "Prometheus scraped neither job"
                time.sleep(0.2)
            assert up == {"rpsagg": "1", "without-token": "0"}
            # honor_labels: the server's label job (the default job's id) is kept
            series = _query(prom, "rpsagg_current_round")
            assert [(r["metric"]["job"], r["value"][1]) for r in series] == [("default", "1")]
        finally:
            kill_all([prometheus])
