"""Acceptance 1: a server and 10 client processes over real gRPC on loopback, 5 rounds.

Each round's estimate must equal ``Estimator.decode`` run in this process on the same seeds
and values (<= 1e-12).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from service_util import (
    check_rounds_against_inprocess,
    client_command,
    kill_all,
    server_command,
    wait_all_exit_cleanly,
    wait_port_file,
)

N, K, D, ROUNDS = 10, 8, 128, 5


@pytest.mark.timeout(240)
def test_ten_client_processes_five_rounds(tmp_path: Path) -> None:
    db = tmp_path / "e2e.db"
    port_file = tmp_path / "port"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server = subprocess.Popen(server_command([
            "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
            "--n", str(N), "--k", str(K), "--d", str(D), "--task", "mean", "--data-r", "3",
            "--rounds", str(ROUNDS), "--round-timeout", "120", "--db", str(db), "--eval",
            "--linger", "0", "--port-file", str(port_file),
        ]), stderr=subprocess.PIPE)
        procs.append(server)
        port = wait_port_file(port_file, server)
        for i in range(N):
            procs.append(subprocess.Popen(client_command([
                "--server", f"127.0.0.1:{port}", "--client-id", f"client-{i}", "--insecure",
            ]), stderr=subprocess.PIPE))
        wait_all_exit_cleanly(server, procs[1:])
    finally:
        kill_all(procs)
    assert check_rounds_against_inprocess(str(db), N, K, D, "rand-proj-spatial") == ROUNDS
