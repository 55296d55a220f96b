"""``GET /api/rounds/{id}/estimate`` over a real server (engine, SQLite store, grpc.aio on
loopback, real :class:`AggregationClient` calls), read with FastAPI's TestClient.

Every format must carry the estimate GetResult returns, bit for bit, with its provenance;
a d spanning several chunks, m = 2 vectors per round, a round that is not done, and a
restarted server (the estimates read back from the store) are covered. The service test
(``test_service_vectors.py``) fetches it over real HTTP from ``rpsagg-server``.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_util import base_config, in_process_server

from rpsagg_client import AggregationClient
from rpsagg_server.http import create_app
from rpsagg_server.http.routes_estimate import CHUNK, json_stream, provenance

pytestmark = pytest.mark.service

N, K, M = 2, 8, 2
D = 2 * CHUNK + 17  # three chunks per vector


def _fetch(http: TestClient, rid: int, fmt: str | None) -> tuple[np.ndarray, dict[str, str]]:
    res = http.get(f"/api/rounds/{rid}/estimate" + ("" if fmt is None else f"?format={fmt}"))
    assert res.status_code == 200, res.text
    if fmt == "npy":
        return np.load(io.BytesIO(res.content), allow_pickle=False), dict(res.headers)
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(res.text)))
        return np.array(rows, dtype=np.float64), dict(res.headers)
    doc = json.loads(res.text)
    return np.array(doc["estimate"], dtype=np.float64), {"doc": doc, **res.headers}


def test_every_format_is_the_estimate_bit_for_bit(tmp_path: Path) -> None:
    db = tmp_path / "job.db"
    cfg = base_config(db=str(db), n=N, k=K, d=D, rounds=2, mean_vectors=M, data="external",
                      round_timeout=60.0)
    rng = np.random.default_rng(7)
    with in_process_server(cfg) as srv:
        http = TestClient(create_app(srv.running.state, CollectorRegistry()))
        with AggregationClient(f"127.0.0.1:{srv.port}", "a", insecure=True) as a, \
                AggregationClient(f"127.0.0.1:{srv.port}", "b", insecure=True) as b:
            a.join()
            b.join()
            rnd = a.current_round()
            a.submit(rnd, rng.standard_normal((M, D)))
            # collecting: no estimate yet (409), unknown round (404)
            res = http.get(f"/api/rounds/{rnd.round_id}/estimate")
            assert res.status_code == 409
            assert "is collecting; it has no estimate until it is done" in res.json()["detail"]
            res = http.get("/api/rounds/9/estimate")
            assert res.status_code == 404 and "rounds 1..1 exist" in res.json()["detail"]
            assert http.get("/api/rounds/1/estimate?format=xml").status_code == 422
            b.submit(rnd, rng.standard_normal((M, D)))
            result = a.result(rnd.round_id, wait=True)
        assert result.state == "done" and result.estimate is not None
        want = np.asarray(result.estimate)
        assert want.shape == (M, D)
        for fmt in (None, "json", "csv", "npy"):
            got, headers = _fetch(http, rnd.round_id, fmt)
            assert got.shape == (M, D) and got.dtype == np.float64
            assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), fmt  # same bits
            assert headers["x-rpsagg-n-prime"] == "2" and headers["x-rpsagg-d"] == str(D)
            assert headers["x-rpsagg-k"] == str(K)
            assert headers["x-rpsagg-wire-bytes"] == str(result.wire_bytes)
            assert headers["x-rpsagg-m"] == str(M)
            assert headers["x-rpsagg-shape"] == f"{M},{D}"
            assert headers["x-rpsagg-projection"] == rnd.projection != ""
            assert headers["x-rpsagg-contributors"] == "a,b"
        doc = _fetch(http, rnd.round_id, "json")[1]["doc"]
        assert {k: doc[k] for k in ("round_id", "n_prime", "n", "k", "d", "m", "shape")} == {
            "round_id": rnd.round_id, "n_prime": 2, "n": N, "k": K, "d": D, "m": M,
            "shape": [M, D]}
        assert doc["scheme"] == cfg.estimator and doc["contributors"] == ["a", "b"]
        assert doc["projection"] == rnd.projection
        assert doc["bytes"] == {"wire": result.wire_bytes, "payload": result.payload_bytes}
        # streamed: no piece of the body holds more than one chunk of values
        est = srv.running.state.estimate(rnd.round_id)
        assert est is not None
        pieces = list(json_stream(provenance(est, M), est.values))
        assert len(pieces) >= M * 3  # three chunks of values per vector, besides the rest
        assert max(len(p) for p in pieces) <= CHUNK * 26  # <= 25 characters per value
    # a restarted server serves the stored estimate, unchanged
    with in_process_server(cfg) as srv:
        http = TestClient(create_app(srv.running.state, CollectorRegistry()))
        got, _ = _fetch(http, rnd.round_id, "npy")
        assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


def test_one_vector_per_round_has_shape_d(tmp_path: Path) -> None:
    cfg = base_config(n=1, k=4, d=32, rounds=1)
    with in_process_server(cfg) as srv:
        http = TestClient(create_app(srv.running.state, CollectorRegistry()))
        with AggregationClient(f"127.0.0.1:{srv.port}", "a", insecure=True) as a:
            a.join()
            rnd = a.current_round()
            a.submit(rnd, np.arange(32.0))
            result = a.result(rnd.round_id, wait=True)
        want = np.asarray(result.estimate)[0]
        for fmt in ("json", "npy"):
            got, _ = _fetch(http, rnd.round_id, fmt)
            assert got.shape == (32,) and np.array_equal(got, want)
        got, _ = _fetch(http, rnd.round_id, "csv")
        assert got.shape == (1, 32) and np.array_equal(got[0], want)  # one line per vector


def test_schemes_without_k_say_k_0(tmp_path: Path) -> None:
    """EDEN takes no k: the estimate's provenance says 0, as RoundInfo.k does, and no
    projection."""
    cfg = base_config(n=1, d=32, rounds=1, estimator="eden", bits=4, k=102)
    with in_process_server(cfg) as srv:
        http = TestClient(create_app(srv.running.state, CollectorRegistry()))
        with AggregationClient(f"127.0.0.1:{srv.port}", "a", insecure=True) as a:
            a.join()
            rnd = a.current_round()
            assert rnd.k == 0
            a.submit(rnd, np.arange(32.0))
            assert a.result(rnd.round_id, wait=True).state == "done"
        _, headers = _fetch(http, rnd.round_id, "npy")
        assert headers["x-rpsagg-k"] == "0" and headers["x-rpsagg-projection"] == ""
        assert headers["x-rpsagg-shape"] == "32" and headers["x-rpsagg-m"] == "1"
        doc = _fetch(http, rnd.round_id, "json")[1]["doc"]
        assert doc["k"] == 0 and doc["projection"] == "" and doc["shape"] == [32]
        # the dashboard's settings and rounds say 0 too (not --k)
        status = http.get("/api/status").json()
        assert status["config"]["settings"]["k"] == 0
        assert http.get(f"/api/rounds/{rnd.round_id}").json()["k"] == 0
