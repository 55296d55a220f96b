"""Rounds of RandProjSpatialFedAvg driven with Flower's message objects, in one process.

``run_round`` does what Flower's ``Strategy.start`` and the SuperNodes do for one training
round: ``configure_train`` samples the nodes of a :class:`FakeGrid` and builds the
messages; each node's ClientApp (here: "add my update to the received arrays") runs under
the mod; the replies go to ``aggregate_train``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp.typing import Mod
from numpy.typing import NDArray

from rpsagg.spec import mix64
from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.carrier import Reply, read_reply, reply_record
from rpsagg_flower.payload import Layout
from rpsagg_flower.records import REPLY_CONFIG, bundle
from rpsagg_flower.reply import pack_reply

FloatArray = NDArray[np.float64]


class FakeGrid:
    """The part of ``flwr.serverapp.Grid`` FedAvg's sampling uses: the connected nodes."""

    def __init__(self, node_ids: Sequence[int]) -> None:
        self.node_ids = list(node_ids)

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)


def seeds(start: int) -> Iterator[int]:
    """Distinct 64-bit words ``mix64(start + i)`` (client seeds and nonces of the tests)."""
    i = 0
    while True:
        yield mix64(start + i)
        i += 1


def model(shapes: dict[str, tuple[tuple[int, ...], str]], fill: float | None = 0.0,
          seed: int = 0) -> ArrayRecord:
    """An ArrayRecord of the given shapes and dtypes; zeros, or normal values (fill None)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for key, (shape, dtype) in shapes.items():
        values = np.full(shape, fill) if fill is not None else rng.standard_normal(shape)
        arrays[key] = Array(np.asarray(values).astype(dtype))
    return ArrayRecord(arrays)


def split(vec: FloatArray, record: ArrayRecord) -> list[FloatArray]:
    """``vec`` cut into arrays of ``record``'s shapes (float64)."""
    out, offset = [], 0
    for arr in record.to_numpy_ndarrays():
        out.append(vec[offset : offset + arr.size].reshape(arr.shape))
        offset += arr.size
    return out


def adding_app(update: FloatArray, weight: float | None) -> Callable[[Message, Context], Message]:
    """A ClientApp that returns the received arrays plus ``update`` (in their dtypes) and
    ``num-examples = weight`` (100 when None)."""

    def app(msg: Message, ctxt: Context) -> Message:
        received = msg.content["arrays"]
        parts = split(update, received)
        arrays = ArrayRecord({
            key: Array(np.asarray(np.asarray(old, np.float64) + part).astype(old.dtype))
            for key, old, part in zip(received.keys(), received.to_numpy_ndarrays(), parts,
                                      strict=True)
        })
        metrics = MetricRecord({"num-examples": 100 if weight is None else weight})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


def context(node_id: int) -> Context:
    return Context(run_id=1, node_id=node_id, node_config={}, state=RecordDict(),
                   run_config={})


@dataclass
class Round:
    """One round's inputs and outputs."""

    messages: list[Message]  # what configure_train sent, in its order
    replies: list[Message]  # what reached aggregate_train
    arrays: ArrayRecord | None
    metrics: MetricRecord | None


def run_round(
    strategy: RandProjSpatialFedAvg,
    arrays: ArrayRecord,
    updates: dict[int, FloatArray],
    *,
    weights: dict[int, float] | None = None,
    mod: Mod | None = None,
    server_round: int = 1,
    missing: Sequence[int] = (),
    extra_replies: Callable[[list[Message]], list[Message]] | None = None,
) -> Round:
    """One training round over the nodes of ``updates``; the nodes in ``missing`` never
    reply. ``extra_replies`` may add or replace replies before aggregation."""
    mod = mod or make_rpsagg_mod()
    grid = FakeGrid(sorted(updates))
    with strategy.driving():  # this loop drives it, no wrapper: no check record
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))  # type: ignore[arg-type]
    replies = []
    for msg in messages:
        node = msg.metadata.dst_node_id
        if node in missing:
            continue
        weight = None if weights is None else weights[node]
        replies.append(mod(msg, context(node), adding_app(updates[node], weight)))
    if extra_replies is not None:
        replies = extra_replies(replies)
    new, metrics = strategy.aggregate_train(server_round, replies)
    return Round(messages, replies, new, metrics)


def error_reply(msg: Message) -> Message:
    """What a SuperNode sends when the ClientApp crashed."""
    return Message(Error(code=2, reason="ClientApp raised"), reply_to=msg)


def layout_of(strategy: RandProjSpatialFedAvg, arrays: ArrayRecord) -> Layout:
    """The layout the strategy and the mod use for the model ``arrays``."""
    return Layout.of(arrays, strategy.uncompressed, strategy.frozen)


def sent(reply: Message, strategy: RandProjSpatialFedAvg, arrays: ArrayRecord) -> Reply:
    """What a compressed reply carries (its raw arrays and description), read as the
    strategy reads it for the model ``arrays``."""
    out = read_reply(reply.content, layout_of(strategy, arrays))
    assert out is not None, "the reply carries no compressed reply"
    return out


def resend(reply: Message, strategy: RandProjSpatialFedAvg, arrays: ArrayRecord,
           view: ArrayRecord, meta: ConfigRecord | None = None) -> None:
    """Pack ``view`` (and ``meta``, else the reply's own) back into ``reply``, in place."""
    old = sent(reply, strategy, arrays)
    packed = pack_reply(view, old.meta if meta is None else meta, layout_of(strategy, arrays))
    del reply.content[old.records[0]]
    reply.content[old.records[0]] = reply_record(packed)


def as_v01(reply: Message, strategy: RandProjSpatialFedAvg, arrays: ArrayRecord,
           bundled: bool = True) -> ArrayRecord:
    """Turn a compressed reply into rpsagg-flower 0.1's records, in place: the raw arrays
    (one bundle, or apart) under the packed reply's name and the description as the
    ``ConfigRecord`` ``rpsagg``. Returns the raw arrays."""
    old = sent(reply, strategy, arrays)
    del reply.content[old.records[0]]
    reply.content[old.records[0]] = bundle(dict(old.arrays.items())) if bundled else old.arrays
    reply.content[REPLY_CONFIG] = old.meta
    return old.arrays
