"""Helpers for the service tests: certificates, in-process servers, server subprocesses
(through the launcher, :mod:`rpsagg_experiments.launch`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rpsagg import make_estimator
from rpsagg_client import AggregationClient
from rpsagg_experiments.launch import (
    PY,
    LocalJob,
    ServerProcess,
    client_command,
    kill_processes,
    server_command,
    wait_port_file,
)
from rpsagg_server.decode.decoding import messages
from rpsagg_server.process.grpcserver import RunningServer, create_server
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.store.database import Store
from rpsagg_wire.v1 import serde

# the launcher's helpers, under the names the service tests use
__all__ = ["PY", "client_command", "kill_all", "server_command", "wait_port_file"]
kill_all = kill_processes


@dataclass(frozen=True)
class Certs:
    """PEM files of a test CA, a server certificate and a client certificate."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_certs(directory: Path) -> Certs:
    """A fresh CA with a server cert (localhost, 127.0.0.1, ::1) and a client cert."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("rpsagg test CA"))
          .issuer_name(name("rpsagg test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, sans: list[x509.GeneralName]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    server_sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    s_cert, s_key = leaf("rpsagg-server", server_sans)
    c_cert, c_key = leaf("rpsagg-client", [x509.DNSName("rpsagg-client")])
    files = {
        "ca.pem": ca.public_bytes(serialization.Encoding.PEM), "server.pem": s_cert,
        "server.key": s_key, "client.pem": c_cert, "client.key": c_key,
    }
    for fname, data in files.items():
        (directory / fname).write_bytes(data)
    p = str(directory)
    return Certs(f"{p}/ca.pem", f"{p}/server.pem", f"{p}/server.key", f"{p}/client.pem",
                 f"{p}/client.key")


def base_config(**changes: object) -> ServerConfig:
    """A small insecure in-memory job on loopback, any free port."""
    cfg = ServerConfig(grpc_port=0, http_port=0, host="127.0.0.1", n=4, k=8, d=128,
                       task="mean", rounds=3, round_timeout=30.0, db=":memory:", insecure=True,
                       linger=-1)
    return replace(cfg, **changes)  # type: ignore[arg-type]


class InProcessServer:
    """A server on its own event loop in a background thread."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.running: RunningServer
        self.running, self.port = self.call(create_server(cfg))

    def call(self, coro: object) -> object:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the server and its loop."""
        try:
            self.call(self.running.stop(0.2))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@contextmanager
def in_process_server(cfg: ServerConfig) -> Iterator[InProcessServer]:
    """Context manager around :class:`InProcessServer`."""
    srv = InProcessServer(cfg)
    try:
        yield srv
    finally:
        srv.stop()


def wait_all_exit_cleanly(
    server: subprocess.Popen[bytes], clients: Sequence[subprocess.Popen[bytes]]
) -> str:
    """Wait for every client, then the server, and assert each exited with status 0;
    returns the server's stderr (its log)."""
    for p in clients:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err.decode()
    _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err.decode()[-2000:]
    return (err or b"").decode()


def run_local_job(tmp_path: Path, n: int, k: int, d: int, rounds: int, data_r: float,
                  extra: Sequence[str] = (), env: dict[str, str] | None = None) -> str:
    """Run a mean job to its end: an ``rpsagg-server`` subprocess (``--linger 0``, port 0,
    loopback, ``extra`` flags) and ``n`` ``rpsagg-client`` processes; assert every process
    exited with status 0 and return the database path (the server's log is left in
    ``tmp_path / "server.log"``). Processes are killed on failure.
    """
    db = tmp_path / "job.db"
    server = ServerProcess([
        "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
        "--n", str(n), "--k", str(k), "--d", str(d), "--task", "mean",
        "--data-r", str(data_r), "--rounds", str(rounds), "--round-timeout", "120",
        "--db", str(db), "--linger", "0", *extra,
    ], tmp_path / "port", env=env, stderr=subprocess.PIPE)
    job = LocalJob(server)
    try:
        with job:
            for i in range(n):
                job.start_client(["--server", job.target, "--client-id", f"client-{i}",
                                  "--insecure"], stderr=subprocess.PIPE)
            assert server.proc is not None
            log = wait_all_exit_cleanly(server.proc, job.clients)
            (tmp_path / "server.log").write_text(log)
    finally:
        job.kill()
    return str(db)


