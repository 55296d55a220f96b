"""rpsagg_mod on its own: what it sends, what it lets through, what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode

from rpsagg import make_estimator
from rpsagg._quantize import unpack_codes
from rpsagg.spec import derive_round_seed
from rpsagg_flower import make_rpsagg_mod, rpsagg_mod
from rpsagg_flower.carrier import REPLY_KEY, payload_records, read_reply
from rpsagg_flower.payload import Layout
from rpsagg_flower.records import STYPE_RAW
from rpsagg_flower.settings import RoundEncoding, nonce_from_bytes

from .flower_util import adding_app, context, model

pytestmark = pytest.mark.unit

SHAPES = {"w": ((6, 8), "float32"), "b": ((12,), "float32")}  # d = 60
NONCE = 0xFEDC_BA98_7654_3210


def instruction(config: ConfigRecord, arrays: ArrayRecord | None = None,
                message_type: str = MessageType.TRAIN, node: int = 77) -> Message:
    content = RecordDict({"arrays": arrays or model(SHAPES), "config": config})
    return Message(content, dst_node_id=node, message_type=message_type)


def round_config(**changes: object) -> ConfigRecord:
    fields: dict[str, object] = {"scheme": "rand-proj-spatial", "k": 10, "d": 60,
                                 "nonce": NONCE, "weight_key": "num-examples"}
    fields.update(changes)
    config = ConfigRecord({"server-round": 3})
    RoundEncoding(**fields).to_config(config)  # type: ignore[arg-type]
    return config


def test_reply_carries_k_values_and_the_seed() -> None:
    """The reply's arrays are k raw float32 values; the seed it carries with the nonce and
    the node id reproduces the values with rpsagg (the update times its weight, 100)."""
    update = np.linspace(-1, 1, 60)
    out = make_rpsagg_mod(lambda: 12345)(instruction(round_config()), context(77),
                                         adding_app(update, 100.0))
    assert not out.has_error()
    # one record in the model's place: a ConfigRecord of one bytes entry
    assert list(out.content.keys()) == ["arrays", "metrics"] and not out.content.array_records
    assert list(out.content.config_records["arrays"].keys()) == [REPLY_KEY]
    reply = read_reply(out.content, Layout.of(model(SHAPES)))
    assert reply is not None and reply.records == ("arrays",)
    arrays = reply.arrays
    assert list(arrays.keys()) == ["values"]
    values = arrays["values"]
    assert (values.stype, values.dtype, values.shape) == (STYPE_RAW, "float32", (10,))
    meta = reply.meta
    assert nonce_from_bytes(meta["seed"]) == 12345 and nonce_from_bytes(meta["nonce"]) == NONCE
    assert meta["scheme"] == "rand-proj-spatial:hblocks" and meta["count"] == 10
    # the ClientApp's reply went through float32 arrays: the delta is that of float32 values
    delta = (update.astype(np.float32).astype(np.float64))
    want = make_estimator("rand-proj-spatial", n=1, k=10, d=60).encode(
        100.0 * delta, derive_round_seed(12345, NONCE, "77"))
    np.testing.assert_array_equal(np.frombuffer(values.data, "<f4"), want.values)
    assert out.content["metrics"]["num-examples"] == 100.0  # the client's metrics untouched


def test_quantized_values_travel_as_packed_codes() -> None:
    out = make_rpsagg_mod(lambda: 99)(
        instruction(round_config(value_bits=3, weight_key="")), context(77),
        adding_app(np.linspace(-1, 1, 60), None))
    assert not out.has_error()
    reply = read_reply(out.content, Layout.of(model(SHAPES)))
    assert reply is not None
    arrays = reply.arrays
    assert sorted(arrays.keys()) == ["codes", "scale"]
    assert len(arrays["codes"].data) == (10 * 3 + 7) // 8
    codes = unpack_codes(arrays["codes"].data, 10, 3)
    assert codes.max() <= 7
    want = make_estimator("rand-proj-spatial", n=1, k=10, d=60, value_bits=3).encode(
        np.linspace(-1, 1, 60).astype(np.float32).astype(np.float64),
        derive_round_seed(99, NONCE, "77"))
    np.testing.assert_array_equal(codes, want.codes)


def test_other_messages_pass_through_unchanged() -> None:
    """Evaluate messages and training rounds of another strategy are not touched."""
    app = adding_app(np.ones(60), 5.0)
    for msg in (instruction(round_config(), message_type=MessageType.EVALUATE),
                instruction(ConfigRecord({"lr": 0.1}))):
        out = rpsagg_mod(msg, context(77), app)
        assert not out.has_error() and payload_records(out.content) == ["arrays"]
        assert read_reply(out.content, Layout.of(model(SHAPES))) is None
        w, b = out.content["arrays"].to_numpy_ndarrays()
        assert w.shape == (6, 8) and np.all(w == 1.0) and np.all(b == 1.0)


def test_refusals_are_error_replies() -> None:
    """Integer arrays, a model of another size, a missing weight metric and a malformed
    config become MOD_FAILED_PRECONDITION error replies (the strategy counts them as
    failures), never a wrong update."""
    ints = ArrayRecord({"n": Array(np.zeros(60, np.int64))})
    cases = [
        (instruction(round_config(), ints), adding_app(np.ones(60), 1.0), "floating-point"),
        (instruction(round_config(d=61)), adding_app(np.ones(60), 1.0), "the round says 61"),
        (instruction(round_config()), adding_app(np.ones(60), None), "num-examples"),
    ]
    broken = round_config()
    del broken["rpsagg.nonce"]
    cases.append((instruction(broken), adding_app(np.ones(60), 1.0), "rpsagg.nonce"))

    def no_weight(app):  # type: ignore[no-untyped-def]
        def inner(msg, ctxt):  # type: ignore[no-untyped-def]
            reply = app(msg, ctxt)
            reply.content["metrics"] = MetricRecord({})
            return reply
        return inner

    cases[2] = (cases[2][0], no_weight(cases[2][1]), "num-examples")
    for msg, app, reason in cases:
        out = rpsagg_mod(msg, context(77), app)
        assert out.has_error(), reason
        assert out.error.code == ErrorCode.MOD_FAILED_PRECONDITION
        assert reason in out.error.reason


def test_client_app_errors_are_passed_on() -> None:
    from flwr.app import Error

    def crashing(msg, ctxt):  # type: ignore[no-untyped-def]
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="boom"),
                       reply_to=msg)

    out = rpsagg_mod(instruction(round_config()), context(77), crashing)
    assert out.has_error() and out.error.reason == "boom"
