"""Wire bytes: a reply as Flower 1.42 pushes it, counted by ``wire_bytes`` and checked
against Flower's own object push, and the strategy's byte metrics built on it."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import (
    inflate_object_from_contents,
    push_objects,
)

from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.carrier import payload_bytes
from rpsagg_flower.records import BUNDLE_KEY, STYPE_BUNDLE, STYPE_RAW, bundle, unbundle
from rpsagg_flower.wire import distinct_wire_bytes, wire_bytes

from .flower_util import adding_app, context, model, run_round, seeds, sent

pytestmark = pytest.mark.unit

SHAPES = {"w": ((40,), "float32"), "b": ((20,), "float32"), "count": ((), "int64")}


def _pushed(msg: Message) -> dict[str, bytes]:
    """The object contents Flower's ``push_objects`` sends for ``msg``, by object id."""
    sent: dict[str, bytes] = {}

    def push(object_id: str, content: bytes) -> None:
        assert object_id not in sent
        sent[object_id] = content

    push_objects(get_all_nested_objects(msg), push, max_concurrent_pushes=1)
    return sent


def _updates(d: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(5)
    return {node: rng.standard_normal(d) for node in range(1, 4)}


@pytest.mark.parametrize("mod", [False, True])
def test_wire_bytes_are_what_flower_pushes(mod: bool) -> None:
    """FedAvg's reply and a compressed one: wire_bytes is the sum of the contents Flower's
    push sends, and those contents inflate back into the reply."""
    arrays = model(SHAPES, fill=None)
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=10, value_bits=4)
    ups = {node: np.zeros(61) for node in range(1, 4)}
    rnd = run_round(strategy, arrays, ups, mod=make_rpsagg_mod(seeds(99).__next__))
    msg = rnd.messages[0]
    reply = (rnd.replies[0] if mod
             else adding_app(np.ones(61), None)(msg, context(msg.metadata.dst_node_id)))
    sent = _pushed(reply)
    assert wire_bytes(reply) == sum(len(c) for c in sent.values())
    back = inflate_object_from_contents(reply.object_id, sent)
    assert isinstance(back, Message)
    assert back.content.object_id == reply.content.object_id
    assert wire_bytes(reply.content) == wire_bytes(reply) - len(reply.deflate())


def test_identical_objects_are_counted_once() -> None:
    """Two arrays of the same values are one chunk object on the wire."""
    zeros = ArrayRecord({"a": Array(np.zeros(100, np.float32)),
                         "b": Array(np.zeros(100, np.float32))})
    one = ArrayRecord({"a": Array(np.zeros(100, np.float32))})
    chunk = 100 * 4
    assert wire_bytes(zeros) < wire_bytes(one) + chunk
    sizes: dict[str, int] = {}
    assert wire_bytes(zeros, sizes) == wire_bytes(zeros) == wire_bytes(zeros, sizes)
    assert sizes


def test_distinct_wire_bytes_count_repeats() -> None:
    """A fresh model's identical arrays count as the distinct trained ones they become."""
    fresh = ArrayRecord({"a": Array(np.zeros(100, np.float32)),
                         "b": Array(np.zeros(100, np.float32))})
    trained = ArrayRecord({"a": Array(np.arange(100, dtype=np.float32)),
                           "b": Array(-np.arange(1, 101, dtype=np.float32))})
    assert distinct_wire_bytes(fresh) == distinct_wire_bytes(trained) == wire_bytes(trained)
    assert wire_bytes(fresh) < wire_bytes(trained)


