"""Acceptance 2: server and clients in different network namespaces joined by veth pairs.

The server runs in its own namespace; two client namespaces (two clients each) reach it
over real TCP across veth pairs addressed from 198.18.0.0/15 (the benchmarking range),
inside namespaces this test creates (``rpsagg-test-<pid>-*``) and always deletes.
Skipped, with the reason, where network namespaces cannot be created (not root, no ``ip``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_util import (
    check_rounds_against_inprocess,
    client_command,
    kill_all,
    server_command,
    veth_star,
    wait_all_exit_cleanly,
    wait_port_file,
)

pytestmark = pytest.mark.service

N, K, D, ROUNDS, CLIENT_NS = 4, 8, 128, 3, 2
PREFIX = f"rpsagg-test-{os.getpid()}-"


@pytest.fixture
def namespaces() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """The server namespace and ``(client namespace, server address)`` pairs."""
    with veth_star(PREFIX, CLIENT_NS, str(os.getpid() % 100000)) as (server_ns, spokes):
        yield server_ns, [(s.ns, s.hub_addr) for s in spokes]


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
        wait_all_exit_cleanly(server, procs[1:])
    finally:
        kill_all(procs)
    assert check_rounds_against_inprocess(str(db), N, K, D, "rand-proj-spatial") == ROUNDS
