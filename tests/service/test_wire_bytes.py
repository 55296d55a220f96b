"""``wire_bytes`` is the serialized SubmitRequest without its references, in every mode.

Checked three ways: against protobuf's own serialization of the request with the reference
fields cleared, against the formula in docs/protocol.md ("What a submission costs"), and
end to end through a server, whose round results report the sum over the round.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from repo_paths import ROOT
from service_util import base_config, in_process_server

from rpsagg_client import AggregationClient
from rpsagg_wire.v1 import aggregation_pb2 as pb
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import Submission, VectorPayload

pytestmark = pytest.mark.service


def varint_len(x: int) -> int:
    """Bytes of a protobuf varint."""
    n = 1
    while x >= 128:
        x >>= 7
        n += 1
    return n


def field_len(payload: int) -> int:
    """A length-delimited field with a one-byte tag: tag + varint(length) + payload."""
    return 1 + varint_len(payload) + payload


def documented_wire_bytes(round_id: int, client_id: str, values: list[int],
                          indices: list[int], spec_version: str = "") -> int:
    """docs/protocol.md's formula (round_id >= 1 and client_seed != 0, so both are sent)."""
    total = 1 + varint_len(round_id) + field_len(len(client_id.encode())) + 9
    if spec_version:  # an empty string is not sent
        total += field_len(len(spec_version.encode()))
    for count, idx in zip(values, indices, strict=True):
        inner = field_len(4 * count) + (field_len(4 * idx) if idx else 0)
        total += field_len(inner)
    return total


def without_references(raw: bytes) -> bytes:
    msg = pb.SubmitRequest.FromString(raw)
    for v in msg.vectors:
        v.ClearField("reference_f64")
    return bytes(msg.SerializeToString(deterministic=True))


def make_submission(rng: np.random.Generator, round_id: int, client_id: str, m: int, k: int,
                    d: int, with_indices: bool, with_refs: bool) -> Submission:
    vectors = tuple(
        VectorPayload(rng.normal(size=k).astype(np.float32),
                      rng.integers(0, d, size=k) if with_indices else None,
                      rng.normal(size=d) if with_refs else None)
        for _ in range(m))
    return Submission(round_id, client_id, int(rng.integers(1, 2**63)), vectors)


@pytest.mark.parametrize("with_refs", [False, True], ids=["plain", "eval"])
@pytest.mark.parametrize("with_indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize(("m", "k", "d"), [(1, 8, 16), (1, 102, 1024), (3, 31, 128),
                                           (1, 128, 4096), (2, 1, 2048), (1, 4000, 16384)])
def test_wire_bytes_is_the_request_without_references(m: int, k: int, d: int,
                                                      with_indices: bool,
                                                      with_refs: bool) -> None:
    # the sizes cross the varint boundaries of the vector and reference length prefixes
    # (127/128 and 16383/16384 bytes) with and without the references
    rng = np.random.default_rng(m * 100_003 + k * 1009 + d)
    for round_id, client_id in ((1, "c"), (300, "client-3"), (2**40, "x" * 128)):
        sub = make_submission(rng, round_id, client_id, m, k, d, with_indices, with_refs)
        raw = serde.serializer("Submit")(sub)
        got = serde.parse_request("Submit", raw).wire_bytes
        bare = without_references(raw)
        assert got == len(bare)
        assert got == documented_wire_bytes(round_id, client_id, [k] * m,
                                            [k if with_indices else 0] * m)
        if with_refs:  # the references are excluded, whatever they added
            assert len(raw) > got + 8 * d * m
        else:
            assert got == len(raw)


@pytest.mark.parametrize("eval_mode", [False, True], ids=["plain", "eval"])
def test_round_wire_bytes_reported_by_the_server(eval_mode: bool) -> None:
    n, k, d = 2, 8, 128
    cfg = base_config(n=n, k=k, d=d, rounds=1, eval=eval_mode)
    rng = np.random.default_rng(11)
    with in_process_server(cfg) as srv:
        clients = [AggregationClient(f"127.0.0.1:{srv.port}", f"client-{i}", insecure=True,
                                     timeout=30.0) for i in range(n)]
        try:
            for c in clients:
                c.join()
            rnd = clients[0].current_round()
            expected = 0
            for c in clients:
                sub = c.encode(rnd, rng.normal(size=(rnd.m, d)))
                raw = serde.serializer("Submit")(sub)
                expected += len(without_references(raw))
                c.submit_encoded(sub)
            res = clients[0].result(rnd.round_id, wait=True)
        finally:
            for c in clients:
                c.close()
    assert res.state == "done"
    # the same count whether the references rode along or not: 4k + 20 + len(id) + 2 here,
    # plus the spec version the client sends (the round's)
    assert sub.spec_version == rnd.spec_version
    assert res.wire_bytes == expected == n * documented_wire_bytes(
        rnd.round_id, "client-0", [k], [0], rnd.spec_version)


