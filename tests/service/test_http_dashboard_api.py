"""The dashboard's views over a real server: relative errors, the task's progress per round,
``GET /api/clients`` (contributions, misses, bytes, stragglers), round arrivals and the CSV /
JSON downloads of every round.

Each test starts a real server (round engine, SQLite, grpc.aio on loopback) in process,
drives rounds with real :class:`AggregationClient` calls and reads the HTTP app through
FastAPI's TestClient.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_util import InProcessServer, base_config, in_process_server

from rpsagg.tasks import load_shard
from rpsagg_client import AggregationClient
from rpsagg_server.http import create_app
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_wire.v1.serde import Submission

pytestmark = pytest.mark.service

N, K, D = 3, 8, 64


@contextmanager
def live(cfg: ServerConfig, n: int = N) -> Iterator[tuple[InProcessServer, TestClient,
                                                         list[AggregationClient]]]:
    """A server, its HTTP app and ``n`` joined clients ``client-0``..."""
    with ExitStack() as stack:
        srv = stack.enter_context(in_process_server(cfg))
        http = stack.enter_context(TestClient(create_app(srv.running.state,
                                                         CollectorRegistry())))
        clients = []
        for i in range(n):
            c = AggregationClient(f"127.0.0.1:{srv.port}", f"client-{i}", insecure=True,
                                  timeout=30.0)
            stack.callback(c.close)
            c.join()
            clients.append(c)
        yield srv, http, clients


def submit(clients: list[AggregationClient], who: list[int], rng: np.random.Generator,
           ) -> tuple[int, list[Submission], np.ndarray]:
    """Clients ``who`` submit random vectors to the current round."""
    rnd = clients[0].current_round()
    xs = rng.normal(size=(len(who), rnd.m, rnd.d)) + 2.0
    subs = []
    for i, x in zip(who, xs, strict=True):
        sub = clients[i].encode(rnd, x)
        clients[i].submit_encoded(sub)
        subs.append(sub)
    return rnd.round_id, subs, xs


def poll(what: str, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    """``fn()`` once it is truthy; fails after ``timeout`` seconds (bounds the wait only)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


# -- relative errors ---------------------------------------------------------------------------
def test_relative_errors_are_the_squared_errors_over_the_true_means_norm() -> None:
    rng = np.random.default_rng(11)
    with live(base_config(n=N, k=K, d=D, rounds=2, eval=True)) as (_, http, clients):
        rid, _, xs = submit(clients, list(range(N)), rng)
        result = clients[0].result(rid, wait=True)
        r = http.get(f"/api/rounds/{rid}").json()
    truth = xs.mean(axis=0)
    norm = float(np.sum(truth ** 2))
    assert result.estimate is not None
    se, rel = r["squared_error"], r["relative_error"]
    assert se["truth_sq_norm"] == pytest.approx(norm, rel=1e-12)
    assert rel["estimate"] == pytest.approx(
        float(np.sum((result.estimate - truth) ** 2)) / norm, rel=1e-9)
    assert rel["rand_k"] == pytest.approx(result.eval_sq_error_rand_k / norm, rel=1e-12)
    assert rel["rand_k_spatial"] == pytest.approx(
        result.eval_sq_error_rand_k_spatial / norm, rel=1e-12)


def test_without_evaluation_mode_there_are_no_relative_errors_nor_task_progress() -> None:
    rng = np.random.default_rng(12)
    cfg = base_config(n=2, k=K, d=D, rounds=2, eval=False, task="power-iteration")
    with live(cfg, n=2) as (_, http, clients):
        rid, _, _ = submit(clients, [0, 1], rng)
        clients[0].result(rid, wait=True)
        r = http.get(f"/api/rounds/{rid}").json()
        st = http.get("/api/status").json()
    assert r["state"] == "done"
    assert r["relative_error"] is None and r["task_progress"] is None
    assert "evaluation mode is off" in st["task_metrics_note"]


