"""Every done round carries the error estimated from its messages, in every mode and through
every interface: ``/api/rounds/{id}``, ``/api/status``, the exports, ``/metrics``,
``RoundResult`` (GetResult), the ``RoundEvent`` stream, ``rpsagg-client result``; the values
are the library's decode of the same stored messages, and a restart keeps them."""

from __future__ import annotations

import csv
import io
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from service_util import base_config, in_process_server, round_messages, wait_until

import rpsagg
from rpsagg_client import AggregationClient
from rpsagg_client.cli import main as client_main
from rpsagg_server.http import create_app
from rpsagg_server.readmodel.views import EstimatedError
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_wire.v1.serde import RoundEvent, RoundResult

pytestmark = pytest.mark.service

N, K, D, ROUNDS = 4, 32, 128, 2


def library_estimates(cfg: ServerConfig) -> dict[int, Any]:
    """Round id -> the library's ErrorEstimate of a decode of the round's stored messages."""
    est = rpsagg.make_estimator(cfg.estimator, n=cfg.n, k=cfg.k, d=cfg.d,
                                transform=cfg.transform)
    out = {rid: est.decode_with_info(msgs).error_estimate
           for rid, msgs in round_messages(cfg.db, est.name, cfg.k, cfg.d)}
    assert sorted(out) == list(range(1, ROUNDS + 1))
    return out


def close(got: float | None, want: float) -> bool:
    """``got`` (None or NaN where not defined: the API's null) is ``want``. The estimate of
    ||x_bar||^2 can come out <= 0 by chance (the client seeds are random), and the relative
    error is then undefined."""
    if not math.isfinite(want):
        return got is None or math.isnan(got)
    assert got is not None
    return got == pytest.approx(want, rel=1e-9, abs=1e-12)


def check_api(est: dict[str, Any] | None, want: Any) -> None:
    """An API ``error_estimate`` against the library's ErrorEstimate."""
    assert est is not None
    for f in ("squared_error", "squared_error_stderr", "mean_norm_squared", "relative_error",
              "relative_error_stderr"):
        assert close(est[f], getattr(want, f)), f
    assert est["method"] == want.method


def check_result(res: RoundResult | RoundEvent, want: Any) -> None:
    assert close(res.est_sq_error, want.squared_error)
    assert close(res.est_sq_error_stderr, want.squared_error_stderr)
    assert close(res.est_mean_sq_norm, want.mean_norm_squared)
    assert close(res.est_relative_error, want.relative_error)


def run_job(cfg: ServerConfig, seed: int) -> Iterator[tuple[Any, TestClient, list[RoundEvent]]]:
    """A job of ROUNDS rounds of correlated vectors run to its end, with a WatchRounds
    stream that saw every transition; yields the server, its HTTP app and the events."""
    rng = np.random.default_rng(seed)
    with in_process_server(cfg) as srv:
        app = create_app(srv.running.state, CollectorRegistry())
        target = f"127.0.0.1:{srv.port}"
        clients = [AggregationClient(target, f"client-{i}", insecure=True, timeout=30.0)
                   for i in range(cfg.n)]
        events: list[RoundEvent] = []
        with AggregationClient(target, "watcher", insecure=True, timeout=30.0) as watcher:
            def watch() -> None:
                for ev in watcher.watch():
                    events.append(ev)
                    if ev.job_done:
                        return

            thread = threading.Thread(target=watch, daemon=True)
            thread.start()
            wait_until(lambda: events, 30, "the watch stream's first event")
            try:
                for c in clients:
                    c.join()
                for _ in range(cfg.rounds):
                    rnd = clients[0].current_round()
                    base = rng.normal(size=cfg.d)
                    for c in clients:
                        x = base + 0.5 * rng.normal(size=(rnd.m, cfg.d))
                        c.submit_encoded(c.encode(rnd, x))
                    assert clients[0].result(rnd.round_id, wait=True).state == "done"
                thread.join(30)
                assert not thread.is_alive(), "the watch stream did not end with the job"
                with TestClient(app) as http:
                    yield srv, http, events
            finally:
                for c in clients:
                    c.close()


