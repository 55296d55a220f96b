"""Faults of a running job: kill -9 and restart on the same database, a straggler, and a
server stalled by SIGSTOP past a deadline (it still counts what reached it before).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from service_util import (
    base_config,
    committed_clients,
    in_process_server,
    kill_all,
    server_command,
    wait_port_file,
    wait_until,
)

from rpsagg import make_estimator
from rpsagg.synthetic import correlated_vectors
from rpsagg_client import AggregationClient
from rpsagg_server.decode.decoding import messages
from rpsagg_server.readmodel.state import ServerState

pytestmark = pytest.mark.service

N, K, D = 4, 8, 128


def _server(tmp: Path, db: Path, port: int, tag: str,
            *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp / f"port-{tag}"
    proc = subprocess.Popen(server_command([
        "--insecure", "--host", "127.0.0.1", "--grpc-port", str(port), "--http-port", "0",
        "--n", str(N), "--k", str(K), "--d", str(D), "--task", "mean", "--rounds", "2",
        "--round-timeout", "120", "--db", str(db), "--linger", "-1",
        "--port-file", str(port_file), *extra,
    ]), stderr=open(tmp / f"stderr-{tag}", "wb"))  # noqa: SIM115
    return proc, wait_port_file(port_file, proc)


@pytest.mark.timeout(180)
def test_kill_9_after_acks_then_restart_completes_round(tmp_path: Path) -> None:
    db = tmp_path / "fault.db"
    xs = correlated_vectors(N, D, 1.5, seed=7)
    procs: list[subprocess.Popen[bytes]] = []
    clients = []
    try:
        first, port = _server(tmp_path, db, 0, "a")
        procs.append(first)
        target = f"127.0.0.1:{port}"
        clients = [AggregationClient(target, f"c{i}", insecure=True, timeout=5, retry_budget=60)
                   for i in range(N)]
        for c in clients:
            c.join()
        rnd = clients[0].current_round()
        acked = {}
        for c in clients[:2]:  # two acks, then the server dies mid-round
            sub = c.encode(rnd, xs[c.index])
            assert not c.submit_encoded(sub).duplicate
            acked[c.client_id] = sub
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)

        second, port2 = _server(tmp_path, db, port, "b")
        procs.append(second)
        assert port2 == port
        again = clients[0].current_round()
        assert (again.round_id, again.nonce, again.state) == (rnd.round_id, rnd.nonce,
                                                             "collecting")
        # an acked submission survived: its byte-identical retry is acknowledged again
        assert clients[0].submit_encoded(acked["c0"]).duplicate
        for c in clients[2:]:
            c.submit(again, xs[c.index])
        res = clients[0].result(rnd.round_id, wait=True, timeout=60)
        assert res.state == "done" and res.n_prime == N
        seeds = {c.client_id: c.client_seed for c in res.contributors}
        for cid, sub in acked.items():
            assert seeds[cid] == sub.client_seed
        # the same estimate an uninterrupted run decodes from these seeds and values
        x_all = [xs[c.index] for c in clients]
        subs = [c.encode(rnd, x, client_seed=seeds[c.client_id]) for c, x in zip(
            clients, x_all, strict=True)]
        subs.sort(key=lambda s: next(c.index for c in clients if c.client_id == s.client_id))
        want = make_estimator("rand-proj-spatial", n=N, k=K, d=D).decode(
            messages(subs, rnd.nonce, "rand-proj-spatial", K, D, 0))
        assert res.estimate is not None
        np.testing.assert_allclose(res.estimate[0], want, rtol=0, atol=1e-12)
    finally:
        for c in clients:
            c.close()
        kill_all(procs)


@pytest.mark.timeout(120)
def test_straggler_round_closes_at_deadline_with_n_minus_1() -> None:
    cfg = replace(base_config(), n=N, round_timeout=1.0, min_clients=2, rounds=1)
    xs = correlated_vectors(N, D, 0.5, seed=3)
    with in_process_server(cfg) as srv:
        target = f"127.0.0.1:{srv.port}"
        clients = [AggregationClient(target, f"c{i}", insecure=True) for i in range(N)]
        try:
            for c in clients:
                c.join()
            rnd = clients[0].current_round()
            subs = []
            for c in clients[:-1]:  # the last client never submits
                sub = c.encode(rnd, xs[c.index])
                c.submit_encoded(sub)
                subs.append(sub)
            res = clients[0].result(rnd.round_id, wait=True, timeout=30)
            assert res.state == "done"
            assert res.n_prime == N - 1
            assert {c.client_id for c in res.contributors} == {"c0", "c1", "c2"}
            est = make_estimator("rand-proj-spatial", n=N, k=K, d=D)
            want = est.decode(messages(subs, rnd.nonce, "rand-proj-spatial", K, D, 0))
            assert res.estimate is not None
            np.testing.assert_allclose(res.estimate[0], want, rtol=0, atol=1e-12)
            assert res.beta == pytest.approx(est.beta_for(N - 1))
            state: ServerState = srv.running.state
            view = state.round_detail(rnd.round_id)
            assert view is not None and view.clients_missing == ("c3",)
            # late submission after the close is refused
            with pytest.raises(grpc.RpcError) as info:
                clients[-1].submit(rnd, xs[-1])
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            for c in clients:
                c.close()


@pytest.mark.timeout(180)
def test_sigstop_past_deadline_counts_submissions_that_arrived_before(tmp_path: Path) -> None:
    """Item 10: the server is stopped (SIGSTOP) right after the first ack, two clients send
    while it is stopped (well before the 2 s deadline), and it resumes (SIGCONT) 2 s after
    the deadline. Their requests reached the server before the deadline, so they count:
    acked, committed, and in the decode (today: refused as closed).
    """
    db = tmp_path / "stall.db"
    proc, port = _server(tmp_path, db, 0, "s", "--round-timeout", "2", "--min-clients", "1")
    xs = correlated_vectors(N, D, 1.0, seed=11)
    clients = []
    try:
        clients = [AggregationClient(f"127.0.0.1:{port}", f"c{i}", insecure=True, timeout=30,
                                     retry_budget=60) for i in range(N)]
        for c in clients:
            c.join()
        rnd = clients[0].current_round()
        subs = {c.client_id: c.encode(rnd, xs[c.index]) for c in clients}
        clients[0].submit_encoded(subs["c0"])
        deadline = clients[0].current_round().deadline_unix_ms / 1000
        os.kill(proc.pid, signal.SIGSTOP)
        acks: dict[str, bool] = {}
        sent: dict[str, float] = {}

        def send(c: AggregationClient) -> None:
            sent[c.client_id] = time.time()
            acks[c.client_id] = c.submit_encoded(subs[c.client_id]).duplicate

        threads = [threading.Thread(target=send, args=(c,)) for c in clients[1:3]]
        for t in threads:
            t.start()
        time.sleep(max(0.0, deadline + 2.0 - time.time()))  # the fault: stopped 2 s past it
        os.kill(proc.pid, signal.SIGCONT)
        for t in threads:
            t.join(60)
        # sent (and, on loopback, in the server's socket buffers) well before the deadline
        assert all(sent[c] < deadline - 0.5 for c in ("c1", "c2")), (sent, deadline)
        assert acks == {"c1": False, "c2": False}
        res = clients[0].result(rnd.round_id, wait=True, timeout=60)
        assert res.state == "done", res.reason
        in_db = committed_clients(str(db), rnd.round_id)
        assert in_db == {"c0", "c1", "c2"}
        assert {c.client_id for c in res.contributors} == in_db and res.n_prime == 3
        # a submission after the close is refused; new work is accepted
        with pytest.raises(grpc.RpcError) as info:
            clients[3].submit_encoded(subs["c3"])
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        nxt = clients[0].current_round()
        assert nxt.round_id == rnd.round_id + 1
        for c in clients:
            c.submit(nxt, xs[c.index])
        res2 = clients[0].result(nxt.round_id, wait=True, timeout=60)
        assert res2.state == "done" and res2.n_prime == N
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        for c in clients:
            c.close()
        kill_all([proc])


@pytest.mark.timeout(180)
def test_kill_9_mid_stream_loses_no_ack(tmp_path: Path) -> None:
    """Acked means durable: 4 clients submit concurrently, the server is killed (-9) as
    soon as the first ack arrives; every ack in the client-side ledger is in the database,
    after the restart each committed submission (acked or not) is acknowledged again as a
    duplicate (its round resumed with the same nonce), and the round completes with them.
    """
    db = tmp_path / "ledger.db"
    first, port = _server(tmp_path, db, 0, "a")
    xs = correlated_vectors(N, D, 1.0, seed=12)
    procs = [first]
    clients = []
    try:
        clients = [AggregationClient(f"127.0.0.1:{port}", f"c{i}", insecure=True, timeout=5,
                                     retry_budget=0) for i in range(N)]
        for c in clients:
            c.join()
        rnd = clients[0].current_round()
        subs = {c.client_id: c.encode(rnd, xs[c.index]) for c in clients}
        ledger: set[str] = set()
        go = threading.Barrier(N + 1)

        def send(c: AggregationClient) -> None:
            go.wait()
            try:
                c.submit_encoded(subs[c.client_id])
                ledger.add(c.client_id)
            except grpc.RpcError:
                pass  # cut off by the kill: not acked

        threads = [threading.Thread(target=send, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        go.wait()
        wait_until(lambda: ledger, 30, "a first ack")
        os.kill(first.pid, signal.SIGKILL)  # the fault: kill -9 right after the first ack
        first.wait(10)
        for t in threads:
            t.join(30)
        committed = committed_clients(str(db), rnd.round_id)
        assert ledger <= committed  # zero acked submissions lost
        second, _ = _server(tmp_path, db, port, "b")
        procs.append(second)
        for c in clients:
            c.timeout, c.retry_budget = 5, 60
        for c in clients:  # committed -> duplicate; the rest are committed now
            assert c.submit_encoded(subs[c.client_id]).duplicate == (c.client_id in committed)
        res = clients[0].result(rnd.round_id, wait=True, timeout=60)
        assert res.state == "done" and res.n_prime == N
        assert {c.client_id for c in res.contributors} == committed_clients(str(db),
                                                                            rnd.round_id)
    finally:
        for c in clients:
            c.close()
        kill_all(procs)


@pytest.mark.timeout(120)
def test_kill_9_keeps_the_open_round_and_its_nonce(tmp_path: Path) -> None:
    """A round's row is durable before any client sees its nonce, so a submission encoded
    for it (and possibly committed just before a crash) still belongs to the resumed round.
    """
    db = tmp_path / "nonce.db"
    first, port = _server(tmp_path, db, 0, "a")
    procs = [first]
    try:
        with AggregationClient(f"127.0.0.1:{port}", "c0", insecure=True, timeout=5,
                               retry_budget=60) as c0:
            c0.join()
            rnd = c0.current_round()
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            second, _ = _server(tmp_path, db, port, "b")
            procs.append(second)
            again = c0.current_round()
            assert (again.round_id, again.nonce, again.state) == (rnd.round_id, rnd.nonce,
                                                                 "open")
            sub = c0.encode(rnd, np.ones(D))
            assert not c0.submit_encoded(sub).duplicate
            assert committed_clients(str(db), rnd.round_id) == {"c0"}
    finally:
        kill_all(procs)
