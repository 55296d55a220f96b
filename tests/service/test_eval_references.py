"""Evaluation mode: references are validated at Submit; evaluation can never fail a round.

A reference must be finite with a finite squared norm (1e200 is finite, its square is not):
otherwise Submit is INVALID_ARGUMENT and nothing changes. A valid reference that is still
too large to evaluate with (its squared norm just below the float64 maximum) gives NaN
squared errors where they overflow, while the round is decoded as usual.
"""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_util import base_config, in_process_server

from rpsagg import make_estimator
from rpsagg.spec import derive_round_seed
from rpsagg_client import AggregationClient
from rpsagg_server.decode import decoding
from rpsagg_server.decode.decoding import decode_round, messages
from rpsagg_server.http import create_app
from rpsagg_wire.v1.serde import Submission, VectorPayload

pytestmark = pytest.mark.service

N, K, D = 2, 8, 128
SCHEME = "rand-proj-spatial"
BIG = 1.3e154  # BIG**2 = 1.69e308 < float64 max 1.80e308
# a valid reference: squared norm BIG**2; Rand-k's shadow scales the k kept coordinates by
# d/k, so its squared error is about (d/k) * BIG**2 = 16 * BIG**2, which overflows
HUGE_REF = np.full(D, BIG / math.sqrt(D))


def _with_reference(sub: Submission, ref: np.ndarray) -> Submission:
    v = sub.vectors[0]
    return Submission(sub.round_id, sub.client_id, sub.client_seed,
                      (VectorPayload(v.values, v.indices, ref),))


def test_a_reference_whose_square_overflows_is_refused_and_the_round_goes_on() -> None:
    cfg = base_config(n=N, k=K, d=D, rounds=1, eval=True)
    rng = np.random.default_rng(3)
    with in_process_server(cfg) as srv:
        clients = [AggregationClient(f"127.0.0.1:{srv.port}", f"c{i}", insecure=True,
                                     retry_budget=0, timeout=30.0) for i in range(N)]
        try:
            for c in clients:
                c.join()
            rnd = clients[0].current_round()
            xs = rng.normal(size=(N, D))
            honest = [c.encode(rnd, x) for c, x in zip(clients, xs, strict=True)]
            for huge in (np.full(D, 1e200), np.eye(1, D, 5)[0] * 1e155):
                assert np.all(np.isfinite(huge))  # finite: only the squared norm overflows
                with pytest.raises(grpc.RpcError) as info:
                    clients[0].submit_encoded(_with_reference(honest[0], huge))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "vectors[0].reference has a squared norm that overflows" in (
                    info.value.details() or "")
            # nothing changed: the round is still open, and the client can submit honestly
            assert clients[0].current_round().state == "open"
            for c, sub in zip(clients, honest, strict=True):
                assert not c.submit_encoded(sub).duplicate
            res = clients[0].result(rnd.round_id, wait=True)
        finally:
            for c in clients:
                c.close()
    assert res.state == "done"
    truth = xs.mean(axis=0)
    assert res.estimate is not None
    assert res.eval_sq_error == pytest.approx(float(np.sum((res.estimate[0] - truth) ** 2)),
                                              rel=1e-9)
    assert all(math.isfinite(e) for e in (res.eval_sq_error_rand_k,
                                          res.eval_sq_error_rand_k_spatial))


def _subs(rng: np.random.Generator, refs: np.ndarray) -> list[Submission]:
    est = make_estimator(SCHEME, n=N, k=K, d=D)
    out = []
    for i, ref in enumerate(refs):
        seed = int(rng.integers(1, 2**63))
        enc = est.encode(rng.normal(size=D), derive_round_seed(seed, 77, f"c{i}", 0))
        out.append(Submission(1, f"c{i}", seed, (VectorPayload(enc.values, None, ref),)))
    return out


def _plain_estimate(subs: list[Submission]) -> np.ndarray:
    est = make_estimator(SCHEME, n=N, k=K, d=D)
    return est.decode(messages(subs, 77, SCHEME, K, D, 0))


def test_evaluation_that_overflows_is_nan_and_the_estimate_is_unchanged() -> None:
    rng = np.random.default_rng(5)
    refs = np.tile(HUGE_REF, (N, 1))
    subs = _subs(rng, refs)
    out = decode_round(make_estimator(SCHEME, n=N, k=K, d=D), subs, 77, 1, tracker=None,
                       evaluate=True)
    np.testing.assert_array_equal(out.estimate[0], _plain_estimate(subs))
    assert out.eval_errors is not None
    est_err, err_k, err_s, truth_sq = out.eval_errors
    # ||x_bar||^2 = BIG^2 = 1.69e308 is still finite: relative errors can be formed
    assert truth_sq == pytest.approx(BIG**2, rel=1e-12)
    # the estimate's own error is computable: ||x_hat - x_bar||^2 = (x_hat_0 - BIG)^2 + ...
    want = float(np.sum((out.estimate[0] - refs.mean(axis=0)) ** 2))
    assert math.isfinite(want) and est_err == want
    for e in (err_k, err_s):  # each shadow is a real number or NaN, never inf
        assert math.isnan(e) or math.isfinite(e)
    assert math.isnan(err_k)  # Rand-k's overflows here


def test_a_failing_evaluation_never_fails_the_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    subs = _subs(rng, rng.normal(size=(N, D)))

    def broken(*args: object, **kwargs: object) -> tuple[float, float]:
        raise ValueError("message 0 has non-finite values")

    monkeypatch.setattr(decoding, "shadow_errors", broken)
    out = decode_round(make_estimator(SCHEME, n=N, k=K, d=D), subs, 77, 1, tracker=None,
                       evaluate=True)
    np.testing.assert_array_equal(out.estimate[0], _plain_estimate(subs))
    assert out.eval_errors is not None
    assert math.isfinite(out.eval_errors[0])
    assert math.isnan(out.eval_errors[1]) and math.isnan(out.eval_errors[2])


def test_a_round_with_huge_valid_references_is_done_and_its_page_renders() -> None:
    cfg = base_config(n=N, k=K, d=D, rounds=1, eval=True)
    rng = np.random.default_rng(8)
    with in_process_server(cfg) as srv:
        clients = [AggregationClient(f"127.0.0.1:{srv.port}", f"c{i}", insecure=True,
                                     timeout=30.0) for i in range(N)]
        try:
            for c in clients:
                c.join()
            rnd = clients[0].current_round()
            for c in clients:
                c.submit_encoded(_with_reference(c.encode(rnd, rng.normal(size=D)), HUGE_REF))
            res = clients[0].result(rnd.round_id, wait=True)
            app = create_app(srv.running.state, CollectorRegistry())
            with TestClient(app) as http:
                page = http.get(f"/api/rounds/{rnd.round_id}")
                status = http.get("/api/status")
                metrics = http.get("/metrics")
        finally:
            for c in clients:
                c.close()
    assert res.state == "done", res.reason
    assert page.status_code == 200 and status.status_code == 200 and metrics.status_code == 200
    se = page.json()["squared_error"]
    # ||x_bar||^2 = BIG^2 is finite here; the relative errors divide by it
    assert se.pop("truth_sq_norm") == pytest.approx(BIG**2, rel=1e-12)
    values = [res.eval_sq_error, res.eval_sq_error_rand_k, res.eval_sq_error_rand_k_spatial]
    # JSON has no NaN: a value that could not be computed is null, the others as reported
    assert se == {k: (None if math.isnan(v) else v)
                  for k, v in zip(("estimate", "rand_k", "rand_k_spatial"), values,
                                  strict=True)}
    assert math.isfinite(values[0]) and math.isnan(values[1])
