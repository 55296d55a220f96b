"""No stalls, no crashes: error replies addressed to the instruction, non-float and excluded
arrays beside the sketch, Flower's DP wrappers and mods, replies without the payload.

Everything runs through flwr's own objects (``Message``, ``ClientApp`` with its mods, the DP
strategy wrappers of ``flwr.serverapp.strategy``); only the transport is left out.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.common.constant import ErrorCode
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
)
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM as FLOWER_KEY_CLIPPING_NORM
from flwr.supercore.differential_privacy import KEY_NORM_BIT

from rpsagg_flower import RandProjSpatialFedAvg, client_mods, make_rpsagg_mod, rpsagg_mod
from rpsagg_flower.carrier import REPLY_KEY, payload_records
from rpsagg_flower.records import PLAIN_PREFIX, bundle
from rpsagg_flower.settings import KEY_CLIPPING_NORM

from .flower_util import FakeGrid, adding_app, as_v01, context, model, run_round, seeds, sent
from .test_mod import instruction, round_config

pytestmark = pytest.mark.unit

# a PyTorch-like state dict: conv weight, BatchNorm's float statistics, its int64 counter,
# a boolean pruning mask; d (the compressed part) = 48 + 12 = 60 without the statistics
BN = {
    "conv.weight": ((6, 8), "float32"),
    "bn.weight": ((12,), "float32"),
    "bn.running_mean": ((12,), "float32"),
    "bn.num_batches_tracked": ((), "int64"),
    "mask": ((5,), "bool"),
}


def _delivered(msg: Message) -> Message:
    """``msg`` with the id the SuperLink gives it when it is pushed."""
    msg.metadata._message_id = msg.object_id  # type: ignore[attr-defined]
    return msg


def _assert_reply_to(reply: Message, msg: Message) -> None:
    """Routed as the SuperNode routes replies: back to the instruction's sender."""
    meta, sent = reply.metadata, msg.metadata
    assert meta.reply_to_message_id == sent.message_id != ""
    assert (meta.src_node_id, meta.dst_node_id) == (sent.dst_node_id, sent.src_node_id)
    assert meta.dst_task_id == sent.src_task_id
    assert meta.run_id == sent.run_id and meta.message_type == sent.message_type


def _two_records(msg: Message, ctxt: Context) -> Message:
    arrays = msg.content["arrays"]
    return Message(RecordDict({"a": arrays, "b": arrays,
                               "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)


def _wrong_shape(msg: Message, ctxt: Context) -> Message:
    arrays = ArrayRecord({"w": Array(np.zeros((6, 9), np.float32)),
                          "b": Array(np.zeros(12, np.float32))})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})}),
                   reply_to=msg)


def _no_weight(msg: Message, ctxt: Context) -> Message:
    reply = adding_app(np.ones(60), 1.0)(msg, ctxt)
    reply.content["metrics"] = MetricRecord({})
    return reply


@pytest.mark.parametrize("app, reason", [
    (_two_records, "one ArrayRecord in the reply"),
    (_wrong_shape, "has shape (6, 9)"),
    (_no_weight, "num-examples"),
])
def test_error_replies_are_addressed_from_the_instruction(app, reason) -> None:  # type: ignore[no-untyped-def]
    """A refusal after the ClientApp ran answers the instruction, not the ClientApp's
    reply (whose source and destination are the other way round: the SuperNode could not
    match it and the round would wait for Flower's timeout)."""
    msg = _delivered(instruction(round_config()))
    out = rpsagg_mod(msg, context(77), app)
    assert out.has_error() and reason in out.error.reason
    assert out.error.code == ErrorCode.MOD_FAILED_PRECONDITION
    _assert_reply_to(out, msg)


def test_refusal_before_the_client_app_is_addressed_too() -> None:
    msg = _delivered(instruction(round_config(d=61)))
    out = rpsagg_mod(msg, context(77), adding_app(np.ones(60), 1.0))
    assert out.has_error() and "the round says 61" in out.error.reason
    _assert_reply_to(out, msg)


# --- arrays that are not compressed ------------------------------------------------------

