"""Acceptance 5: every bad input gets its status and message and leaves the state unchanged.

One server (TLS, tokens, evaluation mode) serves the whole table; before the table runs,
client c0 has an acked submission in round 2 (round 1 is finished), so duplicates and
finished rounds are exercised. After each bad call the server's committed submissions,
round view and joined clients must be exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from service_util import Certs, InProcessServer, base_config, make_certs

from rpsagg_client import AggregationClient
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import RoundInfo, Submission, VectorPayload

pytestmark = pytest.mark.service

N, K, D = 3, 8, 128
TOKENS = "c0 tok-c0\nc1 tok-c1\nc2 tok-c2\nstranger tok-stranger\n"


@dataclass
class Env:
    srv: InProcessServer
    certs: Certs
    target: str
    clients: dict[str, AggregationClient]
    rnd: RoundInfo
    acked: Submission

    def client(self, cid: str, token: str | None) -> AggregationClient:
        return AggregationClient(self.target, cid, token=token, tls_ca=self.certs.ca,
                                 timeout=5, retry_budget=0)

    def snapshot(self) -> Any:
        eng = self.srv.running.engine
        store = self.srv.running.store
        rows = [(s.client_id, s.digest) for r in (1, 2, 3) for s in store.submissions(r)]
        view = self.srv.running.state.current_round()
        return (rows, view, dict(eng.clients), eng.current.round_id if eng.current else None)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("bad")
    certs = make_certs(tmp)
    (tmp / "tokens").write_text(TOKENS)
    cfg = replace(base_config(), n=N, insecure=False, tls_cert=certs.server_cert,
                  tls_key=certs.server_key, tokens=str(tmp / "tokens"), eval=True, rounds=5,
                  db=str(tmp / "bad.db"))
    srv = InProcessServer(cfg)
    target = f"localhost:{srv.port}"
    clients = {}
    try:
        for i in range(N):
            c = AggregationClient(target, f"c{i}", token=f"tok-c{i}", tls_ca=certs.ca,
                                  timeout=5, retry_budget=0)
            c.join()
            clients[c.client_id] = c
        xs = np.random.default_rng(0).standard_normal((N, D))
        first = clients["c0"].current_round()
        for i, c in enumerate(clients.values()):
            c.submit(first, xs[i])
        assert clients["c0"].result(first.round_id, wait=True, timeout=30).state == "done"
        rnd = clients["c0"].current_round()
        acked = clients["c0"].encode(rnd, xs[0])
        clients["c0"].submit_encoded(acked)
        yield Env(srv, certs, target, clients, rnd, acked)
    finally:
        for c in clients.values():
            c.close()
        srv.stop()


def _raw(env: Env, method: str, payload: bytes, token: str = "tok-c0") -> Any:
    channel = grpc.secure_channel(env.target, grpc.ssl_channel_credentials(
        Path(env.certs.ca).read_bytes()))
    try:
        call = channel.unary_unary(serde.method_path(method), request_serializer=None,
                                   response_deserializer=None)
        return call(payload, timeout=5, metadata=(("authorization", f"Bearer {token}"),))
    finally:
        channel.close()


def _sub(env: Env, cid: str = "c1", **changes: Any) -> Submission:
    rng = np.random.default_rng(1)
    base = env.clients[cid].encode(env.rnd, rng.standard_normal(D)) if cid in env.clients \
        else env.clients["c1"].encode(env.rnd, rng.standard_normal(D))
    if cid not in env.clients:
        base = replace(base, client_id=cid)
    return replace(base, **changes)


def _vec(values: Any = None, ref: Any = None, indices: Any = None) -> VectorPayload:
    return VectorPayload(
        np.zeros(K, np.float32) if values is None else np.asarray(values, np.float32),
        None if indices is None else np.asarray(indices),
        np.zeros(D) if ref is None else np.asarray(ref, np.float64),
    )


def _submit(env: Env, sub: Submission, token: str | None = None) -> Any:
    tok = token if token is not None else f"tok-{sub.client_id}"
    c = env.client(sub.client_id, tok or None)
    try:
        return c.submit_encoded(sub)
    finally:
        c.close()


def _scaled_floats(env: Env) -> Any:
    """c1's float32 vector with a non-zero ``scale``, which only codes carry (sent as raw
    bytes: the client's serializer never writes a scale beside float32 values)."""
    msg = serde.pb.SubmitRequest.FromString(serde.encode_submission(_sub(env)))
    msg.vectors[0].scale = 1.5
    return _raw(env, "Submit", msg.SerializeToString(), token="tok-c1")


