"""Hostile and unlucky inputs met by real processes: server and client subprocesses on
loopback sockets, every wait bounded and on a state (never a fixed sleep).

* ``--max-d``: a ``--d 0`` job learns d only from a join within the bound; a d above it is
  refused and fixes nothing, and honest clients join afterwards.
* Library clients joining a ``--d 0`` job at once all join (CANCELLED retried on Join).
* A client of a finished job that meets the next job (``--on-finished-job new``) exits 0.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from http_util import free_port

from rpsagg_experiments.launch import LocalJob, ServerProcess, client_command, server_command

pytestmark = pytest.mark.service


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


@pytest.mark.timeout(180)
def test_max_d_bounds_what_a_join_can_make_the_server_allocate(tmp_path: Path) -> None:
    """``--d 0 --max-d 4096``: joins naming 2^31 and 2^32 - 1 are INVALID_ARGUMENT and fix
    nothing (GetRound still says d = 0); an honest client then joins with its d, the job
    starts with it and a round completes. ``--d`` above ``--max-d`` is a one-line start-up
    error, and so is a restart on a database whose learned d is above a lowered bound."""
    import grpc

    from rpsagg_client import AggregationClient

    d, k, limit = 64, 8, 4096
    srv = _server(tmp_path, "--n", "1", "--k", str(k), "--d", "0", "--max-d", str(limit),
                  "--rounds", "1", "--linger", "-1")
    with srv, AggregationClient(srv.target, "evil", insecure=True, retry_budget=30) as evil:
        for huge in (2**31, 2**32 - 1):
            with pytest.raises(grpc.RpcError) as err:
                evil.join(d=huge)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details() == (f"d = {huge} (client 'evil') is above the "
                                           f"server's --max-d {limit}")
            assert evil.current_round().d == 0  # nothing was fixed
        with AggregationClient(srv.target, "honest", insecure=True, retry_budget=30) as c:
            assert c.join(d=d).client_index == 0
            rnd = c.current_round()
            assert rnd.d == d
            c.submit(rnd, np.ones(d))
            assert c.result(rnd.round_id, wait=True).state == "done"
    err_text = srv.proc.stderr.read().decode() if srv.proc and srv.proc.stderr else ""
    assert f"at most --max-d {limit}" in err_text
    # the bound is also a start-up check: of --d, and of a database's learned d
    for flags, line in (
        (("--d", str(limit + 1), "--max-d", str(limit), "--db", ":memory:"),
         f"rpsagg-server: --d {limit + 1} is above --max-d {limit} (the largest d this "
         "server may allocate for; raise --max-d for more)"),
        (("--d", "0", "--max-d", str(d - 1), "--db", str(tmp_path / "job.db")),
         f"rpsagg-server: --db {tmp_path / 'job.db'}: its job's d = {d} (from its first "
         f"join) is above --max-d {d - 1}"),
    ):
        out = subprocess.run(server_command([
            "--insecure", "--grpc-port", "0", "--http-port", "0", "--task", "mean",
            "--data", "external", "--k", str(k), "--n", "1", *flags]),
            capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stderr.splitlines()) == (2, [line])


@pytest.mark.timeout(240)
def test_a_client_of_a_finished_job_exits_when_it_meets_the_next_job(tmp_path: Path) -> None:
    """``--on-finished-job new``: client A (a stream on stdin) submits round 1 and then waits
    for its next line, so it is not told that the job ended; the drain bound runs out and
    the server exits. Restarted on the same database and port, the server moves the job
    aside and starts a new one (another job id in RoundInfo). A, given its next line, meets
    the new job: it exits 0 and says so, instead of waiting for rounds forever."""
    d = 8
    port = free_port()
    rng = np.random.default_rng(3)
    np.save(tmp_path / "b.npy", rng.standard_normal((2, d)))
    flags = ("--grpc-port", str(port), "--n", "2", "--min-clients", "1", "--k", "4",
             "--d", str(d), "--rounds", "2", "--round-timeout", "1", "--drain", "1",
             "--linger", "0", "--on-finished-job", "new")

    def line() -> bytes:
        return (",".join(f"{v:.6f}" for v in rng.standard_normal(d)) + "\n").encode()

    first = _server(tmp_path, *flags)
    first.start()
    a = subprocess.Popen(client_command([
        "--server", first.target, "--client-id", "a", "--insecure", "--vectors", "-"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert a.stdin is not None
        a.stdin.write(line())
        a.stdin.flush()
        b = subprocess.run(client_command([
            "--server", first.target, "--client-id", "b", "--insecure", "--vectors",
            str(tmp_path / "b.npy")]), capture_output=True, text=True, timeout=120)
        assert b.returncode == 0, b.stderr
        assert first.proc is not None
        assert first.proc.wait(timeout=60) == 0  # the drain ran out without A
        assert a.poll() is None  # A waits for its next line, not told
        (tmp_path / "port").unlink()
        second = _server(tmp_path, *flags)
        with second:
            assert second.port == port
            a.stdin.write(line())
            a.stdin.close()
            a.stdin = None  # closed here (communicate would flush it)
            _, err = a.communicate(timeout=90)
            assert a.returncode == 0, err
            assert ("rpsagg-client: the job a joined has ended; the server now runs a new job "
                    "(another job id), which this client does not join") in err.decode()
            assert "Traceback" not in err.decode()
        assert len(list((tmp_path / "job.db.jobs").glob("*.db"))) == 1  # the first job moved
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        first.stop()