def test_protocol_doc_cost_figures() -> None:
    # docs/protocol.md "What a submission costs": the wire figures with the spec_version the
    # reference client sends for a float SRHT round (the round's, v1), and the payload, whose
    # seed is counted once per submission
    from rpsagg import make_estimator, round_encoding

    doc = (ROOT / "docs" / "protocol.md").read_text(
        encoding="utf-8")
    spec_version, projection, _ = round_encoding(
        make_estimator("rand-proj-spatial", n=2, k=128, d=4096))
    assert (spec_version, projection) == ("rpsagg-seed-v1", "srht")
    assert "`rpsagg-seed-v1` (the round's `RoundInfo.spec_version`)" in doc
    assert documented_wire_bytes(1, "client-3", [102], [0], spec_version) == 451
    assert documented_wire_bytes(1, "client-3", [128], [0], spec_version) == 555
    assert "451 bytes for\nk = 102" in doc and "555 bytes for k = 128" in doc

    def payload(m: int, k: int, value_bits: int = 32) -> int:
        est = make_estimator("rand-k", n=2, k=k, d=1024, value_bits=value_bits)
        vectors = []
        for j in range(m):
            msg = est.encode(np.arange(1024.0), j + 1)
            vectors.append(VectorPayload(
                msg.values if msg.codes is None else np.empty(0, np.float32), None, None,
                msg.codes, msg.value_bits,
                0.0 if msg.scales is None else float(msg.scales[0])))
        sub = Submission(1, "c", 1, tuple(vectors))
        parsed = serde.parse_request("Submit", serde.serializer("Submit")(sub))
        assert parsed.payload_bytes == sub.payload_bytes
        return sub.payload_bytes

    assert payload(1, 102) == 416 and "k = 102: 416 bytes" in doc
    assert payload(1, 102, value_bits=4) == 63 and "`--value-bits 4`, 63 bytes" in doc
    assert payload(4, 97) == 1560 and "k = 97, 1,560 bytes" in doc


def test_request_limit_counts_indices_only_where_sent() -> None:
    # docs/protocol.md: values at 4 bytes each (codes too), indices only for the schemes
    # that send them, d' values for EDEN and d for QSGD
    from rpsagg import make_estimator
    from rpsagg_server.process.grpcserver import max_request_bytes

    cfg = replace(base_config(), d=100, k=10)

    def limit(name: str, **opts: int) -> int:
        return max_request_bytes(cfg, 1, make_estimator(name, n=2, d=100, **opts).wire)

    def formula(values: int, indices: int) -> int:
        return int(1.25 * ((4 * values + 4 * indices + 32) + 1024)) + 4096

    assert limit("rand-proj-spatial", k=10) == formula(10, 0)
    assert limit("rand-proj-spatial", k=10, value_bits=4) == formula(10, 0)
    assert limit("induced", k=10) == formula(10, 10)
    assert limit("rand-k-wangni", k=10) == formula(100, 100)
    assert limit("eden", bits=2) == formula(128, 0)
    assert limit("qsgd", bits=2) == formula(100, 0)


def test_block_scales_round_trip() -> None:
    # docs/wire-format.md section 15: a quantized blockwise vector's scales travel in
    # Vector.scales_f32 (one float32 per block, little-endian), Vector.scale left 0
    codes = np.array([3, 0, 1, 2, 2, 1], dtype=np.uint32)
    scales = np.array([1.5, -0.0, 3.25], dtype=np.float32)
    vec = VectorPayload(np.zeros(0, np.float32), codes=codes, value_bits=2, scales=scales)
    sub = Submission(1, "c", 7, (vec,), spec_version="rpsagg-seed-v5")
    raw = serde.canonical_bytes(sub)
    msg = pb.SubmitRequest.FromString(raw)
    assert msg.vectors[0].scales_f32 == scales.astype("<f4").tobytes()
    assert msg.vectors[0].scale == 0.0
    back = serde._dec_submit(raw)
    got = back.vectors[0]
    assert got.scales is not None
    np.testing.assert_array_equal(got.scales.view(np.uint32), scales.view(np.uint32))
    np.testing.assert_array_equal(got.codes, codes)
    assert got.payload_bytes == 2 + 4 * 3
    plain = serde._dec_submit(serde.canonical_bytes(replace(sub, vectors=(replace(
        vec, scales=None, scale=1.5),))))
    assert plain.vectors[0].scales is None and plain.vectors[0].payload_bytes == 2 + 4
    bad = pb.SubmitRequest.FromString(raw)
    bad.vectors[0].scales_f32 = b"\0" * 5
    with pytest.raises(serde.WireError, match="scales_f32"):
        serde._dec_submit(bad.SerializeToString())
