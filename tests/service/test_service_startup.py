"""Start-up user errors (one line on stderr, exit status 2) and the dashboard's binding.

Every error case runs the real ``rpsagg-server`` command in a subprocess and checks its exit
status, that stderr is exactly one line without a traceback, and that the line gives the
right reason (not gRPC's generic "Failed to bind").
"""

from __future__ import annotations

import json
import os
import random
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_util import Service, free_port
from service_util import Certs, kill_all, make_certs, server_command, wait_port_file

from rpsagg_server.domain.errors import StartupError
from rpsagg_server.process.startup import bind_http_sockets
from rpsagg_server.store.database import Store

pytestmark = pytest.mark.service

JOB = ["--n", "2", "--k", "4", "--d", "16", "--task", "mean", "--rounds", "1"]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


HAS_IPV6 = _ipv6_loopback()


def run_server(args: list[str], env: dict[str, str] | None = None,
               prefix: tuple[str, ...] = ()) -> tuple[int, str]:
    """Run ``rpsagg-server args`` (under the command ``prefix``) to completion; returns
    (status, stderr)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RPSAGG_")}
    full_env.update(env or {})
    out = subprocess.run(server_command(args, prefix), capture_output=True, text=True,
                         timeout=120, env=full_env)
    return out.returncode, out.stderr


def assert_one_line_error(status: int, stderr: str, *fragments: str) -> None:
    assert status == 2, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip("\n").split("\n")
    assert len(lines) == 1, stderr
    assert lines[0].startswith("rpsagg-server: "), stderr
    for f in fragments:
        assert f in lines[0], (f, stderr)
    assert "Failed to bind" not in stderr


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Certs, Certs, str]:
    """Two independent certificate sets and a token file."""
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    (a / "tokens").write_text("tok\n")
    return make_certs(a), make_certs(b), str(a / "tokens")


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A TCP socket listening on 127.0.0.1 (any free port), held for the test."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        yield s
    finally:
        s.close()


def test_missing_token_file(certs: tuple[Certs, Certs, str], tmp_path: Path) -> None:
    c, _, _ = certs
    missing = str(tmp_path / "nope.tokens")
    status, err = run_server([*JOB, "--tls-cert", c.server_cert, "--tls-key", c.server_key,
                              "--tokens", missing, "--db", ":memory:", "--grpc-port", "0",
                              "--http-port", "0"])
    assert_one_line_error(status, err, "--tokens", missing, "No such file or directory")


@pytest.mark.parametrize("which", ["--tls-cert", "--tls-key", "--tls-client-ca"])
def test_missing_certificate_files(which: str, certs: tuple[Certs, Certs, str],
                                   tmp_path: Path) -> None:
    c, _, tokens = certs
    files = {"--tls-cert": c.server_cert, "--tls-key": c.server_key, "--tls-client-ca": c.ca}
    missing = str(tmp_path / "missing.pem")
    files[which] = missing
    args = [*JOB, "--tokens", tokens, "--db", ":memory:", "--grpc-port", "0",
            "--http-port", "0"]
    for flag, path in files.items():
        args += [flag, path]
    status, err = run_server(args)
    assert_one_line_error(status, err, which, missing, "No such file or directory")


def test_certificate_and_key_that_do_not_match(certs: tuple[Certs, Certs, str]) -> None:
    a, b, tokens = certs
    status, err = run_server([*JOB, "--tls-cert", a.server_cert, "--tls-key", b.server_key,
                              "--tokens", tokens, "--db", ":memory:", "--grpc-port", "0",
                              "--http-port", "0"])
    assert_one_line_error(status, err, "does not belong to --tls-cert", b.server_key)


def test_a_key_file_that_is_not_pem(certs: tuple[Certs, Certs, str], tmp_path: Path) -> None:
    a, _, tokens = certs
    junk = tmp_path / "junk.key"
    junk.write_text("not a key\n")
    status, err = run_server([*JOB, "--tls-cert", a.server_cert, "--tls-key", str(junk),
                              "--tokens", tokens, "--db", ":memory:", "--grpc-port", "0",
                              "--http-port", "0"])
    assert_one_line_error(status, err, "not a usable PEM certificate and key")


def test_corrupt_database(tmp_path: Path) -> None:
    db = tmp_path / "corrupt.db"
    db.write_bytes(b"this is not SQLite\n" * 400)
    before = db.read_bytes()
    status, err = run_server([*JOB, "--insecure", "--db", str(db), "--grpc-port", "0",
                              "--http-port", "0"])
    assert_one_line_error(status, err, "--db", str(db), "not an SQLite database")
    assert db.read_bytes() == before  # untouched


def test_a_truncated_rpsagg_database(tmp_path: Path) -> None:
    """An rpsagg database cut in half (a bad copy) is reported, not a traceback."""
    db = tmp_path / "job.db"
    store = Store(str(db))
    store.put_meta("filler", "x" * 100_000)
    store.close()
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    status, err = run_server([*JOB, "--insecure", "--db", str(db), "--grpc-port", "0",
                              "--http-port", "0"])
    assert_one_line_error(status, err, "--db", str(db))


def test_another_applications_database(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    status, err = run_server([*JOB, "--insecure", "--db", str(db), "--grpc-port", "0",
                              "--http-port", "0"])
    assert_one_line_error(status, err, "not an rpsagg database", "users")
    with sqlite3.connect(db) as conn:  # no rpsagg table was added to it
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"users"}


def test_a_database_of_a_job_with_other_settings(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    store = Store(str(db))
    other = {"n": 3, "k": 4, "d": 16, "estimator": "rand-proj-spatial", "transform": "avg",
             "task": "mean", "eval": False}
    store.put_meta("config", json.dumps(other))
    store.close()
    status, err = run_server([*JOB, "--insecure", "--db", str(db), "--grpc-port", "0",
                              "--http-port", "0"])
    assert_one_line_error(status, err, "belongs to a job with other settings", "n=3 (now 2)")


def test_grpc_port_in_use(listening: socket.socket, tmp_path: Path) -> None:
    port = listening.getsockname()[1]
    status, err = run_server([*JOB, "--insecure", "--db", str(tmp_path / "x.db"), "--host",
                              "127.0.0.1", "--grpc-port", str(port), "--http-port", "0"])
    assert_one_line_error(status, err, f"127.0.0.1:{port}", "the port is in use",
                          "--grpc-port")
    # the default dual-stack [::] collides with the IPv4 listener too
    status, err = run_server([*JOB, "--insecure", "--db", ":memory:", "--grpc-port", str(port),
                              "--http-port", "0"])
    assert_one_line_error(status, err, "the port is in use", "--grpc-port")


def test_http_port_in_use(listening: socket.socket, tmp_path: Path) -> None:
    port = listening.getsockname()[1]
    db = tmp_path / "x.db"
    status, err = run_server([*JOB, "--insecure", "--db", str(db), "--host", "127.0.0.1",
                              "--grpc-port", "0", "--http-port", str(port)])
    assert_one_line_error(status, err, f"127.0.0.1:{port}", "the port is in use",
                          "--http-port")
    assert not db.exists()  # refused before the job was started


@pytest.mark.parametrize(("args", "env", "fragments"), [
    (["--n", "abc"], {}, ("--n", "invalid int value: 'abc'")),
    (["--round-timeout", "nan"], {}, ("--round-timeout must be a finite number > 0",)),
    (["--grpc-port", "70000"], {}, ("--grpc-port must be in [0, 65535]",)),
    (["--estimator", "bogus"], {}, ("--estimator must be one of",)),
    (["--no-such-flag"], {}, ("unrecognized arguments: --no-such-flag",)),
    ([], {"RPSAGG_K": "many"}, ("--k (RPSAGG_K or config key k) must be an integer",
                                "'many'")),
    (["--http-host", ","], {}, ("--http-host needs at least one address",)),
    ([], {"RPSAGG_INSECURE": "0"}, ("TLS is required",)),
    (["--event-loop", "trio"], {}, ("--event-loop must be one of auto, uvloop, asyncio",
                                    "'trio'")),
    (["--http-header-timeout", "0"], {}, ("--http-header-timeout must be a finite number > 0",)),
    (["--http-max-connections", "-1"], {}, ("--http-max-connections must be >= 0",)),
    (["--http-tls"], {}, ("--http-tls serves the dashboard with --tls-cert and --tls-key",)),
], ids=["int", "nan-timeout", "port-range", "estimator", "unknown-flag", "env-int",
        "http-host", "secure-by-default", "event-loop", "http-header-timeout",
        "http-max-connections", "http-tls-without-cert"])
def test_bad_flag_values(args: list[str], env: dict[str, str],
                         fragments: tuple[str, ...]) -> None:
    base = [*JOB, "--db", ":memory:", "--grpc-port", "0", "--http-port", "0"]
    if "RPSAGG_INSECURE" not in env:
        base.append("--insecure")
    status, err = run_server([*base, *args], env)
    assert_one_line_error(status, err, *fragments)


@pytest.mark.parametrize(("content", "fragments"), [
    (None, ("--http-tokens", "cannot read it", "No such file or directory")),
    ("# only a comment\n\n", ("--http-tokens", "no tokens")),
    ("one-token\nclient-a token-a\n", ("--http-tokens", ":2: expected one token per line")),
], ids=["missing", "empty", "two-words"])
def test_bad_dashboard_token_files(content: str | None, fragments: tuple[str, ...],
                                   tmp_path: Path) -> None:
    path = tmp_path / "http.tokens"
    if content is not None:
        path.write_text(content)
    db = tmp_path / "x.db"
    status, err = run_server([*JOB, "--insecure", "--db", str(db), "--grpc-port", "0",
                              "--http-port", str(free_port()), "--http-tokens", str(path)])
    assert_one_line_error(status, err, *fragments)
    assert "token-a" not in err and "one-token" not in err  # no token in the message
    assert not db.exists()  # refused before the job was started


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flag", ["--tokens", "--http-tokens"])
@pytest.mark.parametrize("kind", ["not-utf8", "fifo", "directory"])
def test_token_files_that_are_not_text_files(flag: str, kind: str, tmp_path: Path) -> None:
    """A token file that is not UTF-8, a FIFO (opening it would wait for a writer forever)
    or a directory: one line naming the flag and the file, at once (the subprocess's own
    timeout bounds the wait), before the job starts."""
    path = tmp_path / "tokens"
    if kind == "not-utf8":
        path.write_bytes(b"s3cret-token\xff\xfe\n")
        reason = "not UTF-8 text (an invalid byte at offset 12)"
    elif kind == "fifo":
        os.mkfifo(path)
        reason = "not a regular file (a FIFO)"
    else:
        path.mkdir()
        reason = "not a regular file (a directory)"
    db = tmp_path / "x.db"
    status, err = run_server([*JOB, "--insecure", "--db", str(db), "--grpc-port", "0",
                              "--http-port", str(free_port()), flag, str(path)])
    assert_one_line_error(status, err, f"{flag} {path}: {reason}")
    assert "s3cret" not in err
    assert not db.exists()  # refused before the job was started


def test_a_connection_cap_that_leaves_grpc_no_descriptors(tmp_path: Path) -> None:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    status, err = run_server([*JOB, "--insecure", "--db", ":memory:", "--grpc-port", "0",
                              "--http-port", str(free_port()),
                              "--http-max-connections", str(soft)])
    assert_one_line_error(status, err, f"--http-max-connections {soft} leaves fewer than 128",
                          f"at most {soft - 192}")


def test_jobs_that_cannot_fit_the_descriptor_limit_stop_the_start(tmp_path: Path) -> None:
    """The descriptor budget counts the jobs the server may hold open (--max-jobs running,
    the ended ones read): under ``prlimit --nofile=256`` 16 running jobs do not fit beside
    64 dashboard connections; the start says what would, in one line, exit 2, at once."""
    db = tmp_path / "x.db"
    args = [*JOB, "--insecure", "--db", str(db), "--grpc-port", "0",
            "--http-port", str(free_port())]
    status, err = run_server([*args, "--max-jobs", "16"], prefix=("prlimit", "--nofile=256"))
    assert_one_line_error(status, err, "16 running jobs (--max-jobs) with 64 dashboard "
                          "connections leave fewer than 16 of the process's 256 file "
                          "descriptors (ulimit -n) to gRPC; use --max-jobs 5 or raise the limit")
    assert not db.exists()  # refused before anything was opened
    svc = Service(tmp_path, "fits", "--insecure", "--max-jobs", "5",
                  prefix=("prlimit", "--nofile=256"))
    try:
        assert svc.api("/healthz")[0] == 200
    finally:
        svc.close()
    assert ("file descriptors: limit 256; gRPC connections at most 18, dashboard connections "
            "at most 64, 174 reserved (with 46 for 5 running jobs and 4 ended ones read at "
            "once)") in svc.log.read_text()


# -- the dashboard's addresses ---------------------------------------------------------------
def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return int(resp.status)


def _refused(url: str) -> bool:
    try:
        _get(url)
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


def test_bind_http_sockets_default_is_both_loopbacks_on_one_port() -> None:
    socks = bind_http_sockets("127.0.0.1,::1", 0)
    try:
        addrs = {(s.family, s.getsockname()[0]) for s in socks}
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1 and 0 not in ports
        want = {(socket.AF_INET, "127.0.0.1")}
        if HAS_IPV6:
            want.add((socket.AF_INET6, "::1"))
        assert addrs == want
    finally:
        for s in socks:
            s.close()
    with pytest.raises(StartupError, match="cannot resolve"):
        bind_http_sockets("no-such-host.invalid", 0)


def _free_low_port() -> int:
    """A port free on 127.0.0.1 and ::1, below the kernel's ephemeral range.

    ``--http-port 0`` disables the dashboard, so the CLI test needs a concrete port; one
    outside the ephemeral range is never handed out to another process's port-0 socket.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random(os.getpid())
    for _ in range(200):
        port = rng.randrange(20000, min(low, 32768))
        try:
            socks = bind_http_sockets("127.0.0.1,::1", port)
        except StartupError:
            continue
        for s in socks:
            s.close()
        return port
    raise RuntimeError("no free port")