def _bn_app(node: int, update: np.ndarray):  # type: ignore[no-untyped-def]
    """A ClientApp that trains the float weights by ``update``, overwrites BatchNorm's
    running mean with a node-specific value, counts batches and prunes by node."""

    def app(msg: Message, ctxt: Context) -> Message:
        got = dict(zip(msg.content["arrays"].keys(), msg.content["arrays"].to_numpy_ndarrays(),
                       strict=True))
        out = {
            "conv.weight": (got["conv.weight"] + update[:48].reshape(6, 8)).astype(np.float32),
            "bn.weight": (got["bn.weight"] + update[48:]).astype(np.float32),
            "bn.running_mean": np.full(12, 0.5 * node, np.float32),
            "bn.num_batches_tracked": np.array(got["bn.num_batches_tracked"] + 10 * node,
                                               np.int64),
            "mask": np.arange(5) < node,
        }
        arrays = ArrayRecord({k: Array(v) for k, v in out.items()})
        metrics = MetricRecord({"num-examples": 100 * node})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


def test_integer_bool_and_excluded_arrays_travel_beside_the_sketch() -> None:
    """With ``"full"`` (exact values) the float part is the weighted mean update; the int64
    counter is the rounded weighted mean, the mask the weighted majority, the excluded
    running mean its weighted mean, each in its own dtype and shape. Weights 100, 200, 300:
    running mean (0.5*100 + 1.0*200 + 1.5*300) / 600 = 7/6; counter 7 + (10*100 + 20*200 +
    30*300) / 600 = 7 + 23.33 -> 30; mask: entry j is true for the nodes > j, so entries 0
    (weight 1) and 1 (5/6) are true, entry 2 (1/2: ties count as true) true, 3 and 4
    false."""
    strategy = RandProjSpatialFedAvg("full", k=60, uncompressed=["bn.running_mean"],
                                     nonces=iter(seeds(10)).__next__)
    arrays = model(BN)
    arrays["bn.num_batches_tracked"] = Array(np.array(7, np.int64))
    rng = np.random.default_rng(3)
    ups = {node: rng.standard_normal(60) for node in (1, 2, 3)}
    grid = FakeGrid([1, 2, 3])
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert messages[0].content["config"]["rpsagg.d"] == 60
    mod = make_rpsagg_mod(iter(seeds(50)).__next__)
    replies = [mod(m, context(m.metadata.dst_node_id),
                   _bn_app(m.metadata.dst_node_id, ups[m.metadata.dst_node_id]))
               for m in messages]
    for reply in replies:
        assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
        carried = sent(reply, strategy, arrays).arrays
        assert sorted(k for k in carried if k.startswith(PLAIN_PREFIX)) == [
            PLAIN_PREFIX + "bn.num_batches_tracked", PLAIN_PREFIX + "bn.running_mean",
            PLAIN_PREFIX + "mask"]
    new, metrics = strategy.aggregate_train(1, replies)
    assert new is not None and metrics is not None and metrics["rpsagg.n-prime"] == 3
    got = dict(zip(new.keys(), new.to_numpy_ndarrays(), strict=True))
    assert list(new.keys()) == list(BN)
    assert {k: (v.shape, str(v.dtype)) for k, v in got.items()} == {
        k: (shape, dtype) for k, (shape, dtype) in BN.items()}
    mean = sum(100 * n * ups[n] for n in ups) / 600
    np.testing.assert_allclose(got["conv.weight"].ravel(), mean[:48].astype(np.float32),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["bn.weight"], mean[48:].astype(np.float32), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got["bn.running_mean"], np.full(12, 7 / 6), rtol=1e-6)
    assert got["bn.num_batches_tracked"] == 30
    np.testing.assert_array_equal(got["mask"], [True, True, True, False, False])


def test_plain_arrays_are_counted_in_bytes_up() -> None:
    """bytes-up counts every byte of the compressed replies, the uncompressed arrays too."""
    arrays = model(BN)
    strategy = RandProjSpatialFedAvg("rand-k", k=6, weighted=False)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid([1, 2])))  # type: ignore[arg-type]
    replies = [rpsagg_mod(m, context(m.metadata.dst_node_id), _bn_app(1, np.ones(60)))
               for m in messages]
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics is not None
    wire = sum(r.content["arrays"].count_bytes() for r in replies)
    sketch = sum(len(sent(r, strategy, arrays).arrays["values"].data) for r in replies)
    assert metrics["rpsagg.payload-bytes-up"] == wire
    assert metrics["rpsagg.bytes-up"] > wire
    # the int64 counter and the boolean mask travel as they are (the running mean is a
    # float array not named uncompressed: in the sketch)
    plain = sum(len(a.data) for r in replies
                for key, a in sent(r, strategy, arrays).arrays.items() if key.startswith("plain/"))
    assert plain == 2 * (8 + 5)
    assert wire - sketch > plain