def check_rounds_against_inprocess(db: str, n: int, k: int, d: int, scheme: str) -> int:
    """Every done round's stored estimate vs ``Estimator.decode`` in-process; returns count.

    Messages are rebuilt from the committed submissions (client seed, values) with
    ``derive_round_seed``; the decode runs with a fresh estimator in this process.
    """
    store = Store(db)
    try:
        clients = {cid: idx for cid, idx, _ in store.clients()}
        checked = 0
        for r in store.rounds():
            if r.state != "done":
                continue
            assert r.estimate is not None
            subs = [serde.decode_submission(s.payload) for s in store.submissions(r.round_id)]
            subs.sort(key=lambda s: clients[s.client_id])
            got = np.frombuffer(r.estimate, dtype="<f8").reshape(len(subs[0].vectors), d)
            est = make_estimator(scheme, n=n, k=k, d=d)
            for j in range(got.shape[0]):
                want = est.decode(messages(subs, r.nonce, est.name, k, d, j))
                assert np.max(np.abs(got[j] - want)) <= 1e-12, (r.round_id, j)
            checked += 1
        return checked
    finally:
        store.close()


def check_blockwise_rounds_bitwise(db: str, n: int, k: int, d: int, block_size: int,
                                   value_bits: int = 32) -> int:
    """Every done round's stored estimate equals, bit for bit, the library's decode of the
    round's stored messages with ``make_estimator(..., block_size=, value_bits=)`` (quantized
    vectors rebuilt with their block scales); returns the rounds checked."""
    est = make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=block_size,
                         value_bits=value_bits)
    store = Store(db)
    try:
        clients = {cid: idx for cid, idx, _ in store.clients()}
        checked = 0
        for r in store.rounds():
            if r.state != "done":
                continue
            assert r.estimate is not None
            subs = [serde.decode_submission(s.payload) for s in store.submissions(r.round_id)]
            subs.sort(key=lambda s: clients[s.client_id])
            for sub in subs:  # what the clients sent: block scales exactly where quantized
                for v in sub.vectors:
                    assert (v.scales is not None) == (value_bits < 32)
                    assert v.scales is None or v.scales.size == est.blocks
            got = np.frombuffer(r.estimate, dtype="<f8").reshape(len(subs[0].vectors), d)
            for j in range(got.shape[0]):
                msgs = messages(subs, r.nonce, est.name, k, d, j, est.wire.scale_counts)
                assert np.array_equal(got[j], est.decode(msgs)), (r.round_id, j)
            checked += 1
        return checked
    finally:
        store.close()


def round_messages(db: str, scheme: str, k: int, d: int, j: int = 0
                   ) -> list[tuple[int, list[Any]]]:
    """``(round id, messages of vector j)`` of every done round in the database ``db``, in
    client-index order: the ``Encoded`` messages rebuilt from the committed submissions
    (client seed, values, the round's nonce), what the server decoded."""
    store = Store(db)
    try:
        clients = {cid: idx for cid, idx, _ in store.clients()}
        out = []
        for r in store.rounds():
            if r.state == "done":
                subs = [serde.decode_submission(s.payload)
                        for s in store.submissions(r.round_id)]
                subs.sort(key=lambda s: clients[s.client_id])
                out.append((r.round_id, messages(subs, r.nonce, scheme, k, d, j)))
        return out
    finally:
        store.close()


def ip(*args: str) -> None:
    """Run ``ip ARGS...`` (iproute2); raises on failure."""
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Spoke:
    """A namespace joined to the hub namespace by a veth pair (a /24 of 198.18.0.0/15)."""

    ns: str
    hub_addr: str
    addr: str


