"""beta before the first round: computed at start-up, visibly.

A slow beta is injected by holding ``RoundEngine._compute_beta`` (the start-up computation,
in the decode thread) on a gate until the test opens it; it then computes the real beta.
While it is held: ``/readyz`` is 503 with ``beta: false``, ``/api/status`` says
``computing``, the log says so every ``BETA_LOG_EVERY`` seconds, joins and submissions are
served, and the first decode waits. Once it is released everything turns ready.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_util import base_config, in_process_server

from rpsagg_client import AggregationClient
from rpsagg_server.http import create_app
from rpsagg_server.rounds import betawarm
from rpsagg_server.rounds.engine import RoundEngine

pytestmark = pytest.mark.service

K, D = 8, 64


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Hold the start-up beta computation until the returned event is set."""
    opened = threading.Event()
    real = RoundEngine._compute_beta

    def held(self: RoundEngine) -> float:
        if not opened.wait(120):
            raise TimeoutError("the test never released beta")
        return real(self)

    monkeypatch.setattr(RoundEngine, "_compute_beta", held)
    monkeypatch.setattr(betawarm, "LOG_EVERY", 0.1)
    yield opened
    opened.set()  # never leave the decode thread blocked


@pytest.mark.timeout(180)
def test_readiness_is_false_until_beta_is_ready(gate: threading.Event,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rpsagg.server")
    n = 2
    cfg = base_config(n=n, k=K, d=D, rounds=1)
    with in_process_server(cfg) as srv, \
            TestClient(create_app(srv.running.state, CollectorRegistry())) as http:
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"] == {"database": True, "grpc": True, "beta": False}
        beta = http.get("/api/status").json()["beta"]
        assert beta["state"] == "computing" and beta["n"] == n and beta["value"] is None
        wait_for("a progress line", lambda: "still computing" in caplog.text)
        assert http.get("/api/status").json()["beta"]["elapsed_seconds"] > 0
        # joins, the round and submissions are served meanwhile; the decode waits
        clients = [AggregationClient(f"127.0.0.1:{srv.port}", f"c{i}", insecure=True)
                   for i in range(n)]
        for c in clients:
            c.join()
        rnd = clients[0].current_round()
        assert rnd.round_id == 1 and rnd.state == "open"
        for c in clients:
            c.submit(rnd, np.ones(D))
        wait_for("the round to close", lambda: clients[0].result(
            1, wait=False).state == "decoding")
        assert clients[0].result(1, wait=True, timeout=0.5).state == "decoding"
        assert http.get("/readyz").status_code == 503
        gate.set()
        assert clients[0].result(1, wait=True, timeout=60).state == "done"
        wait_for("readiness", lambda: http.get("/readyz").status_code == 200)
        beta = http.get("/api/status").json()["beta"]
        assert beta["state"] == "ready" and beta["error"] == ""
        assert beta["value"] == pytest.approx(clients[0].result(1).beta, rel=1e-12)
        for c in clients:
            c.close()
    assert f"beta for n={n}: computing" in caplog.text
    assert f"beta for n={n}: ready in" in caplog.text


def test_a_failed_beta_keeps_readiness_false_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: RoundEngine) -> float:
        raise MemoryError("injected: no memory for the Monte Carlo")

    monkeypatch.setattr(RoundEngine, "_compute_beta", broken)
    with in_process_server(base_config(n=2, k=K, d=D)) as srv, \
            TestClient(create_app(srv.running.state, CollectorRegistry())) as http:
        wait_for("the failure", lambda: http.get("/api/status").json()["beta"]["state"]
                 == "failed")
        beta = http.get("/api/status").json()["beta"]
        assert beta["error"] == "injected: no memory for the Monte Carlo"
        ready = http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["beta"] is False