def test_plain_arrays_travel_raw_and_a_bad_one_drops_its_reply() -> None:
    """The uncompressed arrays are raw little-endian bytes, exactly their data (no NumPy
    header); replies in rpsagg-flower 0.1's records (a bundle, or the arrays apart with the
    plain ones in NumPy's format) still read the same; a packed reply a few bytes short,
    or a bundled raw array whose byte count does not match its shape, drops its reply, not
    the round. (The ``"full"`` estimator decodes exactly, so rounds 1 to 3 must give the
    same model.)"""
    strategy = RandProjSpatialFedAvg("full", k=60, uncompressed=["bn.running_mean"],
                                     nonces=iter(seeds(20)).__next__)
    mod = make_rpsagg_mod(iter(seeds(60)).__next__)

    def replies(rnd: int) -> list[Message]:
        grid = FakeGrid([1, 2, 3])
        msgs = list(strategy.configure_train(rnd, model(BN), ConfigRecord(), grid))  # type: ignore[arg-type]
        return [mod(m, context(m.metadata.dst_node_id),
                    _bn_app(m.metadata.dst_node_id, np.ones(60))) for m in msgs]

    first = replies(1)
    for reply in first:
        carried = sent(reply, strategy, model(BN)).arrays
        for key in ("bn.running_mean", "bn.num_batches_tracked", "mask"):
            arr = carried[PLAIN_PREFIX + key]
            shape, dtype = BN[key]
            assert arr.stype == "rpsagg.raw-le" and tuple(arr.shape) == shape
            assert len(arr.data) == np.zeros(shape, dtype).nbytes
    fine, _ = strategy.aggregate_train(1, first)
    bundled = replies(2)  # the same, as 0.1 sent them: a bundle and a ConfigRecord
    for reply in bundled:
        as_v01(reply, strategy, model(BN))
    again, _ = strategy.aggregate_train(2, bundled)
    old = replies(3)  # as 0.1 first sent them: apart, the plain arrays in NumPy's format
    for reply in old:
        apart = as_v01(reply, strategy, model(BN), bundled=False)
        for key in [k for k in apart if k.startswith(PLAIN_PREFIX)]:
            arr = apart[key]
            value = np.frombuffer(arr.data, np.dtype(arr.dtype).newbyteorder("<"))
            apart[key] = Array(value.astype(arr.dtype).reshape(tuple(arr.shape)))
            assert apart[key].stype != "rpsagg.raw-le"
    third, _ = strategy.aggregate_train(3, old)
    assert fine is not None and again is not None and third is not None
    for a, b, c in zip(fine.to_numpy_ndarrays(), again.to_numpy_ndarrays(),
                       third.to_numpy_ndarrays(), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    short = replies(4)  # a packed reply 4 bytes short: that reply is left out
    packed = short[1].content["arrays"][REPLY_KEY]
    assert isinstance(packed, bytes)
    short[1].content["arrays"][REPLY_KEY] = packed[:-4]
    _, metrics = strategy.aggregate_train(4, short)
    assert metrics is not None and metrics["rpsagg.n-prime"] == 2
    fifth = replies(5)  # 0.1's bundle with one truncated raw array: that reply is left out
    carried = as_v01(fifth[1], strategy, model(BN), bundled=False)
    bad = carried[PLAIN_PREFIX + "bn.running_mean"]
    carried[PLAIN_PREFIX + "bn.running_mean"] = Array(
        dtype=bad.dtype, shape=tuple(bad.shape), stype=bad.stype, data=bad.data[:-4])
    fifth[1].content["arrays"] = bundle(dict(carried.items()))
    _, metrics = strategy.aggregate_train(5, fifth)
    assert metrics is not None and metrics["rpsagg.n-prime"] == 2


def test_excluding_an_unknown_array_or_everything_fails_before_sending() -> None:
    grid = FakeGrid([1, 2])
    with pytest.raises(ValueError, match=r"lacks: \['bn\.nope'\]"):
        RandProjSpatialFedAvg("rand-k", k=2, uncompressed=["bn.nope"]).configure_train(
            1, model(BN), ConfigRecord(), grid)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no floating-point array left"):
        RandProjSpatialFedAvg("rand-k", k=2, uncompressed=["conv.weight", "bn.weight",
                                                           "bn.running_mean"]).configure_train(
            1, model(BN), ConfigRecord(), grid)  # type: ignore[arg-type]


# --- replies without the payload ---------------------------------------------------------

def _no_mod(msg: Message, ctxt: Context, call_next):  # type: ignore[no-untyped-def]
    return call_next(msg, ctxt)  # a ClientApp without rpsagg_mod


def test_reply_without_payload_fails_the_round_loudly() -> None:
    strategy = RandProjSpatialFedAvg("rand-k", k=6)
    with pytest.raises(RuntimeError, match="no rpsagg payload: is rpsagg_mod in the"):
        run_round(strategy, model({"w": ((60,), "float32")}), {1: np.ones(60), 2: np.ones(60)},
                  mod=_no_mod)


def test_reply_without_payload_is_dropped_when_configured() -> None:
    strategy = RandProjSpatialFedAvg("rand-k", k=6, missing_payload="drop")
    rnd = run_round(strategy, model({"w": ((60,), "float32")}), {1: np.ones(60), 2: np.ones(60)},
                    mod=_no_mod)
    assert rnd.arrays is None and rnd.metrics is None  # nothing usable: the model stays
    with pytest.raises(ValueError, match="missing_payload"):
        RandProjSpatialFedAvg("rand-k", k=6, missing_payload="ignore")


# --- differential privacy ----------------------------------------------------------------

SHAPES = {"w": ((6, 8), "float32"), "b": ((12,), "float32")}


def _clipping_app(mods: list, updates: dict[int, np.ndarray]) -> ClientApp:  # type: ignore[type-arg]
    app = ClientApp(mods=mods)

    @app.train()
    def train(msg: Message, ctxt: Context) -> Message:
        return adding_app(updates[ctxt.node_id], 100.0)(msg, ctxt)

    return app


def test_client_side_fixed_clipping_clips_before_compressing() -> None:
    """``client_mods(fixedclipping_mod)`` (the rpsagg mod, then Flower's clipping mod inside
    it) under DifferentialPrivacyClientSideFixedClipping
    (noise 0, ``"full"``: exact values): the new model is the weighted mean of the clipped
    updates (clipping to norm 1 of updates of norms 2 and 0.5)."""
    strategy = DifferentialPrivacyClientSideFixedClipping(
        RandProjSpatialFedAvg("full", k=60), noise_multiplier=0.0, clipping_norm=1.0,
        num_sampled_clients=2)
    rng = np.random.default_rng(5)
    raw = {1: rng.standard_normal(60), 2: rng.standard_normal(60)}
    ups = {1: 2.0 * raw[1] / np.linalg.norm(raw[1]), 2: 0.5 * raw[2] / np.linalg.norm(raw[2])}
    app = _clipping_app(client_mods(fixedclipping_mod), ups)
    arrays = model(SHAPES)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid([1, 2])))  # type: ignore[arg-type]
    replies = [app(m, context(m.metadata.dst_node_id)) for m in messages]
    assert not any(r.has_error() for r in replies)
    assert all(payload_records(r.content) == ["arrays"] for r in replies)
    new, _ = strategy.aggregate_train(1, replies)
    assert new is not None
    got = np.concatenate([a.ravel() for a in new.to_numpy_ndarrays()])
    want = (ups[1] / 2.0 + ups[2]) / 2  # norm 2 clipped to 1; norm 0.5 kept
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_client_side_adaptive_clipping_sends_the_norm_bit() -> None:
    strategy = DifferentialPrivacyClientSideAdaptiveClipping(
        RandProjSpatialFedAvg("rand-k", k=20), noise_multiplier=0.0, num_sampled_clients=2,
        initial_clipping_norm=0.1)
    ups = {1: np.ones(60), 2: np.ones(60)}  # norm 7.7 > 0.1: both clipped
    app = _clipping_app(client_mods(adaptiveclipping_mod), ups)
    messages = list(strategy.configure_train(1, model(SHAPES), ConfigRecord(),
                                             FakeGrid([1, 2])))  # type: ignore[arg-type]
    replies = [app(m, context(m.metadata.dst_node_id)) for m in messages]
    assert not any(r.has_error() for r in replies)
    assert [r.content["metrics"][KEY_NORM_BIT] for r in replies] == [1, 1]
    new, _ = strategy.aggregate_train(1, replies)
    assert new is not None
    # both updates were clipped (fraction 1 > the target quantile 0.5; no count noise at
    # noise 0): the norm shrinks geometrically, 0.1 * exp(-0.2 * (1 - 0.5))
    assert strategy.clipping_norm == pytest.approx(0.1 * np.exp(-0.1))


