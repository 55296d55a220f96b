"""Acceptance 6: TLS with a CA made in the test, tokens, mTLS; and secure-by-default config."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_util import Certs, base_config, in_process_server, make_certs

from rpsagg_client import AggregationClient
from rpsagg_server.http import create_app
from rpsagg_server.settings.flags import load_config
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_wire.v1 import serde

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Certs, str]]:
    tmp = tmp_path_factory.mktemp("tls")
    (tmp / "tokens").write_text("# test tokens\nshared-secret\nc1 tok-c1\n")
    yield make_certs(tmp), str(tmp / "tokens")


def _tls_cfg(certs: Certs, tokens: str, mtls: bool = False) -> ServerConfig:
    return replace(base_config(), insecure=False, tls_cert=certs.server_cert,
                   tls_key=certs.server_key, tokens=tokens,
                   tls_client_ca=certs.ca if mtls else None)


def test_tls_with_token_joins_and_without_token_is_unauthenticated(
    certs: tuple[Certs, str]
) -> None:
    c, tokens = certs
    with in_process_server(_tls_cfg(c, tokens)) as srv:
        target = f"localhost:{srv.port}"
        with AggregationClient(target, "c0", token="shared-secret", tls_ca=c.ca) as ok:
            assert ok.join().client_index == 0
            assert ok.current_round().round_id == 1
        for token, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                            ("wrong", grpc.StatusCode.UNAUTHENTICATED),
                            ("tok-c1", grpc.StatusCode.PERMISSION_DENIED)):
            with AggregationClient(target, "c2", token=token, tls_ca=c.ca,
                                   retry_budget=0) as bad:
                with pytest.raises(grpc.RpcError) as info:
                    bad.join()
                assert info.value.code() == code
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    with pytest.raises(grpc.RpcError) as info:
                        bad.current_round()
                    assert info.value.code() == code
        # a plain-text client cannot talk to the TLS port
        with AggregationClient(target, "c0", token="shared-secret", insecure=True,
                               retry_budget=0, timeout=3) as plain:
            with pytest.raises(grpc.RpcError) as info:
                plain.join()
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert [cl.client_id for cl in srv.running.state.clients()] == ["c0"]


def test_mtls_requires_a_client_certificate(certs: tuple[Certs, str]) -> None:
    c, tokens = certs
    with in_process_server(_tls_cfg(c, tokens, mtls=True)) as srv:
        target = f"localhost:{srv.port}"
        with AggregationClient(target, "c0", token="shared-secret", tls_ca=c.ca,
                               retry_budget=0, timeout=3) as nocert:
            with pytest.raises(grpc.RpcError) as info:
                nocert.join()
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with AggregationClient(target, "c0", token="shared-secret", tls_ca=c.ca,
                               tls_cert=c.client_cert, tls_key=c.client_key) as withcert:
            assert withcert.join().client_index == 0


def test_secure_by_default_configuration(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TLS is required"):
        load_config([], env={})
    with pytest.raises(ValueError, match="--tokens FILE is required"):
        load_config(["--tls-cert", "a", "--tls-key", "b"], env={})
    cfg = load_config(["--insecure"], env={})
    assert cfg.insecure and cfg.grpc_port == 50051 and cfg.http_port == 8000


def test_config_precedence_flag_env_file(tmp_path: Path) -> None:
    conf = tmp_path / "server.toml"
    conf.write_text('insecure = true\nn = 7\nk = 5\nround-timeout = 9.5\ntask = "kmeans"\n')
    env = {"RPSAGG_CONFIG": str(conf), "RPSAGG_K": "6", "RPSAGG_EVAL": "true"}
    cfg = load_config(["--n", "8"], env=env)
    assert (cfg.n, cfg.k, cfg.round_timeout, cfg.task, cfg.eval) == (8, 6, 9.5, "kmeans", True)
    conf.write_text("bogus = 1\n")
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        load_config([], env=env)


def test_kmeans_mode_reaches_the_task_parameters() -> None:
    assert load_config(["--insecure"], env={}).params["updates"] == 1.0
    assert load_config(["--insecure", "--kmeans-updates", "0"], env={}).params["updates"] == 0.0
    with pytest.raises(ValueError, match="--kmeans-updates must be 0 or 1; got 2"):
        load_config(["--insecure"], env={"RPSAGG_KMEANS_UPDATES": "2"})


def _raw_join(target: str, ca: str, metadata: tuple[tuple[str, str], ...]) -> grpc.RpcError:
    creds = grpc.ssl_channel_credentials(Path(ca).read_bytes())
    with grpc.secure_channel(target, creds) as ch:
        join = ch.unary_unary(serde.method_path("Join"),
                              request_serializer=serde.serializer("Join"),
                              response_deserializer=serde.deserializer("Join"))
        with pytest.raises(grpc.RpcError) as info:
            join(serde.JoinRequest("c9"), metadata=metadata, timeout=10)
    return info.value


def test_more_than_one_authorization_entry_is_unauthenticated(certs: tuple[Certs, str]) -> None:
    c, tokens = certs
    right, wrong = ("authorization", "Bearer shared-secret"), ("authorization", "Bearer wrong")
    with in_process_server(_tls_cfg(c, tokens)) as srv:
        target = f"localhost:{srv.port}"
        # a wrong token then a right one (the last one used to win), the reverse, and the
        # right one twice: each is refused before any token is looked at
        for md in ((wrong, right), (right, wrong), (right, right)):
            err = _raw_join(target, c.ca, md)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, md
            assert "2 'authorization' metadata entries" in (err.details() or "")
        assert srv.running.state.clients() == []
        # the same channel set-up with exactly one entry joins (the refusals were the count)
        creds = grpc.ssl_channel_credentials(Path(c.ca).read_bytes())
        with grpc.secure_channel(target, creds) as ch:
            join = ch.unary_unary(serde.method_path("Join"),
                                  request_serializer=serde.serializer("Join"),
                                  response_deserializer=serde.deserializer("Join"))
            assert join(serde.JoinRequest("c9"), metadata=(right,), timeout=10).client_index == 0


def test_status_shows_booleans_never_paths(certs: tuple[Certs, str], tmp_path: Path) -> None:
    c, tokens = certs
    db = str(tmp_path / "secret-place" / "job.db")
    Path(db).parent.mkdir()
    cfg = replace(_tls_cfg(c, tokens, mtls=True), db=db, port_file=str(tmp_path / "port"))
    with in_process_server(cfg) as srv:
        app = create_app(srv.running.state, CollectorRegistry())
        with TestClient(app) as http:
            res = http.get("/api/status")
    assert res.status_code == 200
    settings = res.json()["config"]["settings"]
    assert {k: settings[k] for k in ("tls", "mtls", "tokens", "persistent_db")} == {
        "tls": True, "mtls": True, "tokens": True, "persistent_db": True}
    for path in (c.server_key, c.server_cert, c.ca, tokens, db, str(tmp_path / "port")):
        assert path not in res.text
    assert str(tmp_path) not in res.text and "secret-place" not in res.text
    for key in ("tls_key", "tls_cert", "tls_client_ca", "db", "port_file"):
        assert key not in settings
    plain = base_config().public_dict()
    assert (plain["tls"], plain["mtls"], plain["tokens"], plain["persistent_db"]) == (
        False, False, False, False)


def test_token_check_covers_every_aggregation_call_but_not_health(
    certs: tuple[Certs, str]
) -> None:
    """The interceptor refuses each Aggregation method without a token (Submit counted as a
    refused submission), while the health service stays open for probes."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    c, tokens = certs
    with in_process_server(_tls_cfg(c, tokens)) as srv:
        target = f"localhost:{srv.port}"
        creds = grpc.ssl_channel_credentials(Path(c.ca).read_bytes())
        with grpc.secure_channel(target, creds) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            reply = health.Check(health_pb2.HealthCheckRequest(service=serde.SERVICE),
                                 timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            calls = {
                "GetRound": serde.GetRoundRequest(),
                "GetResult": serde.GetResultRequest(round_id=1),
                "Submit": serde.Submission(round_id=1, client_id="c0", client_seed=1,
                                           vectors=()),
            }
            for method, request in calls.items():
                call = ch.unary_unary(serde.method_path(method),
                                      request_serializer=serde.serializer(method),
                                      response_deserializer=serde.deserializer(method))
                with pytest.raises(grpc.RpcError) as info:
                    call(request, timeout=10)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
            watch = ch.unary_stream(serde.method_path("WatchRounds"),
                                    request_serializer=serde.serializer("WatchRounds"),
                                    response_deserializer=serde.deserializer("WatchRounds"))
            with pytest.raises(grpc.RpcError) as info:
                list(watch(serde.WatchRequest(), timeout=10))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        counters = srv.running.state.counters()
        assert counters.get("submissions_total:UNAUTHENTICATED") == 1
        assert "submissions_total:ok" not in counters