# -- the task's progress -----------------------------------------------------------------------
def test_power_iteration_progress_matches_an_independent_eigendecomposition() -> None:
    # Synthetic power-iteration data the server loads exactly as the clients do; the test
    # checks the Rayleigh quotient averaged over the shards and the distance to the top
    # eigenvector against numpy's dense eigh of the clients' mean matrix (tests may form it).
    rng = np.random.default_rng(13)
    cfg = base_config(n=N, k=32, d=D, rounds=3, eval=True, task="power-iteration",
                      data="synthetic", data_r=1.0, seed=5)
    shards = [load_shard("synthetic", "power-iteration", i, N, D, r=1.0, seed=5)
              for i in range(N)]
    mean_cov = sum(s.x.T @ s.x / s.x.shape[0] for s in shards) / N
    lam, vecs = np.linalg.eigh(mean_cov)
    top = vecs[:, -1]
    with live(cfg) as (_, http, clients):
        states = {}
        states_before_1 = clients[0].current_round().global_state  # round 1's input
        for _ in range(3):
            rid, _, _ = submit(clients, list(range(N)), rng)
            res = clients[0].result(rid, wait=True)
            states[rid] = res.global_state  # the state after the round
        rounds = poll("task progress of the 3 rounds", lambda: [
            r for r in http.get("/api/rounds").json()["rounds"] if r["task_progress"]
        ] if all(http.get(f"/api/rounds/{i}").json()["task_progress"] for i in states)
            else None)
        status = http.get("/api/status").json()
        assert status["task_metrics_note"] == ""
    # round 0: the starting state the engine opened round 1 with, measured the same way
    start = np.asarray(states_before_1).reshape(-1)
    ts = status["task_start"]
    cos0 = abs(float(top @ start)) / float(np.linalg.norm(start))
    assert ts["eigenvector_distance"] == pytest.approx(np.sqrt(1 - cos0 ** 2), abs=1e-6)
    assert ts["value"] == pytest.approx(
        np.mean([float((s.x @ start) @ (s.x @ start)) / s.x.shape[0] for s in shards]),
        rel=1e-9)
    for r in rounds:
        v = np.asarray(states[r["round_id"]]).reshape(-1)
        tp = r["task_progress"]
        rayleigh = np.mean([float((s.x @ v) @ (s.x @ v)) / s.x.shape[0] for s in shards])
        assert tp["name"] == "Rayleigh quotient"
        assert tp["value"] == pytest.approx(rayleigh, rel=1e-9)
        assert tp["optimum"] == pytest.approx(lam[-1], rel=1e-8)
        cos = abs(float(top @ v)) / float(np.linalg.norm(v))
        assert tp["eigenvector_distance"] == pytest.approx(np.sqrt(1 - cos ** 2), abs=1e-6)
        assert tp["value"] <= tp["optimum"] * (1 + 1e-9)


def test_task_progress_without_the_data_says_why(tmp_path: Path) -> None:
    # Fashion-MNIST at a path that does not exist on the server: no metric, a clear note,
    # and the rounds themselves are unaffected.
    rng = np.random.default_rng(14)
    cfg = base_config(n=2, k=K, d=1024, rounds=2, eval=True, task="power-iteration",
                      data="fashion-mnist")
    import rpsagg.tasks.data as data

    saved = data.FASHION_DIR
    data.FASHION_DIR = tmp_path / "absent"
    try:
        with live(cfg, n=2) as (_, http, clients):
            rid, _, _ = submit(clients, [0, 1], rng)
            clients[0].result(rid, wait=True)
            note = poll("the note", lambda: "cannot load" in (
                n := http.get("/api/status").json()["task_metrics_note"]) and n)
            r = http.get(f"/api/rounds/{rid}").json()
    finally:
        data.FASHION_DIR = saved
    assert "Fashion-MNIST not found" in note
    assert r["state"] == "done" and r["task_progress"] is None