@contextmanager
def veth_star(prefix: str, spokes: int, tag: str) -> Iterator[tuple[str, list[Spoke]]]:
    """A hub namespace ``<prefix>srv`` and ``spokes`` namespaces ``<prefix>c<i>``, each joined
    to the hub by a veth pair (interfaces ``rps<tag>s<i>``/``rps<tag>c<i>``, ``tag`` at most
    8 characters) addressed from 198.18.0.0/15, the benchmarking range. Everything is
    deleted on exit, with ``/etc/netns/<ns>/`` (per-namespace ``/etc`` files such as
    ``hosts``, bind-mounted by ``ip netns exec``). Skips the test, with the reason, where
    namespaces cannot be created (not root, no ``ip``).
    """
    if shutil.which("ip") is None:
        pytest.skip("network namespaces unavailable: the 'ip' command (iproute2) is missing")
    hub = prefix + "srv"
    made: list[str] = []
    try:
        try:
            ip("netns", "add", hub)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"network namespaces unavailable: 'ip netns add' failed: "
                        f"{exc.stderr.decode().strip()}")
        made.append(hub)
        ip("-n", hub, "link", "set", "lo", "up")
        out = []
        for i in range(spokes):
            ns = f"{prefix}c{i}"
            ip("netns", "add", ns)
            made.append(ns)
            hub_if, ns_if = f"rps{tag}s{i}", f"rps{tag}c{i}"
            ip("link", "add", hub_if, "type", "veth", "peer", "name", ns_if)
            ip("link", "set", hub_if, "netns", hub)
            ip("link", "set", ns_if, "netns", ns)
            ip("-n", hub, "addr", "add", f"198.18.{i}.1/24", "dev", hub_if)
            ip("-n", ns, "addr", "add", f"198.18.{i}.2/24", "dev", ns_if)
            for where, dev in ((hub, hub_if), (ns, ns_if), (ns, "lo")):
                ip("-n", where, "link", "set", dev, "up")
            out.append(Spoke(ns, f"198.18.{i}.1", f"198.18.{i}.2"))
        yield hub, out
    finally:
        for ns in reversed(made):  # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               interval: float = 0.02) -> None:
    """Poll ``predicate`` until it is true; fails the test after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def committed_clients(db: str, round_id: int) -> set[str]:
    """Client ids with a committed submission in ``round_id``, read by a second connection."""
    import sqlite3

    conn = sqlite3.connect(db, timeout=30)
    try:
        rows = conn.execute("SELECT client_id FROM submissions WHERE round_id = ?",
                            (round_id,)).fetchall()
    finally:
        conn.close()
    return {r[0] for r in rows}


@contextmanager
def write_lock(db: str) -> Iterator[None]:
    """Hold SQLite's write lock on ``db`` from a second connection (``BEGIN IMMEDIATE``)."""
    import sqlite3

    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


@contextmanager
def joined_job(db: Path, n: int, k: int, d: int, client_timeout: float = 5.0,
               retry_budget: float | None = None, **changes: object,
               ) -> Iterator[tuple[InProcessServer, list[Any]]]:
    """An in-process job of 2 rounds on ``db`` with ``n`` joined clients ``c0``, ``c1``, ...
    (the public :class:`AggregationClient`; ``retry_budget`` None: its default)."""
    from rpsagg_client import AggregationClient

    cfg = base_config(db=str(db), n=n, k=k, d=d, rounds=2, round_timeout=60.0, **changes)
    extra = {} if retry_budget is None else {"retry_budget": retry_budget}
    with ExitStack() as stack:
        srv = stack.enter_context(in_process_server(cfg))
        clients = [stack.enter_context(AggregationClient(
            f"127.0.0.1:{srv.port}", f"c{i}", insecure=True, timeout=client_timeout, **extra))
            for i in range(n)]
        for c in clients:
            c.join()
        yield srv, clients


def encode_round(clients: Sequence[Any], d: int, seed: int) -> tuple[int, dict[str, Any]]:
    """The current round's id and every client's encoded submission of correlated vectors."""
    from rpsagg.synthetic import correlated_vectors

    rnd = clients[0].current_round()
    xs = correlated_vectors(len(clients), d, 1.0, seed=seed)
    return rnd.round_id, {c.client_id: c.encode(rnd, xs[c.index]) for c in clients}


def run_round_alone(target: str, job: str, d: int, value: float = 1.0) -> np.ndarray:
    """Run job ``job``'s current round with its one client (``c0``, a vector of ``value``
    in every coordinate); the estimate GetResult gives once it is done."""
    client = AggregationClient(target, "c0", insecure=True, job=job)
    try:
        client.join()
        rnd = client.current_round()
        client.submit(rnd, np.full(d, value))
        res = client.result(rnd.round_id, wait=True, timeout=60)
        assert res.state == "done"
        return np.asarray(res.estimate)
    finally:
        client.close()
