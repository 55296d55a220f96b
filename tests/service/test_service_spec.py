"""The wire tells a client all it needs to encode, and the server refuses what it cannot read.

A round announces the oldest wire format that defines its encoding, the projection and the
block size (``RoundInfo.spec_version``, ``projection``, ``block_size``); a submission says
which version it was encoded with (``SubmitRequest.spec_version``, empty from clients that
predate the field, which counts as ``rpsagg-seed-v1``). Checked on two in-process servers:
d = 100 (hblocks, needs v4) and d = 128 (SRHT, v1 suffices); a job recovered from a database
that recorded the randomized DCT (the default for such d before v4) keeps it (needs v2).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from service_util import base_config, in_process_server

import rpsagg
from rpsagg_client import AggregationClient
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import RoundInfo

pytestmark = pytest.mark.service

N, K = 3, 8


def _clients(port: int) -> list[AggregationClient]:
    out = []
    for i in range(N):
        c = AggregationClient(f"127.0.0.1:{port}", f"c{i}", insecure=True, timeout=10,
                              retry_budget=0)
        c.join()
        out.append(c)
    return out


def _decoded_like_the_library(clients: list[AggregationClient], rnd: RoundInfo,
                              subs: list[serde.Submission]) -> None:
    """The round's estimate equals the library's decode of the same messages."""
    res = clients[0].result(rnd.round_id, wait=True, timeout=60)
    assert res.state == "done", res.reason
    assert res.estimate is not None
    est = clients[0].estimator_for(rnd)
    msgs = [
        rpsagg.Encoded(est.name, rpsagg.spec.derive_round_seed(s.client_seed, rnd.nonce,
                                                                 s.client_id, 0),
                       K, rnd.d, s.vectors[0].values)
        for s in subs
    ]
    np.testing.assert_allclose(res.estimate[0], est.decode(msgs), rtol=0, atol=1e-12)


def test_hblocks_round_needs_v4_and_refuses_older_or_unknown_versions() -> None:
    d = 100
    with in_process_server(base_config(n=N, k=K, d=d, rounds=1)) as srv:
        clients = _clients(srv.port)
        try:
            rnd = clients[0].current_round()
            assert (rnd.spec_version, rnd.projection, rnd.block_size) == (
                "rpsagg-seed-v4", "hblocks", 0)
            xs = np.random.default_rng(1).standard_normal((N, d))
            sub = clients[0].encode(rnd, xs[0])
            # the round's own version, older than the library's v5 (which is not needed)
            assert sub.spec_version == rnd.spec_version != rpsagg.SPEC_VERSION
            # a client from before versions were sent: counts as v1, which has no hblocks
            with pytest.raises(grpc.RpcError) as info:
                clients[0].submit_encoded(replace(sub, spec_version=""))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "rpsagg-seed-v1 (no spec_version sent)" in info.value.details()
            assert "projection 'hblocks'" in info.value.details()
            assert "rpsagg-seed-v4" in info.value.details()
            for old in ("rpsagg-seed-v1", "rpsagg-seed-v2", "rpsagg-seed-v3"):
                with pytest.raises(grpc.RpcError) as info:
                    clients[0].submit_encoded(replace(sub, spec_version=old))
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # a version the server does not speak: named, with the versions it speaks
            with pytest.raises(grpc.RpcError) as info:
                clients[0].submit_encoded(replace(sub, spec_version="rpsagg-seed-v9"))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'rpsagg-seed-v9'" in info.value.details()
            assert "it speaks rpsagg-seed-v1, rpsagg-seed-v2, rpsagg-seed-v3, rpsagg-seed-v4" in (
                info.value.details())
            assert srv.running.store.submissions(rnd.round_id) == []  # nothing committed
            # clients that read the round encode hblocks; the round decodes
            subs = [sub] + [c.encode(rnd, x) for c, x in zip(clients[1:], xs[1:], strict=True)]
            for c, s in zip(clients, subs, strict=True):
                c.submit_encoded(s)
            _decoded_like_the_library(clients, rnd, subs)
        finally:
            for c in clients:
                c.close()


def test_srht_round_accepts_clients_without_a_version() -> None:
    d = 128
    with in_process_server(base_config(n=N, k=K, d=d, rounds=1)) as srv:
        clients = _clients(srv.port)
        try:
            rnd = clients[0].current_round()
            assert (rnd.spec_version, rnd.projection, rnd.block_size) == (
                "rpsagg-seed-v1", "srht", 0)
            xs = np.random.default_rng(2).standard_normal((N, d))
            subs = [c.encode(rnd, x) for c, x in zip(clients, xs, strict=True)]
            subs[1] = replace(subs[1], spec_version="")  # an old client
            subs[2] = replace(subs[2], spec_version="rpsagg-seed-v1")
            for c, s in zip(clients, subs, strict=True):
                c.submit_encoded(s)
            _decoded_like_the_library(clients, rnd, subs)
        finally:
            for c in clients:
                c.close()


def test_client_reads_what_an_older_server_leaves_out() -> None:
    # RoundInfo from a server that predates the fields: no version, no projection. Its
    # Rand-Proj-Spatial is v1's SRHT whatever d is.
    rnd = RoundInfo(1, 5, "rand-proj-spatial", N, K, 100, "avg", "mean", 1, None, "open", 0,
                    False, False, 0)
    raw = serde.reply_serializer("GetRound")(rnd)
    parsed = serde.deserializer("GetRound")(raw)
    assert (parsed.spec_version, parsed.projection, parsed.block_size) == ("", "", 0)
    client = AggregationClient("127.0.0.1:1", "c0", insecure=True, timeout=1, retry_budget=0)
    try:
        est = client.estimator_for(parsed)
        assert est.name == "rand-proj-spatial" and est.d_pad == 128  # type: ignore[attr-defined]
        future = replace(parsed, spec_version="rpsagg-seed-v9")
        with pytest.raises(ValueError, match="needs wire format 'rpsagg-seed-v9'"):
            client.estimator_for(future)
    finally:
        client.close()


def _one_round(cfg: ServerConfig, version: str, projection: str, scheme: str,
               data_seed: int) -> None:
    """A server on ``cfg`` announces ``version`` and ``projection``; N clients encode with
    ``scheme`` and claim the round's version (not the client's newest: a server older than
    the client takes it too); the round decodes as the library does."""
    with in_process_server(cfg) as srv:
        clients = _clients(srv.port)
        try:
            rnd = clients[0].current_round()
            assert (rnd.spec_version, rnd.projection) == (version, projection)
            xs = np.random.default_rng(data_seed).standard_normal((N, cfg.d))
            subs = [cl.encode(rnd, x) for cl, x in zip(clients, xs, strict=True)]
            assert {s.spec_version for s in subs} == {version}
            assert clients[0].estimator_for(rnd).name == scheme
            for cl, s in zip(clients, subs, strict=True):
                cl.submit_encoded(s)
            _decoded_like_the_library(clients, rnd, subs)
        finally:
            for cl in clients:
                cl.close()


def test_a_recovered_job_keeps_its_projection(tmp_path: Path) -> None:
    # A job's stored submissions must be decoded with the projection they were encoded
    # with. A fresh job at d = 100 records "hblocks"; a database written before v4 recorded
    # "dct" (simulated by rewriting the record), and a restarted server keeps announcing
    # and decoding the DCT for it; a database from before the projection was recorded
    # (simulated by deleting the record) held SRHT submissions, and a restarted server
    # keeps announcing and decoding the SRHT for it.
    db = tmp_path / "job.db"
    cfg = base_config(n=N, k=K, d=100, rounds=3, db=str(db))
    with in_process_server(cfg) as srv:
        c = AggregationClient(f"127.0.0.1:{srv.port}", "c0", insecure=True, timeout=10,
                              retry_budget=0)
        try:
            c.join()
            assert c.current_round().projection == "hblocks"
        finally:
            c.close()
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT value FROM meta WHERE key = 'encoding'").fetchone()
        assert json.loads(stored[0]) == ["rpsagg-seed-v4", "hblocks", 0]
        conn.execute("UPDATE meta SET value = ? WHERE key = 'encoding'",
                     (json.dumps(["rpsagg-seed-v2", "dct", 0]),))
    _one_round(cfg, "rpsagg-seed-v2", "dct", "rand-proj-spatial:dct", data_seed=4)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM meta WHERE key = 'encoding'")
    _one_round(cfg, "rpsagg-seed-v1", "srht", "rand-proj-spatial", data_seed=3)
    with sqlite3.connect(db) as conn:  # now recorded
        stored = conn.execute("SELECT value FROM meta WHERE key = 'encoding'").fetchone()
        assert json.loads(stored[0]) == ["rpsagg-seed-v1", "srht", 0]


def _refusal(client: AggregationClient, sub: serde.Submission, claim: str) -> str:
    """The FAILED_PRECONDITION reason a submission claiming ``claim`` gets."""
    with pytest.raises(grpc.RpcError) as info:
        client.submit_encoded(replace(sub, spec_version=claim))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value.details()
    return info.value.details() or ""


@pytest.mark.timeout(240)
def test_value_bits_auto_stamps_each_round_with_the_least_version_it_uses(
        tmp_path: Path) -> None:
    # --value-bits auto: round 1 knows no R_hat and sends float32 values at --k-max (plain
    # SRHT: v1), so it says v1 and takes a v1 claim; a later round that sends codes says v3
    # and refuses v1, naming the quantized values
    d, k = 128, 64
    cfg = base_config(n=N, k=k, d=d, rounds=0, target_rel_error=1.5, value_bits="auto",
                      db=str(tmp_path / "job.db"))
    rng = np.random.default_rng(7)
    seen: list[tuple[int, str]] = []
    with in_process_server(cfg) as srv:
        clients = _clients(srv.port)
        try:
            for _ in range(6):  # bounded: the first quantized round ends the loop
                rnd = clients[0].current_round()
                seen.append((rnd.value_bits, rnd.spec_version))
                xs = rng.standard_normal(d) + rng.standard_normal((N, d)) / 3.0
                subs = [c.encode(rnd, x) for c, x in zip(clients, xs, strict=True)]
                if rnd.value_bits < 32:
                    reason = _refusal(clients[0], subs[0], "rpsagg-seed-v1")
                    assert "quantized values" in reason and "rpsagg-seed-v3" in reason
                    assert "projection" not in reason
                else:
                    subs[0] = replace(subs[0], spec_version="rpsagg-seed-v1")
                    subs[1] = replace(subs[1], spec_version="")  # an old client: v1
                for c, s in zip(clients, subs, strict=True):
                    c.submit_encoded(s)
                assert clients[0].result(rnd.round_id, wait=True, timeout=60).state == "done"
                if rnd.value_bits < 32:
                    break
        finally:
            for c in clients:
                c.close()
    assert seen[0] == (32, "rpsagg-seed-v1"), seen
    assert seen[-1][0] < 32, seen  # a quantized round came
    assert all(v == ("rpsagg-seed-v1" if bits == 32 else "rpsagg-seed-v3")
               for bits, v in seen), seen


def test_quantized_blockwise_round_names_its_quantized_blocks_as_the_reason() -> None:
    # a quantized blockwise round needs v5 for its per-block scales, not for the SRHT (v1):
    # an empty (v1) or a v4 claim is refused naming the quantized blockwise values
    d = 128
    with in_process_server(base_config(n=N, k=16, d=d, block_size=32, value_bits=8,
                                       rounds=1)) as srv:
        clients = _clients(srv.port)
        try:
            rnd = clients[0].current_round()
            assert (rnd.spec_version, rnd.projection, rnd.block_size) == (
                "rpsagg-seed-v5", "srht", 32)
            sub = clients[0].encode(rnd, np.random.default_rng(3).standard_normal(d))
            for claim in ("", "rpsagg-seed-v4"):
                reason = _refusal(clients[0], sub, claim)
                assert "quantized blockwise values" in reason, reason
                assert "are defined from rpsagg-seed-v5 on" in reason, reason
                assert "projection 'srht'" not in reason, reason
            assert srv.running.store.submissions(rnd.round_id) == []
        finally:
            for c in clients:
                c.close()
