"""The service with quantized values: --value-bits for the paper's estimators, --bits for EDEN
and QSGD. Clients send packed codes; the server decodes exactly what the library decodes."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from service_util import base_config, in_process_server

import rpsagg
from rpsagg.synthetic import correlated_vectors
from rpsagg_client import AggregationClient
from rpsagg_server.decode.decoding import messages
from rpsagg_server.settings.flags import load_config
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import VectorPayload

pytestmark = pytest.mark.service

N, K, D = 4, 8, 128


@pytest.mark.parametrize(
    ("changes", "bits_per_value", "count"),
    [
        ({"estimator": "rand-proj-spatial", "value_bits": 4}, 4, K),
        ({"estimator": "rand-k", "value_bits": 1}, 1, K),
        ({"estimator": "eden", "bits": 2}, 2, D),
        ({"estimator": "qsgd", "bits": 2}, 3, D),
    ],
)
def test_quantized_rounds(changes: dict, bits_per_value: int, count: int) -> None:
    cfg = replace(base_config(), n=N, k=K, d=D, rounds=2, eval=True, **changes)
    xs = correlated_vectors(N, D, 2.0, seed=3)
    with in_process_server(cfg) as srv:
        target = f"127.0.0.1:{srv.port}"
        clients = [AggregationClient(target, f"c{i}", insecure=True) for i in range(N)]
        for c in clients:
            c.join()
        rnd = clients[0].current_round()
        assert (rnd.value_bits, rnd.bits) == (cfg.value_bits, cfg.bits)
        # EDEN and QSGD send every coordinate: RoundInfo.k is 0, not --k
        assert rnd.k == (0 if cfg.estimator in ("eden", "qsgd") else K)
        # packed codes are defined from rpsagg-seed-v3 on: the round says so, and refuses a
        # submission that claims an older format (nothing is committed)
        assert rnd.spec_version == "rpsagg-seed-v3"
        subs = [c.encode(rnd, xs[c.index]) for c in clients]
        for old in ("rpsagg-seed-v2", ""):
            with pytest.raises(grpc.RpcError) as info:
                clients[0].submit_encoded(replace(subs[0], spec_version=old))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # the reason is the quantization, not the projection (srht is defined from v1)
            assert "needs rpsagg-seed-v3" in (info.value.details() or "")
            assert (f"quantized values ({bits_per_value}-bit codes of {cfg.estimator}) are "
                    "defined from rpsagg-seed-v3 on") in (info.value.details() or "")
            assert "projection" not in (info.value.details() or "")
        assert srv.running.store.submissions(rnd.round_id) == []
        for c, sub in zip(clients, subs, strict=True):
            assert sub.vectors[0].codes is not None and sub.vectors[0].values.size == 0
            c.submit_encoded(sub)
        res = clients[0].result(rnd.round_id, wait=True, timeout=60)
        for c in clients:
            c.close()
    assert res.state == "done"
    # the library's decode of the same messages, as the server rebuilds them from the wire
    wire_subs = [serde.decode_submission(serde.encode_submission(s)) for s in subs]
    est = srv.running.engine.planner.estimator(None)
    msgs = messages(wire_subs, rnd.nonce, cfg.estimator, est.k, D, 0)
    assert res.estimate is not None
    np.testing.assert_array_equal(res.estimate[0], est.decode(msgs))
    per_message = 8 + math.ceil(bits_per_value * count / 8) + 4
    assert res.payload_bytes == N * per_message
    assert all(m.payload_bytes == per_message and m.bits == 64 + bits_per_value * count + 32
               for m in msgs)
    # wire bytes: those of the quantized requests; against the same request with float32
    # values they save the payload difference less the new fields' framing: fields 40-43
    # have 2-byte tags, so values_packed costs 2 + varint(P) + P, value_bits 3, value_count
    # 2 + varint(count), scale 6, against values_f32's 1 + varint(4 count) + 4 count: 9 bytes
    # more framing at count = 8; at count = 128 value_count's varint and values_f32's both
    # take 2 bytes, and the shorter vector's own length prefix 1 byte less: 8
    assert res.wire_bytes == sum(w.wire_bytes for w in wire_subs)
    for w, msg in zip(wire_subs, msgs, strict=True):
        floats = replace(w, vectors=(VectorPayload(msg.values, None, w.vectors[0].reference),))
        saved = serde.decode_submission(serde.encode_submission(floats)).wire_bytes - w.wire_bytes
        assert (4 * count - (per_message - 8)) - saved == (9 if count < 128 else 8), saved
    assert math.isfinite(res.eval_sq_error)
    # shadows (Rand-k, Rand-k-Spatial at the job's k) only for the sketching schemes
    has_k = cfg.estimator not in ("eden", "qsgd")
    assert math.isfinite(res.eval_sq_error_rand_k) == has_k


def test_mismatched_value_bits_are_rejected() -> None:
    cfg = replace(base_config(), n=N, k=K, d=D, value_bits=4)
    with in_process_server(cfg) as srv:
        c = AggregationClient(f"127.0.0.1:{srv.port}", "c0", insecure=True, retry_budget=0)
        c.join()
        rnd = c.current_round()
        good = c.encode(rnd, np.ones(D))
        floats = replace(good, vectors=(VectorPayload(np.zeros(K, np.float32)),))
        v = good.vectors[0]
        assert v.codes is not None
        eight = replace(good, vectors=(VectorPayload(v.values, None, None, v.codes, 8, v.scale),))
        nan_scale = replace(good, vectors=(VectorPayload(v.values, None, None, v.codes, 4,
                                                         math.nan),))
        for sub, text in ((floats, "sends 32-bit values; this job's rand-proj-spatial sends "
                                   "4-bit values"),
                          (eight, "sends 8-bit values"),
                          (nan_scale, "scale must be finite")):
            with pytest.raises(grpc.RpcError) as err:
                c.submit_encoded(sub)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert text in str(err.value.details())
        c.submit_encoded(good)
        c.close()


def test_flags() -> None:
    cfg = load_config(["--insecure", "--estimator", "eden", "--bits", "4"], env={})
    assert (cfg.estimator, cfg.bits, cfg.value_bits) == ("eden", 4, 32)
    # --k means nothing to EDEN and QSGD: the default 102 does not have to fit d = 100
    for name in ("eden", "qsgd"):
        cfg = load_config(["--insecure", "--estimator", name, "--bits", "2", "--d", "100"],
                          env={})
        assert (cfg.d, cfg.k) == (100, 102)
    with pytest.raises(ValueError, match=r"--k must be in \[1, d\] = \[1, 100\]"):
        load_config(["--insecure", "--estimator", "rand-k", "--d", "100"], env={})
    cfg = load_config(["--insecure", "--value-bits", "2"], env={"RPSAGG_ESTIMATOR": "rand-k"})
    assert cfg.value_bits == 2
    for argv, text in ((["--estimator", "eden"], "needs --bits"),
                       (["--estimator", "eden", "--bits", "3"], "one of"),
                       (["--estimator", "induced", "--value-bits", "4"], "--value-bits applies"),
                       (["--value-bits", "0"], r"\[1, 32\]"),
                       (["--bits", "2"], "--bits applies")):
        with pytest.raises(ValueError, match=text):
            load_config(["--insecure", *argv], env={})


def test_packed_submission_round_trip_and_bad_packing() -> None:
    est = rpsagg.make_estimator("rand-k", n=2, k=5, d=20, value_bits=3)
    enc = est.encode(np.arange(20.0), 7)
    assert enc.codes is not None and enc.scales is not None
    v = VectorPayload(np.empty(0, np.float32), None, None, enc.codes, 3, float(enc.scales[0]))
    raw = serde.encode_submission(serde.Submission(1, "c0", 7, (v,)))
    back = serde.decode_submission(raw).vectors[0]
    assert back.codes is not None
    np.testing.assert_array_equal(back.codes, enc.codes)
    assert (back.value_bits, back.scale) == (3, float(enc.scales[0]))
    assert back.payload_bytes == math.ceil(15 / 8) + 4
    msg = serde.pb.SubmitRequest.FromString(raw)
    msg.vectors[0].value_count = 6  # 6 codes need 3 bytes; 2 are sent
    with pytest.raises(serde.WireError, match="values_packed"):
        serde.decode_submission(msg.SerializeToString())
    msg.vectors[0].value_count = 5
    msg.vectors[0].value_bits = 32
    with pytest.raises(serde.WireError, match=r"value_bits must be in \[1, 31\]"):
        serde.decode_submission(msg.SerializeToString())


def test_acked_quantized_submissions_survive_a_restart(tmp_path: Path) -> None:
    # Acked means durable: two clients' packed submissions are committed, the server stops,
    # a new one on the same database recovers the open round, the other two submit, and the
    # decode uses all four exactly as the library would.
    cfg = replace(base_config(), n=N, k=K, d=D, rounds=1, value_bits=2,
                  estimator="rand-proj-spatial", db=str(tmp_path / "bits.db"))
    xs = correlated_vectors(N, D, 2.0, seed=4)
    with in_process_server(cfg) as srv:
        target = f"127.0.0.1:{srv.port}"
        clients = [AggregationClient(target, f"c{i}", insecure=True) for i in range(N)]
        for c in clients:
            c.join()
        rnd = clients[0].current_round()
        subs = {c.client_id: c.encode(rnd, xs[c.index]) for c in clients}
        for c in clients[:2]:
            c.submit_encoded(subs[c.client_id])
        for c in clients:
            c.close()
    with in_process_server(replace(cfg, grpc_port=0)) as srv:
        target = f"127.0.0.1:{srv.port}"
        clients = [AggregationClient(target, f"c{i}", insecure=True) for i in range(N)]
        for c in clients[2:]:
            c.join()
            c.submit_encoded(subs[c.client_id])
        res = clients[0].result(rnd.round_id, wait=True, timeout=60)
        est = srv.running.engine.planner.estimator(None)
        for c in clients:
            c.close()
    assert res.state == "done" and res.n_prime == N
    ordered = [serde.decode_submission(serde.encode_submission(subs[f"c{i}"])) for i in range(N)]
    assert res.estimate is not None
    np.testing.assert_array_equal(res.estimate[0],
                                  est.decode(messages(ordered, rnd.nonce, cfg.estimator, K, D, 0)))
