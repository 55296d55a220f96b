"""Acceptance 3 (kill -9 and restart on the same database) and 4 (a straggler)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from service_util import base_config, in_process_server, kill_all, server_command, wait_port_file

from rpsagg import make_estimator
from rpsagg.synthetic import correlated_vectors
from rpsagg_client import AggregationClient
from rpsagg_server.decoding import messages
from rpsagg_server.state import ServerState

N, K, D = 4, 8, 128


def _server(tmp: Path, db: Path, port: int, tag: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp / f"port-{tag}"
    proc = subprocess.Popen(server_command([
        "--insecure", "--host", "127.0.0.1", "--grpc-port", str(port), "--http-port", "0",
        "--n", str(N), "--k", str(K), "--d", str(D), "--task", "mean", "--rounds", "2",
        "--round-timeout", "120", "--db", str(db), "--linger", "-1",
        "--port-file", str(port_file),
    ]), stderr=subprocess.DEVNULL)
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