Case = tuple[str, Callable[[Env], Any], grpc.StatusCode, str]
CASES: list[Case] = [
    ("wrong value count", lambda e: _submit(e, _sub(e, vectors=(_vec(np.zeros(K - 1)),))),
     grpc.StatusCode.INVALID_ARGUMENT, "vectors[0] has 7 values; expected k=8"),
    ("NaN value", lambda e: _submit(e, _sub(e, vectors=(_vec([np.nan] + [0.0] * (K - 1)),))),
     grpc.StatusCode.INVALID_ARGUMENT, "vectors[0].values contains NaN or Inf"),
    ("Inf value", lambda e: _submit(e, _sub(e, vectors=(_vec([np.inf] * K),))),
     grpc.StatusCode.INVALID_ARGUMENT, "vectors[0].values contains NaN or Inf"),
    ("NaN in reference", lambda e: _submit(e, _sub(e, vectors=(_vec(ref=[np.nan] * D),))),
     grpc.StatusCode.INVALID_ARGUMENT, "vectors[0].reference contains NaN or Inf"),
    ("unknown round", lambda e: _submit(e, _sub(e, round_id=99)),
     grpc.StatusCode.NOT_FOUND, "unknown round 99 (current round: 2)"),
    ("finished round", lambda e: _submit(e, _sub(e, round_id=1)),
     grpc.StatusCode.FAILED_PRECONDITION, "round 1 is finished (done); no more submissions"),
    ("unknown client", lambda e: _submit(e, _sub(e, cid="stranger")),
     grpc.StatusCode.FAILED_PRECONDITION, "client 'stranger' has not joined; call Join first"),
    ("missing token", lambda e: _submit(e, _sub(e), token=""),
     grpc.StatusCode.UNAUTHENTICATED, "missing token"),
    ("bad token", lambda e: _submit(e, _sub(e), token="tok-wrong"),
     grpc.StatusCode.UNAUTHENTICATED, "invalid token"),
    ("another client's token", lambda e: _submit(e, _sub(e), token="tok-c2"),
     grpc.StatusCode.PERMISSION_DENIED, "this token belongs to client 'c2', not 'c1'"),
    ("second different submission",
     lambda e: _submit(e, replace(e.acked, client_seed=e.acked.client_seed ^ 1)),
     grpc.StatusCode.ALREADY_EXISTS, "client 'c0' already submitted a different submission"),
    # the round's state is decided before the content (docs/protocol.md, "Order of the
    # checks"): a second submission that is also malformed is still ALREADY_EXISTS
    ("second submission, also with a wrong value count",
     lambda e: _submit(e, replace(e.acked, vectors=(_vec(np.zeros(K - 1)),))),
     grpc.StatusCode.ALREADY_EXISTS, "client 'c0' already submitted a different submission"),
    ("oversized message", lambda e: _submit(e, _sub(e, vectors=(_vec(np.zeros(5000)),))),
     grpc.StatusCode.RESOURCE_EXHAUSTED,
     "a submission of 21066 bytes is above job default's limit of 6736 bytes"),
    ("a scale beside float32 values", _scaled_floats, grpc.StatusCode.INVALID_ARGUMENT,
     "vectors[0].scale must be 0 for float32 values (a scale goes with codes); got 1.5"),
    ("wrong m", lambda e: _submit(e, _sub(e, vectors=(_vec(), _vec()))),
     grpc.StatusCode.INVALID_ARGUMENT, "expected m=1 vector(s) per submission"),
    ("wrong d", lambda e: _submit(e, _sub(e, vectors=(_vec(ref=np.zeros(D - 1)),))),
     grpc.StatusCode.INVALID_ARGUMENT, "vectors[0].reference has 127 values; expected d=128"),
    ("indices for a scheme without", lambda e: _submit(
        e, _sub(e, vectors=(_vec(indices=np.arange(K)),))),
     grpc.StatusCode.INVALID_ARGUMENT, "carries indices but rand-proj-spatial sends none"),
    ("malformed bytes", lambda e: _raw(e, "Submit", b"\xff\xff\xff\xff garbage"),
     grpc.StatusCode.INVALID_ARGUMENT, "malformed SubmitRequest message"),
    ("malformed packed floats", lambda e: _raw(e, "Submit", bytes.fromhex(
        "0802") + b"\x12\x02c1" + b"\x19" + b"\x00" * 8 + b"\x22\x07\x0a\x05abcde"),
     grpc.StatusCode.INVALID_ARGUMENT, "vectors[0].values_f32 has 5 bytes, not a multiple of 4"),
    ("bad client id at join", lambda e: e.client("bad id!", "tok-stranger").join(),
     grpc.StatusCode.INVALID_ARGUMENT, "client_id must be 1..128 characters"),
    ("join beyond n", lambda e: e.client("stranger", "tok-stranger").join(),
     grpc.StatusCode.RESOURCE_EXHAUSTED, "all n=3 client slots are taken"),
    ("result of unknown round", lambda e: e.clients["c0"].result(42, wait=False),
     grpc.StatusCode.NOT_FOUND, "unknown round 42"),
    ("read naming another client", lambda e: e.client("c1", "tok-c2").current_round(),
     grpc.StatusCode.PERMISSION_DENIED, "this token belongs to client 'c2', not 'c1'"),
    ("bad client id on a read", lambda e: e.client("bad id!", "tok-stranger").result(1),
     grpc.StatusCode.INVALID_ARGUMENT, "client_id must be 1..128 characters"),
]


@pytest.mark.parametrize(("name", "call", "code", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(env: Env, name: str, call: Callable[[Env], Any], code: grpc.StatusCode,
                   message: str) -> None:
    before = env.snapshot()
    with pytest.raises(grpc.RpcError) as info:
        call(env)
    assert info.value.code() == code, info.value.details()
    assert message in info.value.details()
    assert env.snapshot() == before


def test_identical_retry_is_acknowledged_again(env: Env) -> None:
    before = env.snapshot()
    reply = _submit(env, env.acked)
    assert reply.duplicate and reply.round_id == env.rnd.round_id and reply.received == 1
    assert env.snapshot() == before
    counters = env.srv.running.state.counters()
    assert counters["submissions_total:duplicate"] >= 1
    assert counters["submissions_total:INVALID_ARGUMENT"] >= 1