@pytest.mark.timeout(120)
def test_every_interface_carries_the_estimate_of_the_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = base_config(n=N, k=K, d=D, rounds=ROUNDS, eval=False, db=str(tmp_path / "job.db"))
    for srv, http, events in run_job(cfg, seed=3):
        want = library_estimates(cfg)
        for rid, w in want.items():
            assert w is not None and math.isfinite(w.squared_error)
            body = http.get(f"/api/rounds/{rid}").json()
            assert body["squared_error"] is None  # no evaluation: nothing measured
            check_api(body["error_estimate"], w)
        status = http.get("/api/status").json()
        check_api(status["latest_round"]["error_estimate"], want[ROUNDS])
        exported = http.get("/api/rounds/export.json").json()
        assert [r["round_id"] for r in exported] == list(range(1, ROUNDS + 1))
        for r in exported:
            check_api(r["error_estimate"], want[r["round_id"]])
        rows = list(csv.DictReader(io.StringIO(http.get("/api/rounds/export.csv").text)))
        for row in rows:
            w = want[int(row["round_id"])]
            for col, f in (("est_sq_error", "squared_error"),
                           ("est_sq_error_stderr", "squared_error_stderr"),
                           ("est_mean_sq_norm", "mean_norm_squared"),
                           ("est_relative_error", "relative_error"),
                           ("est_relative_error_stderr", "relative_error_stderr")):
                assert close(float(row[col]) if row[col] else None, getattr(w, f)), col
        metrics = {s.name: s.value
                   for fam in text_string_to_metric_families(http.get("/metrics").text)
                   for s in fam.samples if s.name.startswith("rpsagg_round_estimated")}
        assert close(metrics["rpsagg_round_estimated_squared_error"],
                     want[ROUNDS].squared_error)
        assert close(metrics["rpsagg_round_estimated_squared_error_stderr"],
                     want[ROUNDS].squared_error_stderr)
        assert close(metrics["rpsagg_round_estimated_relative_error"],
                     want[ROUNDS].relative_error)
        with AggregationClient(f"127.0.0.1:{srv.port}", "reader", insecure=True) as reader:
            for rid, w in want.items():
                check_result(reader.result(rid, wait=False), w)
        done = {ev.round_id: ev for ev in events if ev.state == "done" and ev.round_id}
        assert sorted(done) == list(range(1, ROUNDS + 1))
        for rid, ev in done.items():
            check_result(ev, want[rid])
        others = [ev for ev in events if ev.state != "done"]
        assert others and all(math.isnan(ev.est_sq_error) for ev in others)
        capsys.readouterr()
        out = tmp_path / "est.npy"
        assert client_main(["result", "--server", f"127.0.0.1:{srv.port}", "--insecure",
                            "--round", "1", "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        w = want[1]
        line = (f"estimated relative error {w.relative_error:.4g} +- "
                f"{w.relative_error_stderr:.2g}" if math.isfinite(w.relative_error) else
                f"estimated squared error {w.squared_error:.4g} +- "
                f"{w.squared_error_stderr:.2g}")
        assert line in printed, printed


@pytest.mark.timeout(120)
def test_a_restart_keeps_every_rounds_estimate(tmp_path: Path) -> None:
    cfg = base_config(n=N, k=K, d=D, rounds=ROUNDS, eval=False, db=str(tmp_path / "job.db"))
    before: dict[int, Any] = {}
    for _, http, _ in run_job(cfg, seed=5):
        before = {rid: http.get(f"/api/rounds/{rid}").json()["error_estimate"]
                  for rid in range(1, ROUNDS + 1)}
    want = library_estimates(cfg)
    with in_process_server(cfg) as srv:
        with TestClient(create_app(srv.running.state, CollectorRegistry())) as http:
            for rid, w in want.items():
                after = http.get(f"/api/rounds/{rid}").json()["error_estimate"]
                assert after == before[rid]
                check_api(after, w)
        with AggregationClient(f"127.0.0.1:{srv.port}", "reader", insecure=True) as reader:
            for rid, w in want.items():
                check_result(reader.result(rid, wait=False), w)


@pytest.mark.timeout(120)
def test_evaluation_shows_the_estimate_beside_the_measured_error(tmp_path: Path) -> None:
    cfg = base_config(n=N, k=K, d=D, rounds=ROUNDS, eval=True, db=str(tmp_path / "job.db"))
    for _, http, _ in run_job(cfg, seed=7):
        want = library_estimates(cfg)
        for rid, w in want.items():
            body = http.get(f"/api/rounds/{rid}").json()
            check_api(body["error_estimate"], w)
            measured = body["squared_error"]
            assert measured is not None and measured["estimate"] > 0
            assert body["relative_error"]["estimate"] > 0


def test_a_round_of_m_vectors_sums_its_slots() -> None:
    a = rpsagg.ErrorEstimate(2.0, 0.3, 10.0, 0.2, method="free")
    b = rpsagg.ErrorEstimate(1.0, 0.4, 30.0, 1 / 30, method="exact")
    e = EstimatedError.of_slots([a, b])
    assert e is not None
    assert (e.squared_error, e.mean_norm_squared, e.method) == (3.0, 40.0, "free,exact")
    assert e.squared_error_stderr == pytest.approx(0.5)
    assert e.relative_error == pytest.approx(3 / 40)
    assert e.relative_error_stderr == pytest.approx(0.5 / 40)
    assert EstimatedError.of_slots([a, None]) is None
    assert math.isnan(EstimatedError(1.0, 0.1, 0.0).relative_error)