def test_strategy_reports_wire_bytes_and_payload() -> None:
    """bytes-up is the replies' wire bytes; payload-bytes-up their compressed records'
    count_bytes; the uncompressed figure the same replies with the model's arrays, as
    FedAvg's ClientApp returns them."""
    arrays = model(SHAPES, fill=None)
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=10, value_bits=4, weighted=False)
    ups = _updates(61)
    rnd = run_round(strategy, arrays, ups, mod=make_rpsagg_mod(seeds(7).__next__))
    assert rnd.metrics is not None
    m = rnd.metrics
    assert m["rpsagg.bytes-up"] == sum(wire_bytes(r) for r in rnd.replies)
    payload = sum(r.content["arrays"].count_bytes() for r in rnd.replies)
    assert payload == sum(payload_bytes(r.content) for r in rnd.replies)
    assert m["rpsagg.payload-bytes-up"] == payload
    fedavg = []
    for msg in rnd.messages:
        reply = adding_app(ups[msg.metadata.dst_node_id], None)(
            msg, context(msg.metadata.dst_node_id))
        fedavg.append(wire_bytes(reply))  # FedAvg's reply: the trained arrays
    assert m["rpsagg.bytes-up-uncompressed"] == sum(fedavg)
    assert m["rpsagg.compression-ratio"] == pytest.approx(sum(fedavg) / m["rpsagg.bytes-up"])
    assert m["rpsagg.bytes-up"] > payload


def test_metric_and_config_records_are_counted() -> None:
    """A reply's other records travel too."""
    base = RecordDict({"arrays": ArrayRecord({"a": Array(np.ones(3))})})
    more = RecordDict({"arrays": base["arrays"], "metrics": MetricRecord({"x": 1.0}),
                       "cfg": ConfigRecord({"y": b"12345678"})})
    assert wire_bytes(more) > wire_bytes(base) + 8


def test_bundle_round_trips_and_refuses_malformed() -> None:
    """rpsagg-flower 0.1's replies sent the arrays as one bundle; unbundle gives them back,
    raw, in order."""
    raw = {"codes": np.arange(7, dtype=np.uint8), "scale": np.array([0.5], np.float32),
           "plain/n": np.array(3, np.int64), "plain/m": np.array([[True, False]])}
    arrays = {k: Array(dtype=str(v.dtype), shape=tuple(v.shape), stype=STYPE_RAW,
                       data=v.tobytes()) for k, v in raw.items()}
    packed = bundle(arrays)
    assert list(packed.keys()) == [BUNDLE_KEY]
    back = unbundle(packed)
    assert list(back.keys()) == list(raw)
    for key, value in raw.items():
        assert back[key].data == value.tobytes() and tuple(back[key].shape) == value.shape
        assert back[key].dtype == str(value.dtype)
    data = packed[BUNDLE_KEY].data
    for bad in (data[:-1], data + b"\0", data[:3], b"\xff\xff\x00\x00" + data[4:]):
        spoiled = ArrayRecord({BUNDLE_KEY: Array(dtype="uint8", shape=(len(bad),),
                                                 stype=STYPE_BUNDLE, data=bad)})
        with pytest.raises(ValueError, match="bundle"):
            unbundle(spoiled)
    apart = ArrayRecord(arrays)
    assert unbundle(apart) is apart  # 0.1's replies: each array apart
    assert wire_bytes(apart) - wire_bytes(packed) > 3 * 250  # ~340 B an array less


def test_compressed_reply_overhead_is_small() -> None:
    """A 4-bit reply with three plain arrays: beyond the data, the reply has the Message,
    the RecordDict and the metrics a FedAvg reply has, and in the model's place one
    ConfigRecord whose own overhead and packed header are a few dozen bytes
    (tests/flower/test_reply.py derives the bound)."""
    arrays = model(SHAPES, fill=None)
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=10, value_bits=4,
                                     uncompressed=["b"])
    rnd = run_round(strategy, arrays, _updates(61), mod=make_rpsagg_mod(seeds(3).__next__))
    reply = rnd.replies[0]
    data = sum(len(a.data) for a in sent(reply, strategy, arrays).arrays.values())
    assert list(reply.content.keys()) == ["arrays", "metrics"]
    fedavg = adding_app(np.ones(61), None)(rnd.messages[0], context(1))
    shell = wire_bytes(reply) - wire_bytes(reply.content["arrays"])
    assert shell == wire_bytes(fedavg) - wire_bytes(fedavg.content["arrays"])
    assert wire_bytes(reply.content["arrays"]) - data <= 80