@pytest.mark.parametrize("clip_mod", [fixedclipping_mod, adaptiveclipping_mod])
def test_wrong_mod_order_is_refused_with_the_right_order(clip_mod) -> None:  # type: ignore[no-untyped-def]
    """``mods=[clipping_mod, rpsagg_mod]`` would hand the clipping mod a compressed reply. A
    mod cannot see the mods around it: a round that asks for clipping reaching an rpsagg mod
    not built with ``clipping_inside`` is answered with an error naming ``client_mods``,
    addressed to the instruction, and the clipping mod passes the error on."""
    strategy = DifferentialPrivacyClientSideFixedClipping(
        RandProjSpatialFedAvg("rand-k", k=6), noise_multiplier=0.0, clipping_norm=1.0,
        num_sampled_clients=2)
    small = np.full(60, 1e-3)  # norm < 1: only the order can be wrong
    app = _clipping_app([clip_mod, rpsagg_mod], {1: small, 2: small})
    msg = next(iter(strategy.configure_train(1, model(SHAPES), ConfigRecord(),
                                             FakeGrid([1, 2]))))  # type: ignore[arg-type]
    out = app(_delivered(msg), context(msg.metadata.dst_node_id))
    assert out.has_error()
    assert "client_mods(fixedclipping_mod)" in out.error.reason
    assert "clipping_norm 1" in out.error.reason
    _assert_reply_to(out, msg)
    # the same with the clipping mod listed after the plain rpsagg_mod: the declaration is
    # what counts (client_mods makes it)
    app = _clipping_app([rpsagg_mod, clip_mod], {1: small, 2: small})
    out = app(_delivered(msg), context(msg.metadata.dst_node_id))
    assert out.has_error() and "client_mods(" in out.error.reason


