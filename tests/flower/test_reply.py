"""The packed reply: one record in the model's place, a header of a few dozen bytes.

Bound on a compressed reply's overhead (its wire bytes beyond the data it carries: codes
or values, scales, indices, the uncompressed arrays), for a packed reply of ``P`` bytes:

* the ``ConfigRecord`` that carries it, as Flower deflates it: the header
  ``"ConfigRecord" + " " + "" + " " + str(len(body)) + "\\0"`` (15 B and the body length's
  digits) and the protobuf body, one item (tag and length), its key (tag, length,
  ``"rpsagg"``: 8 B) and its value (tag and length) holding the bytes (tag and length):
  ``P + 17`` for ``128 <= P`` and ``P + 17 < 2^14``, so 19 + 17 = **36 B** for a reply of
  1 to 10 KB; at most 15 + 7 + 3 * (1 + 4) + 8 = 45 B up to 5 MiB (7 digits, 4-byte
  varints);
* the packed header: 21 B (version, seed, nonce, layout digest), the scheme (1 B; 2 B
  blockwise), value bits and flags (2 B), the two bitmaps (``2 ceil(A / 8)`` for ``A``
  arrays), the message count (1 B) and per message 1 B of parts and the varints of its
  count and scale count: **33 B** for one message of ``128 <= count < 2^14`` values with
  one scale and a model of 9 to 16 arrays (the example's CNN).

So the example's CNN replies with 69 B beyond its data, and every other record of its
reply (the ``Message``, the ``RecordDict``, the metrics) is what FedAvg's reply sends too:
``test_overhead_is_the_derived_bound`` checks both, byte for byte.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower import carrier as carrier_mod
from rpsagg_flower.carrier import REPLY_KEY, STYPE_REPLY, payload_records, read_reply, reply_record
from rpsagg_flower.payload import Layout, marks_to_bytes
from rpsagg_flower.records import REPLY_CONFIG
from rpsagg_flower.reply import (
    BLOCK_CODE,
    SCHEME_CODES,
    _scheme_bytes,
    layout_digest,
    pack_reply,
    unpack_reply,
)
from rpsagg_flower.wire import wire_bytes

from .flower_util import adding_app, context, layout_of, model, run_round, seeds, sent
from .test_wire import _pushed

pytestmark = pytest.mark.unit

# every kind of array: compressed float32/float64, a float kept uncompressed, an int64
# counter, a boolean mask, a frozen array; d = 48 + 12 = 60
SHAPES = {
    "w": ((6, 8), "float32"),
    "b": ((12,), "float64"),
    "stat": ((4,), "float32"),
    "count": ((), "int64"),
    "mask": ((5,), "bool"),
    "emb": ((3,), "float32"),
}
NODES = [1, 2, 3]


def _updates(zero_b: bool = False) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(8)
    out = {}
    for node in NODES:
        u = rng.standard_normal(sum(int(np.prod(s)) for s, _ in SHAPES.values()))
        u[60 + 4 + 1 + 5 :] = 0.0  # emb (frozen) unchanged
        if zero_b and node == 2:
            u[48:60] = 0.0
        out[node] = u
    return out


def _strategy(estimator: str = "rand-proj-spatial", **kw: object) -> RandProjSpatialFedAvg:
    kw.setdefault("k", 10)
    return RandProjSpatialFedAvg(estimator, uncompressed=["stat"], frozen=["emb"],
                                 weighted=False, nonces=seeds(40).__next__,
                                 **kw)  # type: ignore[arg-type]


CASES = {
    "rand-proj-spatial float32": ("rand-proj-spatial", {}),
    "rand-proj-spatial 4-bit": ("rand-proj-spatial", {"value_bits": 4}),
    "rand-k indices": ("rand-k-wangni", {}),
    "induced": ("induced", {}),
    "eden 2-bit": ("eden", {"bits": 2, "k": None}),
    "qsgd 3-bit": ("qsgd", {"bits": 3, "k": None}),
    "per layer 5-bit": ("rand-k-spatial", {"per_layer": True, "value_bits": 5}),
    "per layer float32": ("rand-proj-spatial", {"per_layer": True}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_packed_replies_round_trip_and_decode(case: str) -> None:
    """Every kind of message packs and unpacks to the same view and the same bytes; the
    strategy decodes every reply (node 2's ``b`` is zero: a smaller sketch, or an empty
    layer)."""
    estimator, kw = CASES[case]
    strategy = _strategy(estimator, **kw)
    arrays = model(SHAPES, fill=None)
    rnd = run_round(strategy, arrays, _updates(zero_b=True),
                    mod=make_rpsagg_mod(seeds(70).__next__))
    assert rnd.metrics is not None and rnd.metrics["rpsagg.n-prime"] == len(NODES)
    layout = layout_of(strategy, arrays)
    for r in rnd.replies:
        assert list(r.content.keys()) == ["arrays", "metrics"] and not r.content.array_records
        packed = r.content["arrays"][REPLY_KEY]
        assert isinstance(packed, bytes)
        view = sent(r, strategy, arrays)
        assert view.records == ("arrays",) and view.model_record == "arrays"
        assert "plain/emb" not in view.arrays and "plain/stat" in view.arrays
        assert pack_reply(view.arrays, view.meta, layout) == packed
        again_arrays, again_meta = unpack_reply(packed, layout)
        assert dict(again_meta) == dict(view.meta)
        assert list(again_arrays.keys()) == list(view.arrays.keys())
        for key, arr in view.arrays.items():
            other = again_arrays[key]
            assert (other.dtype, tuple(other.shape), other.stype, other.data) == (
                arr.dtype, tuple(arr.shape), arr.stype, arr.data)


def test_an_empty_sketch_and_absent_arrays_pack() -> None:
    """A reply whose compressed arrays are all unchanged sends no sketch (count 0); a
    partial reply sends no plain array it lacks."""
    arrays = model(SHAPES, fill=None)
    strategy = _strategy(partial="allow")
    ups = {n: np.zeros(sum(int(np.prod(s)) for s, _ in SHAPES.values())) for n in NODES}
    rnd = run_round(strategy, arrays, ups)
    assert rnd.arrays is not None
    view = sent(rnd.replies[0], strategy, arrays)
    assert view.meta["count"] == 0 and not any(k.startswith(("values", "codes"))
                                              for k in view.arrays)
    layout = layout_of(strategy, arrays)
    meta = ConfigRecord(dict(view.meta))
    meta["absent"] = marks_to_bytes([k in ("stat", "mask") for k in layout.keys])
    partial = ArrayRecord({k: a for k, a in view.arrays.items()
                           if k not in ("plain/stat", "plain/mask")})
    packed = pack_reply(partial, meta, layout)
    back, back_meta = unpack_reply(packed, layout)
    assert list(back.keys()) == ["plain/count"] and back_meta["absent"] == meta["absent"]
    with pytest.raises(ValueError, match="does not describe: \\['plain/stat'\\]"):
        pack_reply(ArrayRecord({**partial, "plain/stat": view.arrays["plain/stat"]}), meta,
                   layout)


def test_scheme_codes() -> None:
    """One byte for every scheme of the library, two for blockwise; other names in full."""
    for name, code in SCHEME_CODES.items():
        assert _scheme_bytes(name) == bytes([code])
    assert _scheme_bytes("rand-proj-spatial:block=262144") == bytes([BLOCK_CODE, 18])
    assert _scheme_bytes("custom:x") == b"\0\x08custom:x"
    assert _scheme_bytes("rand-proj-spatial:block=3")[0] == 0  # not a power of two
    with pytest.raises(ValueError, match="longer than 255"):
        _scheme_bytes("x" * 256)
    layout = Layout.of(model({"w": ((4,), "float32")}))
    for scheme in ("rand-proj-spatial:block=262144", "custom:x", "qsgd"):
        meta = ConfigRecord({"seed": bytes(8), "nonce": bytes(8), "scheme": scheme,
                             "count": 0, "value-bits": 32, "zero": b"\0", "absent": b"\0"})
        assert unpack_reply(pack_reply(ArrayRecord(), meta, layout), layout)[1]["scheme"] \
            == scheme


def _cnn_like() -> tuple[RandProjSpatialFedAvg, ArrayRecord, Message, Message]:
    """16 arrays (as the example's CNN), 6 of them uncompressed, one 4-bit message of 2,000
    values: a compressed reply and FedAvg's reply to the same instruction."""
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for j in (1, 2):
        shapes |= {f"conv{j}.weight": ((8, 8), "float32"), f"conv{j}.bias": ((8,), "float32"),
                   f"bn{j}.weight": ((8,), "float32"), f"bn{j}.bias": ((8,), "float32"),
                   f"bn{j}.running_mean": ((8,), "float32"),
                   f"bn{j}.running_var": ((8,), "float32"),
                   f"bn{j}.num_batches_tracked": ((), "int64")}
    shapes |= {"fc.weight": ((10, 300), "float32"), "fc.bias": ((10,), "float32")}
    stats = [k for k in shapes if "running" in k]
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=2000, value_bits=4,
                                     uncompressed=stats, nonces=seeds(4).__next__)
    arrays = model(shapes, fill=None)
    d = sum(int(np.prod(s)) for s, _ in shapes.values())
    ups = {n: np.random.default_rng(n).standard_normal(d) for n in NODES}
    rnd = run_round(strategy, arrays, ups, mod=make_rpsagg_mod(seeds(5).__next__))
    fedavg = adding_app(ups[1], None)(rnd.messages[0], context(1))
    assert rnd.metrics is not None and rnd.metrics["rpsagg.n-prime"] == len(NODES)
    return strategy, arrays, rnd.replies[0], fedavg