@pytest.mark.parametrize("http_host", [None, "127.0.0.1"], ids=["default", "ipv4-only"])
def test_dashboard_answers_on_the_loopbacks_it_was_given(http_host: str | None,
                                                         tmp_path: Path) -> None:
    port = _free_low_port()
    port_file = tmp_path / "grpc.port"
    args = [*JOB, "--insecure", "--db", ":memory:", "--grpc-port", "0", "--http-port",
            str(port), "--port-file", str(port_file), "--linger", "-1"]
    if http_host is not None:
        args += ["--http-host", http_host]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RPSAGG_")}
    proc = subprocess.Popen(server_command(args), stderr=subprocess.PIPE, env=env)
    try:
        wait_port_file(port_file, proc)
        # the port file is written after uvicorn's task was started: wait for it to answer
        deadline = time.monotonic() + 30
        while True:
            try:
                assert _get(f"http://127.0.0.1:{port}/healthz") == 200
                break
            except urllib.error.URLError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if HAS_IPV6:
            if http_host is None:
                assert _get(f"http://[::1]:{port}/healthz") == 200
            else:
                assert _refused(f"http://[::1]:{port}/healthz")
    finally:
        kill_all([proc])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("startup", ["fails", "hangs"])
def test_no_port_file_when_the_dashboard_does_not_start(
    tmp_path: Path, startup: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The port file promises that gRPC and the dashboard both accept connections: a
    # dashboard whose start-up fails (uvicorn exits) or does not finish within the bound is
    # a start-up error (rpsagg-server: one line, exit 2), no port file appears, and the
    # dashboard's port is released.
    import asyncio

    from service_util import base_config

    from rpsagg_server.process import serving as server

    async def app(scope: dict, receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        await receive()
        if startup == "fails":
            await send({"type": "lifespan.startup.failed", "message": "no dashboard today"})
        else:
            await asyncio.Event().wait()  # never ready

    monkeypatch.setattr(server, "DASHBOARD_START_S", 1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    port_file = tmp_path / "port"
    cfg = base_config(http_port=http_port, http_host="127.0.0.1", port_file=str(port_file))
    with pytest.raises(StartupError, match=r"the dashboard did not start on http://127\.0\.0"):
        asyncio.run(server.serve(cfg, http_app_factory=lambda *_: app))
    assert not port_file.exists()
    with socket.socket() as s:  # the dashboard's socket was closed
        s.bind(("127.0.0.1", http_port))
