"""Hostile and unlucky inputs met by real processes: server and client subprocesses on
loopback sockets, every wait bounded and on a state (never a fixed sleep).

* Library clients joining a ``--d 0`` job at once all join (CANCELLED retried on Join).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from rpsagg_server.launch import LocalJob, ServerProcess


def _server(tmp_path: Path, *flags: str, db: str = "job.db") -> ServerProcess:
    return ServerProcess([
        "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
        "--task", "mean", "--data", "external", "--db", str(tmp_path / db), *flags,
    ], tmp_path / "port", stderr=subprocess.PIPE)


@pytest.mark.timeout(180)
def test_library_clients_joining_a_d0_job_at_once_all_join(tmp_path: Path) -> None:
    """20 ``AggregationClient.join`` calls at once on a ``--d 0`` job: the stand-in that
    waits for d stops with some of them in flight (CANCELLED), and the client retries
    them: all 20 join, with 20 distinct indices."""
    from rpsagg_client import AggregationClient

    n, d = 20, 64
    job = LocalJob(_server(tmp_path, "--n", str(n), "--k", "8", "--d", "0", "--rounds", "1",
                           "--linger", "-1"))
    with job:
        start = threading.Barrier(n)
        indices: dict[str, int] = {}
        errors: list[BaseException] = []

        def one(i: int) -> None:
            with AggregationClient(job.target, f"c{i}", insecure=True, retry_budget=60) as c:
                start.wait(timeout=30)
                try:
                    indices[f"c{i}"] = c.join(d=d).client_index
                except BaseException as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, [repr(e) for e in errors]
        assert sorted(indices.values()) == list(range(n))
