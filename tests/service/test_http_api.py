"""The dashboard's JSON API, health probes and /metrics over a real server.

Every test starts a real server (round engine, SQLite store, grpc.aio on loopback) with
``create_server``, drives rounds with real :class:`AggregationClient` calls, and reads the
state through ``create_app(state, registry)`` with FastAPI's TestClient and a fresh
Prometheus registry.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from service_util import InProcessServer, base_config, in_process_server, wait_until

import rpsagg
from rpsagg_client import AggregationClient
from rpsagg_server.http import create_app
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_wire.v1.serde import RoundInfo, RoundResult, Submission

pytestmark = pytest.mark.service

N, K, D = 3, 8, 64


@dataclass
class Harness:
    """A live server, its HTTP app under TestClient, and joined gRPC clients."""

    cfg: ServerConfig
    server: InProcessServer
    http: TestClient
    clients: list[AggregationClient]
    rng: np.random.Generator

    def submit(self, who: list[int]) -> tuple[RoundInfo, list[Submission], np.ndarray]:
        """Clients ``who`` submit random vectors to the current round."""
        rnd = self.clients[0].current_round()
        xs = self.rng.normal(size=(len(who), rnd.m, rnd.d))
        subs = []
        for i, x in zip(who, xs, strict=True):
            sub = self.clients[i].encode(rnd, x)
            self.clients[i].submit_encoded(sub)
            subs.append(sub)
        return rnd, subs, xs

    def run_round(self) -> tuple[RoundInfo, list[Submission], np.ndarray, RoundResult]:
        """Every client submits; returns once the round finished."""
        rnd, subs, xs = self.submit(list(range(len(self.clients))))
        return rnd, subs, xs, self.clients[0].result(rnd.round_id, wait=True)


@pytest.fixture(params=[True], ids=["eval"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    cfg = base_config(n=N, k=K, d=D, rounds=2, eval=request.param)
    with in_process_server(cfg) as srv:
        app = create_app(srv.running.state, CollectorRegistry())
        clients = [AggregationClient(f"127.0.0.1:{srv.port}", f"client-{i}", insecure=True,
                                     timeout=30.0)
                   for i in range(N)]
        try:
            with TestClient(app) as http:
                yield Harness(cfg, srv, http, clients, np.random.default_rng(7))
        finally:
            for c in clients:
                c.close()


@pytest.fixture
def harness_no_eval() -> Iterator[Harness]:
    cfg = base_config(n=2, k=K, d=D, rounds=3, eval=False)
    with in_process_server(cfg) as srv:
        app = create_app(srv.running.state, CollectorRegistry())
        clients = [AggregationClient(f"127.0.0.1:{srv.port}", f"c{i}", insecure=True)
                   for i in range(2)]
        try:
            with TestClient(app) as http:
                yield Harness(cfg, srv, http, clients, np.random.default_rng(8))
        finally:
            for c in clients:
                c.close()


def join_all(h: Harness) -> None:
    for c in h.clients:
        c.join()


def scrape(http: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed by prometheus-client's own parser: {(sample, labels): value}."""
    res = http.get("/metrics")
    assert res.status_code == 200
    assert res.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(res.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# -- /api/status ---------------------------------------------------------------------------
def test_status_reports_config_round_clients_uptime_and_versions(harness: Harness) -> None:
    before = harness.http.get("/api/status").json()
    assert before["clients_joined"] == 0 and before["clients"] == []
    join_all(harness)
    res = harness.http.get("/api/status")
    assert res.status_code == 200
    st = res.json()
    cfg = harness.cfg
    assert {k: st["config"][k] for k in ("scheme", "transform", "n", "k", "d", "task")} == {
        "scheme": cfg.estimator, "transform": cfg.transform, "n": N, "k": K, "d": D,
        "task": cfg.task}
    assert st["config"]["evaluation"] is True
    assert st["config"]["rounds"] == 2
    assert st["current_round"]["round_id"] == 1
    assert st["current_round"]["state"] == "open"
    assert st["latest_round"]["round_id"] == 1
    assert st["clients_joined"] == N
    assert [c["client_id"] for c in st["clients"]] == [f"client-{i}" for i in range(N)]
    assert [c["index"] for c in st["clients"]] == list(range(N))
    assert st["uptime_seconds"] >= 0
    assert st["versions"] == {"seed_spec": rpsagg.SPEC_VERSION, "protocol": "rpsagg.v1",
                              "rpsagg": rpsagg.__version__}
    assert st["job"] == {"task": cfg.task, "steps_done": 0, "rounds_planned": 2,
                         "done": False, "r_hat_smoothed": None, "state": "running",
                         "failure": ""}


def test_status_after_the_job_has_no_current_round(harness: Harness) -> None:
    join_all(harness)
    harness.run_round()
    harness.run_round()
    st = harness.http.get("/api/status").json()
    assert st["current_round"] is None
    assert st["latest_round"]["round_id"] == 2
    assert st["latest_round"]["state"] == "done"
    assert st["job"]["done"] is True and st["job"]["steps_done"] == 2


# -- /api/rounds/{id} ------------------------------------------------------------------------
def test_round_detail_while_collecting(harness: Harness) -> None:
    join_all(harness)
    rnd, subs, _ = harness.submit([0, 2])
    # arrivals reach the read model within VIEW_INTERVAL (0.05 s) of their commit
    wait_until(lambda: len(harness.http.get(f"/api/rounds/{rnd.round_id}").json()["clients"]
                           ["arrived"]) == 2, 5.0, "both arrivals in the round's view")
    r = harness.http.get(f"/api/rounds/{rnd.round_id}").json()
    assert r["round_id"] == rnd.round_id
    assert r["state"] == "collecting"
    assert r["nonce"] == str(rnd.nonce)
    assert r["clients"] == {"expected": N, "arrived": ["client-0", "client-2"],
                            "missing": ["client-1"]}
    ts = r["timestamps"]
    assert ts["opened"] <= ts["first_submission"] <= ts["deadline"]
    assert ts["closed"] is None and ts["finished"] is None
    assert r["bytes"]["payload"] == sum(s.payload_bytes for s in subs)
    assert r["bytes"]["raw_float32"] == 2 * rnd.m * D * 4
    assert r["bytes"]["wire"] >= r["bytes"]["payload"]
    assert r["bytes"]["wire_fraction_of_raw"] == pytest.approx(
        r["bytes"]["wire"] / r["bytes"]["raw_float32"])
    assert r["decode_seconds"] is None and r["beta"] is None and r["squared_error"] is None


def test_round_detail_when_done_matches_the_engine_and_the_true_mean(harness: Harness) -> None:
    join_all(harness)
    rnd, subs, xs, result = harness.run_round()
    r = harness.http.get(f"/api/rounds/{rnd.round_id}").json()
    assert r["state"] == "done" and r["reason"] == ""
    assert r["clients"]["arrived"] == [f"client-{i}" for i in range(N)]
    assert r["clients"]["missing"] == []
    ts = r["timestamps"]
    assert ts["first_submission"] <= ts["closed"] <= ts["finished"]
    assert r["bytes"]["payload"] == sum(s.payload_bytes for s in subs)
    assert r["bytes"]["raw_float32"] == N * rnd.m * D * 4
    assert r["bytes"]["wire"] < r["bytes"]["raw_float32"] / 2
    assert r["scheme"] == harness.cfg.estimator
    assert r["transform"] == result.transform
    assert r["decode_seconds"] == pytest.approx(result.decode_seconds)
    assert r["beta"] == pytest.approx(result.beta)
    assert r["c"] == pytest.approx(result.c)
    assert r["r_hat"] == pytest.approx(result.r_hat)
    assert result.estimate is not None
    truth = xs.mean(axis=0)
    se = r["squared_error"]
    assert se["estimate"] == pytest.approx(float(np.sum((result.estimate - truth) ** 2)))
    assert se["rand_k"] == pytest.approx(result.eval_sq_error_rand_k)
    assert se["rand_k_spatial"] == pytest.approx(result.eval_sq_error_rand_k_spatial)
    assert se["rand_k"] > 0 and se["rand_k_spatial"] > 0


def test_unknown_round_is_404_with_a_clear_message(harness: Harness) -> None:
    res = harness.http.get("/api/rounds/99")
    assert res.status_code == 404
    assert res.json() == {"detail": "round 99 not found (rounds 1..1 exist)"}


@pytest.mark.parametrize("path", [
    "/api/rounds/abc", "/api/rounds/0", "/api/rounds/-3", "/api/rounds/1.5",
    "/api/rounds?limit=0", "/api/rounds?limit=abc", "/api/rounds?limit=100000",
    "/api/rounds?before=-1", "/api/rounds?before=x",
])
def test_bad_parameters_are_422_with_fastapi_detail(harness: Harness, path: str) -> None:
    res = harness.http.get(path)
    assert res.status_code == 422, res.text
    detail = res.json()["detail"]
    assert isinstance(detail, list) and detail
    assert {"loc", "msg", "type"} <= set(detail[0])


# -- /api/rounds -----------------------------------------------------------------------------
def test_rounds_are_listed_newest_first_and_paged_with_before(harness: Harness) -> None:
    join_all(harness)
    harness.run_round()
    harness.run_round()
    page = harness.http.get("/api/rounds").json()
    assert [r["round_id"] for r in page["rounds"]] == [2, 1]
    assert page["total"] == 2 and page["next_before"] is None
    first = harness.http.get("/api/rounds", params={"limit": 1}).json()
    assert [r["round_id"] for r in first["rounds"]] == [2]
    assert first["next_before"] == 2
    second = harness.http.get("/api/rounds", params={"limit": 1, "before": 2}).json()
    assert [r["round_id"] for r in second["rounds"]] == [1]
    assert second["next_before"] is None
    assert harness.http.get("/api/rounds", params={"before": 1}).json()["rounds"] == []
    assert second["rounds"][0] == harness.http.get("/api/rounds/1").json()


# -- evaluation mode off ---------------------------------------------------------------------
def test_without_evaluation_mode_the_squared_error_is_null(harness_no_eval: Harness) -> None:
    h = harness_no_eval
    join_all(h)
    rnd, _, _, _ = h.run_round()
    st = h.http.get("/api/status").json()
    assert st["config"]["evaluation"] is False
    r = h.http.get(f"/api/rounds/{rnd.round_id}").json()
    assert r["state"] == "done" and r["squared_error"] is None
    assert r["beta"] is not None
    metrics = scrape(h.http)
    assert not [k for k in metrics if k[0] == "rpsagg_round_squared_error"]


# -- health ----------------------------------------------------------------------------------
def test_healthz_and_readyz(harness: Harness) -> None:
    assert harness.http.get("/healthz").json() == {"status": "ok"}
    end = time.monotonic() + 120  # beta for n = 3 (cached or a short Monte Carlo)
    while harness.http.get("/api/status").json()["beta"]["state"] == "computing":
        assert time.monotonic() < end, "beta was not computed within 120 s"
        time.sleep(0.05)
    res = harness.http.get("/readyz")
    assert res.status_code == 200
    assert res.json() == {"ready": True,
                          "checks": {"database": True, "grpc": True, "beta": True}}
    harness.server.call(harness.server.running.stop(0.1))
    res = harness.http.get("/readyz")
    assert res.status_code == 503
    assert res.json()["ready"] is False
    assert res.json()["checks"] == {"database": False, "grpc": False, "beta": True}


def test_docs_and_openapi_list_the_endpoints(harness: Harness) -> None:
    assert harness.http.get("/docs").status_code == 200
    paths = set(harness.http.get("/openapi.json").json()["paths"])
    assert {"/api/status", "/api/rounds", "/api/rounds/{round_id}", "/healthz",
            "/readyz"} <= paths


# -- /metrics --------------------------------------------------------------------------------
def test_metrics_counters_move_by_the_expected_amounts_over_a_round(harness: Harness) -> None:
    join_all(harness)
    before = scrape(harness.http)
    rnd, subs, _, _ = harness.run_round()
    # A new (not byte-identical) submission for a finished round is rejected with
    # FAILED_PRECONDITION (an identical retry would be acknowledged as a duplicate).
    with pytest.raises(grpc.RpcError) as rejected:
        harness.clients[0].submit_encoded(
            dataclasses.replace(subs[0], client_seed=subs[0].client_seed ^ 1))
    assert rejected.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    after = scrape(harness.http)
    r = harness.http.get(f"/api/rounds/{rnd.round_id}").json()

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert delta("rpsagg_submissions_total", status="ok") == N
    assert delta("rpsagg_submissions_total", status="FAILED_PRECONDITION") == 1
    assert delta("rpsagg_bytes_received_total") == r["bytes"]["wire"]
    assert delta("rpsagg_payload_bytes_received_total") == sum(s.payload_bytes for s in subs)
    assert delta("rpsagg_rounds_total", state="collecting") == 1
    assert delta("rpsagg_rounds_total", state="decoding") == 1
    assert delta("rpsagg_rounds_total", state="done") == 1
    assert delta("rpsagg_rounds_total", state="open") == 1  # the next round opened
    assert delta("rpsagg_rounds_total", state="failed") == 0
    assert delta("rpsagg_decode_seconds_count") == 1
    assert delta("rpsagg_decode_seconds_sum") == pytest.approx(r["decode_seconds"])
    assert after[("rpsagg_clients_connected", ())] == N
    assert after[("rpsagg_current_round", ())] == rnd.round_id + 1
    se = r["squared_error"]
    for series in ("estimate", "rand_k", "rand_k_spatial"):
        got = after[("rpsagg_round_squared_error", (("series", series),))]
        assert got == pytest.approx(se[series])


def test_metrics_count_a_duplicate_submission(harness: Harness) -> None:
    join_all(harness)
    _, subs, _ = harness.submit([0])
    before = scrape(harness.http)
    harness.clients[0].submit_encoded(subs[0])
    after = scrape(harness.http)
    key = ("rpsagg_submissions_total", (("status", "duplicate"),))
    assert after[key] - before[key] == 1
    ok = ("rpsagg_submissions_total", (("status", "ok"),))
    assert after[ok] == before[ok] == 1


def test_metrics_started_late_agree_with_the_state_counters(harness: Harness) -> None:
    join_all(harness)
    harness.run_round()
    late = create_app(harness.server.running.state, CollectorRegistry())
    with TestClient(late) as http:
        m = scrape(http)
    counters = harness.server.running.state.counters()
    assert m[("rpsagg_submissions_total", (("status", "ok"),))] == counters[
        "submissions_total:ok"] == N
    assert m[("rpsagg_bytes_received_total", ())] == counters["bytes_received_total:wire"]
    assert m[("rpsagg_rounds_total", (("state", "done"),))] == 1
    # one ledger: the decode histogram of an app created late holds the earlier decodes too
    assert m[("rpsagg_decode_seconds_count", ())] == counters["decode_count"] == 1


def test_each_app_has_its_own_registry(harness: Harness) -> None:
    registry = CollectorRegistry()
    create_app(harness.server.running.state, registry)
    names = {m.name for m in registry.collect()}
    assert {"rpsagg_submissions", "rpsagg_bytes_received", "rpsagg_rounds",
            "rpsagg_decode_seconds", "rpsagg_clients_connected"} <= names
    with pytest.raises(ValueError, match="Duplicated"):
        create_app(harness.server.running.state, registry)
