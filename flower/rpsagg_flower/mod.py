"""The client mod: it replaces a training reply's model with the compressed update.

Put :data:`rpsagg_mod` into the ``ClientApp``'s mods (``ClientApp(mods=[rpsagg_mod])``) and
use :class:`~rpsagg_flower.strategy.RandProjSpatialFedAvg` on the server. In a round that the
strategy configured (its ``ConfigRecord`` has ``rpsagg.scheme``), the mod runs the
``ClientApp``, takes the difference between the arrays it returned and those it received,
flattened across the ``ArrayRecord``, and sends only the estimator's message: ``k`` values
(or their codes) and a 64-bit client seed. Every other message passes through unchanged.

The client seed comes from ``secrets.randbits(64)``; the transform seed is
``derive_round_seed(client_seed, nonce, str(node_id))`` with the round's nonce from the
strategy, exactly as in the rpsagg service (``docs/wire-format.md``), so the server can
regenerate the transform and no client can choose it.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable

from flwr.app import Context, Error, Message, MessageType
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common.constant import ErrorCode

from rpsagg.spec import derive_round_seed
from rpsagg_flower.payload import REPLY_CONFIG, Layout, encoded_to_records, flatten
from rpsagg_flower.settings import KEY_SCHEME, RoundEncoding

log = logging.getLogger("flwr.rpsagg_flower")  # through Flower's log handlers


def _error(msg: Message, reason: str) -> Message:
    log.error("rpsagg_mod: %s", reason)
    return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=f"rpsagg_mod: {reason}"),
                   reply_to=msg)


def _round_encoding(msg: Message) -> RoundEncoding | None:
    for config in msg.content.config_records.values():
        if KEY_SCHEME in config:
            return RoundEncoding.from_config(config)
    return None


def make_rpsagg_mod(client_seeds: Callable[[], int] | None = None) -> Mod:
    """A mod that compresses training replies; ``client_seeds`` draws each reply's 64-bit
    client seed (default ``secrets.randbits(64)``; tests pass a fixed sequence).

    Returns
    -------
    Mod
        ``(msg, context, call_next) -> Message``, for ``ClientApp(mods=[...])``.
    """
    draw = client_seeds or (lambda: secrets.randbits(64))

    def rpsagg_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, ctxt)
        try:
            enc = _round_encoding(msg)
        except ValueError as exc:
            return _error(msg, str(exc))
        if enc is None:  # not a round of RandProjSpatialFedAvg
            return call_next(msg, ctxt)
        received = list(msg.content.array_records.values())
        if len(received) != 1:
            return _error(msg, f"expects one ArrayRecord in the message; got {len(received)}")
        try:
            layout = Layout.of(received[0])
            base = flatten(received[0], layout)
        except ValueError as exc:
            return _error(msg, str(exc))
        if layout.d != enc.d:
            return _error(msg, f"the model has {layout.d} coordinates; the round says {enc.d}")

        out = call_next(msg, ctxt)
        if out.has_error():
            return out
        replies = list(out.content.array_records.items())
        if len(replies) != 1:
            return _error(out, f"expects one ArrayRecord in the reply; got {len(replies)}")
        key, record = replies[0]
        try:
            delta = flatten(record, layout) - base
        except ValueError as exc:
            return _error(msg, f"the ClientApp's reply: {exc}")
        if enc.weight_key:
            weights = [m[enc.weight_key] for m in out.content.metric_records.values()
                       if enc.weight_key in m]
            if len(weights) != 1 or not isinstance(weights[0], int | float) or not (
                math.isfinite(weights[0]) and weights[0] >= 0
            ):
                return _error(msg, f"the reply needs one finite, non-negative metric "
                                   f"{enc.weight_key!r} to weight its update; got {weights}")
            delta *= float(weights[0])
        client_seed = draw()
        try:
            est = enc.estimator(n=1)  # an encode depends on neither n nor the transform
            seed = derive_round_seed(client_seed, enc.nonce, str(msg.metadata.dst_node_id))
            encoded = est.encode(delta, seed)
        except ValueError as exc:
            return _error(msg, f"cannot encode the update: {exc}")
        arrays, meta = encoded_to_records(encoded, client_seed, enc.nonce)
        raw = record.count_bytes()
        out.content.array_records[key] = arrays
        out.content[REPLY_CONFIG] = meta
        log.info(
            "rpsagg_mod: %s update of %d coordinates sent as %d B instead of %d B",
            encoded.scheme, layout.d, arrays.count_bytes() + meta.count_bytes(), raw,
        )
        return out

    return rpsagg_mod


#: The mod with fresh ``secrets.randbits(64)`` client seeds.
rpsagg_mod: Mod = make_rpsagg_mod()

__all__ = ["make_rpsagg_mod", "rpsagg_mod"]
