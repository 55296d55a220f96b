"""Acceptance 2: server and clients in different network namespaces joined by veth pairs.

The server runs in its own namespace; two client namespaces (two clients each) reach it
over real TCP across veth pairs addressed from 198.18.0.0/15 (the benchmarking range),
inside namespaces this test creates (``rpsagg-test-<pid>-*``) and always deletes.
Skipped, with the reason, where network namespaces cannot be created (not root, no ``ip``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_util import (
    check_rounds_against_inprocess,
    client_command,
    kill_all,
    server_command,
    wait_port_file,
)

N, K, D, ROUNDS, CLIENT_NS = 4, 8, 128, 3, 2
PREFIX = f"rpsagg-test-{os.getpid()}-"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """The server namespace and ``(client namespace, server address)`` pairs."""
    if shutil.which("ip") is None:
        pytest.skip("network namespaces unavailable: the 'ip' command (iproute2) is missing")
    server_ns = PREFIX + "srv"
    made: list[str] = []
    try:
        try:
            _ip("netns", "add", server_ns)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"network namespaces unavailable: 'ip netns add' failed: "
                        f"{exc.stderr.decode().strip()}")
        made.append(server_ns)
        _ip("-n", server_ns, "link", "set", "lo", "up")
        pairs = []
        tag = os.getpid() % 100000
        for i in range(CLIENT_NS):
            ns = f"{PREFIX}c{i}"
            _ip("netns", "add", ns)
            made.append(ns)
            srv_if, cli_if = f"rps{tag}s{i}", f"rps{tag}c{i}"
            _ip("link", "add", srv_if, "type", "veth", "peer", "name", cli_if)
            _ip("link", "set", srv_if, "netns", server_ns)
            _ip("link", "set", cli_if, "netns", ns)
            _ip("-n", server_ns, "addr", "add", f"198.18.{i}.1/24", "dev", srv_if)
            _ip("-n", ns, "addr", "add", f"198.18.{i}.2/24", "dev", cli_if)
            for where, dev in ((server_ns, srv_if), (ns, cli_if), (ns, "lo")):
                _ip("-n", where, "link", "set", dev, "up")
            pairs.append((ns, f"198.18.{i}.1"))
        yield server_ns, pairs
    finally:
        for ns in reversed(made):  # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.mark.timeout(240)
def test_clients_in_other_namespaces_over_veth(
    namespaces: tuple[str, list[tuple[str, str]]], tmp_path: Path
) -> None:
    server_ns, pairs = namespaces
    db = tmp_path / "netns.db"
    port_file = tmp_path / "port"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server = subprocess.Popen(["ip", "netns", "exec", server_ns, *server_command([
            "--insecure", "--host", "0.0.0.0", "--grpc-port", "0", "--http-port", "0",
            "--n", str(N), "--k", str(K), "--d", str(D), "--task", "mean", "--data-r", "1",
            "--rounds", str(ROUNDS), "--round-timeout", "120", "--db", str(db),
            "--linger", "2", "--port-file", str(port_file),
        ])], stderr=subprocess.PIPE)
        procs.append(server)
        port = wait_port_file(port_file, server)
        for i in range(N):
            ns, addr = pairs[i % len(pairs)]
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *client_command([
                "--server", f"{addr}:{port}", "--client-id", f"ns-client-{i}", "--insecure",
            ])], stderr=subprocess.PIPE))
        for p in procs[1:]:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err.decode()
        _, err = server.communicate(timeout=60)
        assert server.returncode == 0, err.decode()[-2000:]
    finally:
        kill_all(procs)
    assert check_rounds_against_inprocess(str(db), N, K, D, "rand-proj-spatial") == ROUNDS