def test_overhead_is_the_derived_bound() -> None:
    """The module docstring's bound, byte for byte: 36 B of ConfigRecord and a 33-byte
    header beyond the data; every other object of the reply is the size of FedAvg's."""
    strategy, arrays, reply, fedavg = _cnn_like()
    layout = layout_of(strategy, arrays)
    assert len(layout.keys) == 16 and len(layout.plain_keys) == 6
    view = sent(reply, strategy, arrays)
    data = sum(len(a.data) for a in view.arrays.values())
    assert data == 1000 + 4 + 4 * 8 * 4 + 2 * 8  # codes, scale, statistics, counters
    packed = reply.content["arrays"][REPLY_KEY]
    assert isinstance(packed, bytes)
    assert len(packed) - data == 33
    carrier = wire_bytes(reply.content["arrays"])
    assert carrier - len(packed) == 36
    assert carrier - data == 69 <= 45 + 33
    shell = wire_bytes(reply) - carrier
    assert shell == wire_bytes(fedavg) - wire_bytes(fedavg.content["arrays"])


def test_wire_bytes_are_what_flower_pushes_for_both_carriers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConfigRecord and, past CONFIG_LIMIT, the ArrayRecord carrier: wire_bytes is what
    Flower's push sends, the strategy decodes both to the same model, and the FedAvg
    figure is the same."""
    results = []
    for limit in (carrier_mod.CONFIG_LIMIT, 64):
        monkeypatch.setattr(carrier_mod, "CONFIG_LIMIT", limit)
        random.seed(3)  # FedAvg's sampling order: which node draws which client seed
        strategy = _strategy(value_bits=6)
        arrays = model(SHAPES, fill=None)
        rnd = run_round(strategy, arrays, _updates(), mod=make_rpsagg_mod(seeds(9).__next__))
        assert rnd.arrays is not None and rnd.metrics is not None
        reply = rnd.replies[0]
        pushed = _pushed(reply)
        assert wire_bytes(reply) == sum(len(c) for c in pushed.values())
        carrier = reply.content["arrays"]
        if limit == 64:
            assert isinstance(carrier, ArrayRecord)
            assert carrier[REPLY_KEY].stype == STYPE_REPLY
            assert payload_records(reply.content) == ["arrays"]
        else:
            assert isinstance(carrier, ConfigRecord)
        results.append((rnd.arrays, rnd.metrics))
    (a, ma), (b, mb) = results
    for x, y in zip(a.to_numpy_ndarrays(), b.to_numpy_ndarrays(), strict=True):
        np.testing.assert_array_equal(x, y)
    assert ma["rpsagg.bytes-up-uncompressed"] == mb["rpsagg.bytes-up-uncompressed"]
    assert mb["rpsagg.bytes-up"] - ma["rpsagg.bytes-up"] > 3 * 250  # an Array and its chunk


def _valid() -> tuple[bytes, Layout, RandProjSpatialFedAvg, ArrayRecord, Message]:
    strategy = _strategy(value_bits=4)
    arrays = model(SHAPES, fill=None)
    rnd = run_round(strategy, arrays, _updates(), mod=make_rpsagg_mod(seeds(11).__next__))
    packed = rnd.replies[0].content["arrays"][REPLY_KEY]
    assert isinstance(packed, bytes)
    return packed, layout_of(strategy, arrays), strategy, arrays, rnd.replies[0]


def _spoiled(packed: bytes, at: int, value: int) -> bytes:
    return packed[:at] + bytes([value]) + packed[at + 1 :]


def test_malformed_packed_replies_are_refused_clearly() -> None:
    packed, layout, *_ = _valid()
    head = 21 + 1 + 2  # fixed part, scheme, bits and flags; then the bitmaps (1 B each)
    cases = [
        (b"", "0 B, shorter than its 21-byte start"),
        (packed[:20], "20 B, shorter"),
        (_spoiled(packed, 0, 1), "format version 1; this server reads version 2"),
        (_spoiled(packed, 17, packed[17] ^ 1), "packed for another model"),
        (_spoiled(packed, 21, 200), "unknown scheme code 200"),
        (_spoiled(packed, 22, 0), "0 value bits"),
        (_spoiled(packed, 22, 33), "33 value bits"),
        (_spoiled(packed, 23, 0x80), "flags 0x80"),
        (_spoiled(packed, head, 0x40), "'zero' bitmap sets bits past the model's 6 arrays"),
        (_spoiled(packed, head + 1, 0x80), "'absent' bitmap sets bits"),
        (_spoiled(packed, head + 2, 2), "2 messages"),
        (_spoiled(packed, head + 3, 4), "message 0 has parts 0x4"),
        (_spoiled(packed, head + 3, 2), "message 0 has parts 0x2"),
        (packed[: head + 3] + bytes([1]) + b"\xff" * 11, "not a varint"),
        (packed + b"\0", "1 B past its end"),
        (packed[:-1], "ends 1 B early, in uncompressed array 'mask'"),
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match.replace("(", "\\(")):
            unpack_reply(bad, layout)
    for cut in range(len(packed)):  # every truncation is refused
        with pytest.raises(ValueError):
            unpack_reply(packed[:cut], layout)
    other = Layout.of(model({**SHAPES, "w": ((8, 6), "float32")}), ["stat"], ["emb"])
    assert layout_digest(other) != layout_digest(layout)
    with pytest.raises(ValueError, match="packed for another model"):
        unpack_reply(packed, other)


def test_malformed_carriers_are_refused_and_replies_dropped() -> None:
    """Two packed replies, an ArrayRecord beside one, a carrier Array that is not its own
    bytes: ValueError; the strategy drops such a reply and decodes the others."""
    packed, layout, _, arrays, reply = _valid()
    metrics = reply.content["metrics"]
    cases = {
        "2 compressed replies": RecordDict({"a": ConfigRecord({REPLY_KEY: packed}),
                                            "b": ConfigRecord({REPLY_KEY: packed}),
                                            "metrics": metrics}),
        "ArrayRecords \\['x'\\] beside": RecordDict({"arrays": ConfigRecord({REPLY_KEY: packed}),
                                                    "x": ArrayRecord(), "metrics": metrics}),
        "must be uint8": RecordDict({"arrays": ArrayRecord({REPLY_KEY: Array(
            dtype="int8", shape=(len(packed),), stype=STYPE_REPLY, data=packed)}),
            "metrics": metrics}),
        "2 ArrayRecords in a compressed reply": RecordDict({
            "a": ArrayRecord(), "b": ArrayRecord(), REPLY_CONFIG: ConfigRecord({"seed": b""}),
            "metrics": metrics}),
    }
    for match, content in cases.items():
        with pytest.raises(ValueError, match=match):
            read_reply(content, layout)
    assert read_reply(RecordDict({"arrays": arrays, "metrics": metrics}), layout) is None

    def spoil(replies: list[Message]) -> list[Message]:
        replies[0].content["arrays"][REPLY_KEY] = _spoiled(packed, 0, 9)
        return replies

    rnd = run_round(_strategy(value_bits=4), arrays, _updates(),
                    mod=make_rpsagg_mod(seeds(11).__next__), extra_replies=spoil)
    assert rnd.metrics is not None and rnd.metrics["rpsagg.n-prime"] == len(NODES) - 1


def test_reply_record_picks_the_carrier() -> None:
    # the limit is one of Flower's array chunks (its constant is not public API)
    assert carrier_mod.CONFIG_LIMIT == FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    small = reply_record(b"\2" * 10)
    assert isinstance(small, ConfigRecord) and small[REPLY_KEY] == b"\2" * 10
    big = reply_record(b"\2" * (carrier_mod.CONFIG_LIMIT + 1))
    assert isinstance(big, ArrayRecord) and big[REPLY_KEY].stype == STYPE_REPLY
    assert big[REPLY_KEY].dtype == "uint8" and tuple(big[REPLY_KEY].shape) == (
        carrier_mod.CONFIG_LIMIT + 1,)