def test_clipping_asked_but_not_done_is_refused() -> None:
    strategy = DifferentialPrivacyClientSideFixedClipping(
        RandProjSpatialFedAvg("rand-k", k=6), noise_multiplier=0.0, clipping_norm=1.0,
        num_sampled_clients=2)
    app = _clipping_app([make_rpsagg_mod(clipping_inside=True)],  # declared, but no clipping
                        {1: np.ones(60), 2: np.ones(60)})  # norm 7.7, nobody clips
    msg = next(iter(strategy.configure_train(1, model(SHAPES), ConfigRecord(),
                                             FakeGrid([1, 2]))))  # type: ignore[arg-type]
    out = app(_delivered(msg), context(msg.metadata.dst_node_id))
    assert out.has_error() and "clipping to 1 but the update's norm is 7.74" in out.error.reason
    _assert_reply_to(out, msg)


def test_clipping_mod_on_the_train_function_keeps_evaluate_working() -> None:
    """Flower applies ``ClientApp(mods=...)`` to every message, and its clipping mods refuse
    a message without ``clipping_norm`` (an evaluate round). With the clipping mod on the
    train function only, ``@app.train(mods=[fixedclipping_mod])``, it runs inside the
    app-level rpsagg_mod (the right order) and evaluate rounds pass."""
    strategy = DifferentialPrivacyClientSideFixedClipping(
        RandProjSpatialFedAvg("full", k=60), noise_multiplier=0.0, clipping_norm=1.0,
        num_sampled_clients=2)
    ups = {1: np.ones(60), 2: np.full(60, 0.01)}
    app = ClientApp(mods=[make_rpsagg_mod(clipping_inside=True)])

    @app.train(mods=[fixedclipping_mod])
    def train(msg: Message, ctxt: Context) -> Message:
        return adding_app(ups[ctxt.node_id], 100.0)(msg, ctxt)

    @app.evaluate()
    def evaluate(msg: Message, ctxt: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"acc": 0.5})}), reply_to=msg)

    arrays = model(SHAPES)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid([1, 2])))  # type: ignore[arg-type]
    replies = [app(m, context(m.metadata.dst_node_id)) for m in messages]
    assert not any(r.has_error() for r in replies)
    new, _ = strategy.aggregate_train(1, replies)
    assert new is not None
    got = np.concatenate([a.ravel() for a in new.to_numpy_ndarrays()])
    want = (np.ones(60) / np.sqrt(60) + np.full(60, 0.01)) / 2  # norm 7.7 clipped to 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    ev = Message(RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=1,
                 message_type=MessageType.EVALUATE)
    out = app(ev, context(1))
    assert not out.has_error() and out.content["metrics"]["acc"] == 0.5


def test_the_clipping_norms_key_is_flowers() -> None:
    """rpsagg_flower reads Flower's ``clipping_norm`` config key under its own name (Flower's
    constant is not public API): the two must agree."""
    assert KEY_CLIPPING_NORM == FLOWER_KEY_CLIPPING_NORM