# -- clients -----------------------------------------------------------------------------------
def test_clients_view_counts_contributions_misses_bytes_and_flags_stragglers(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(15)
    db = str(tmp_path / "server.db")
    cfg = base_config(n=N, k=K, d=D, rounds=3, eval=True, min_clients=2, round_timeout=0.5,
                      db=db)
    with live(cfg) as (_, http, clients):
        # round 1: client-2 never submits; the round decodes at its deadline without it
        rid1, subs1, _ = submit(clients, [0, 1], rng)
        assert clients[0].result(rid1, wait=True).state == "done"
        after1 = {c["client_id"]: c for c in http.get("/api/clients").json()}
        detail1 = http.get(f"/api/rounds/{rid1}").json()
        # round 2: everyone
        rid2, subs2, _ = submit(clients, [0, 1, 2], rng)
        assert clients[0].result(rid2, wait=True).state == "done"
        after2 = {c["client_id"]: c for c in http.get("/api/clients").json()}
        detail = http.get(f"/api/rounds/{rid2}").json()
    # wire bytes are measured by the server (serialized request less the eval references);
    # each arrival's must add up to the round's total, which the engine counts separately
    wire1 = {a["client_id"]: a["wire_bytes"] for a in detail1["arrivals"]}
    assert sum(wire1.values()) == detail1["bytes"]["wire"]
    assert list(after1) == ["client-0", "client-1", "client-2"]
    assert [c["index"] for c in after1.values()] == [0, 1, 2]
    for i in (0, 1):
        c = after1[f"client-{i}"]
        assert (c["rounds_contributed"], c["rounds_missed"], c["straggler"]) == (1, 0, False)
        assert c["bytes_sent"] == wire1[f"client-{i}"] > subs1[i].payload_bytes
        assert c["payload_bytes_sent"] == subs1[i].payload_bytes
        assert c["last_seen"] >= c["joined_at"]
    lag = after1["client-2"]
    assert (lag["rounds_contributed"], lag["rounds_missed"], lag["straggler"]) == (0, 1, True)
    assert lag["bytes_sent"] == 0 and lag["last_seen"] == lag["joined_at"]
    # after round 2 nobody is a straggler; client-2's miss stays counted
    lag = after2["client-2"]
    assert (lag["rounds_contributed"], lag["rounds_missed"], lag["straggler"]) == (1, 1, False)
    wire2 = {a["client_id"]: a["wire_bytes"] for a in detail["arrivals"]}
    assert lag["bytes_sent"] == wire2["client-2"]
    assert lag["payload_bytes_sent"] == subs2[2].payload_bytes
    assert after2["client-0"]["bytes_sent"] == wire1["client-0"] + wire2["client-0"]
    assert after2["client-0"]["last_seen"] > after1["client-0"]["last_seen"]
    # the round detail lists each arrival with its time and bytes
    arrivals = detail["arrivals"]
    assert [a["client_id"] for a in arrivals] == ["client-0", "client-1", "client-2"]
    assert [a["payload_bytes"] for a in arrivals] == [s.payload_bytes for s in subs2]
    assert sum(a["wire_bytes"] for a in arrivals) == detail["bytes"]["wire"]
    ts = detail["timestamps"]
    # received_at is when the request reached the server (the deadline counts arrivals);
    # first_submission is when the round's first write committed, so it is no earlier
    assert all(a["received_at"] <= ts["closed"] for a in arrivals)
    assert min(a["received_at"] for a in arrivals) <= ts["first_submission"]

    # A restart on the same database: the figures are rebuilt from the stored rounds.
    with live(cfg, n=0) as (_, http, _):
        again = {c["client_id"]: c for c in http.get("/api/clients").json()}
    assert again == after2


# -- downloads ---------------------------------------------------------------------------------
def test_csv_and_json_downloads_hold_every_round_as_the_api_shows_it() -> None:
    rng = np.random.default_rng(16)
    with live(base_config(n=N, k=K, d=D, rounds=3, eval=True)) as (_, http, clients):
        for _ in range(2):
            rid, _, _ = submit(clients, list(range(N)), rng)
            clients[0].result(rid, wait=True)
        submit(clients, [0], rng)  # round 3 collecting
        js = http.get("/api/rounds/export.json")
        cs = http.get("/api/rounds/export.csv")
        api = [http.get(f"/api/rounds/{i}").json() for i in (1, 2, 3)]
    assert js.status_code == 200 and cs.status_code == 200
    assert js.headers["content-disposition"] == 'attachment; filename="rpsagg-rounds.json"'
    assert cs.headers["content-disposition"] == 'attachment; filename="rpsagg-rounds.csv"'
    assert cs.headers["content-type"].startswith("text/csv")
    assert js.json() == api
    rows = list(csv.DictReader(io.StringIO(cs.text)))
    assert [int(r["round_id"]) for r in rows] == [1, 2, 3]
    assert [r["state"] for r in rows] == ["done", "done", "collecting"]
    for row, r in zip(rows, api, strict=True):
        assert int(row["bytes_wire"]) == r["bytes"]["wire"]
        assert row["clients_arrived"].split() == r["clients"]["arrived"]
        if r["state"] == "done":
            assert float(row["sq_error"]) == r["squared_error"]["estimate"]
            assert float(row["relative_error"]) == r["relative_error"]["estimate"]
            assert float(row["beta"]) == r["beta"]
        else:
            assert row["sq_error"] == row["relative_error"] == row["beta"] == ""


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised() -> None:
    # OWASP CSV injection: text starting with = + - @ tab CR gets a leading quote; numbers
    # (negative ones too) stay numbers, as a number cell is never a formula.
    from rpsagg_server.http.routes_export import spreadsheet_safe

    for text in ("=1+2", "+1", "-2", "@SUM(A1)", "\tx", "\rx", "-cmd|' /C calc'!A0"):
        assert spreadsheet_safe(text) == "'" + text
    for same in ("client-0", "done", "a=b", "", " -1"):
        assert spreadsheet_safe(same) == same
    for number in (-0.5, -3, 0, 2.5e-7, float("-inf")):
        assert spreadsheet_safe(number) == number
    # client ids are the clients' choice ([A-Za-z0-9._-]): one starting with '-' reaches
    # the clients_arrived cell, first of the list
    rng = np.random.default_rng(17)
    cfg = base_config(n=2, k=K, d=D, rounds=1)
    with ExitStack() as stack:
        srv = stack.enter_context(in_process_server(cfg))
        http = stack.enter_context(TestClient(create_app(srv.running.state,
                                                         CollectorRegistry())))
        clients = []
        for cid in ("-2-cmd", "client-1"):
            c = AggregationClient(f"127.0.0.1:{srv.port}", cid, insecure=True, timeout=30.0)
            stack.callback(c.close)
            c.join()
            clients.append(c)
        rid, _, _ = submit(clients, [0, 1], rng)
        clients[0].result(rid, wait=True)
        text = http.get("/api/rounds/export.csv").text
    row = next(csv.DictReader(io.StringIO(text)))
    assert row["clients_arrived"] == "'-2-cmd client-1"
    assert float(row["bytes_wire"]) > 0 and not row["decode_seconds"].startswith("'")


# -- start-up ----------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_the_dashboard_answers_as_soon_as_the_port_file_appears(tmp_path: Path) -> None:
    # The port file means "serving"; tests and ./run.sh open the dashboard right after it
    # appears. It used to be written before uvicorn had bound its socket (the browser test
    # then failed now and then with ERR_CONNECTION_REFUSED). One GET, no retry.
    import json
    import socket
    import subprocess
    import urllib.request

    from service_util import kill_all, server_command, wait_port_file

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    port_file = tmp_path / "port"
    server = subprocess.Popen(server_command([
        "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port",
        str(http_port), "--n", "2", "--k", "8", "--d", "64", "--task", "mean", "--db",
        str(tmp_path / "s.db"), "--linger", "-1", "--port-file", str(port_file),
    ]), stderr=subprocess.PIPE)
    try:
        wait_port_file(port_file, server)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10) as r:
            assert json.load(r) == {"status": "ok"}
    finally:
        kill_all([server])
