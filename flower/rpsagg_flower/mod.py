"""The client mod: it replaces a training reply's model with the compressed update.

Put :data:`rpsagg_mod` into the ``ClientApp``'s mods (``ClientApp(mods=[rpsagg_mod])``) and
use :class:`~rpsagg_flower.strategy.RandProjSpatialFedAvg` on the server. In a round that the
strategy configured (its ``ConfigRecord`` has ``rpsagg.scheme``), the mod runs the
``ClientApp``, takes the difference between the floating-point arrays it returned and those
it received, flattened across the ``ArrayRecord``, and sends only the estimator's message:
``k`` values (or their codes) and a 64-bit client seed. Arrays that are not floating point
(integer counters, boolean masks) and those the strategy names ``uncompressed`` travel as
they are beside the sketch. The reply travels packed (:mod:`rpsagg_flower.reply`): one
record in the place of the ClientApp's ``ArrayRecord``, under its name, a few dozen bytes
beyond the data. Every other message passes through unchanged.

A compressed array whose update is exactly zero (a frozen layer the strategy was not told
about) is left out of the sketch and marked in the reply's ``zero`` bitmap; an array the
ClientApp's reply does not carry (a PEFT/LoRA client returning its adapters only) is marked
``absent``; arrays the strategy names ``frozen`` are never sent (``docs/flower.md``).

The client seed comes from ``secrets.randbits(64)``; the transform seed is
``derive_round_seed(client_seed, nonce, str(node_id))`` with the round's nonce from the
strategy, exactly as in the rpsagg service (``docs/wire-format.md``), so the server can
regenerate the transform and no client can choose it.

Differential privacy with client-side clipping: list rpsagg_mod *before* Flower's clipping
mod, ``ClientApp(mods=[rpsagg_mod, fixedclipping_mod])`` (or ``adaptiveclipping_mod``), so
that the clipping mod runs inside it and clips the uncompressed update that rpsagg_mod then
compresses. In the other order the clipping mod would receive the compressed reply; the mod
detects that order and answers with an error reply, and it also refuses a round that asks
for clipping (``clipping_norm`` in the config) whose update comes back unclipped.
"""

from __future__ import annotations

import logging
import math
import secrets
import sys
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Error, Message, MessageType
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common.constant import ErrorCode
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from rpsagg.spec import derive_round_seed
from rpsagg_flower.payload import (
    MARK_ABSENT,
    MARK_ZERO,
    FloatArray,
    Layout,
    encoded_to_records,
    flatten,
    layer_seed,
    layers_to_records,
    marks_to_bytes,
    reply_arrays,
)
from rpsagg_flower.reply import pack_reply, reply_record
from rpsagg_flower.settings import KEY_SCHEME, RoundEncoding

log = logging.getLogger("flwr.rpsagg_flower")  # through Flower's log handlers

#: Key of the error-feedback memory in the ClientApp's ``context.state``.
MEMORY_KEY = "rpsagg.memory"

_CLIPPING_MODS = {fixedclipping_mod.__code__: "fixedclipping_mod",
                  adaptiveclipping_mod.__code__: "adaptiveclipping_mod"}


def _error(msg: Message, reason: str) -> Message:
    """An error reply to the instruction ``msg`` (never to a reply: a reply's source and
    destination are the other way round and the SuperNode could not route it)."""
    log.error("rpsagg_mod: %s", reason)
    return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=f"rpsagg_mod: {reason}"),
                   reply_to=msg)


def _round_encoding(msg: Message) -> RoundEncoding | None:
    for config in msg.content.config_records.values():
        if KEY_SCHEME in config:
            return RoundEncoding.from_config(config)
    return None


def _clipping_norm(msg: Message) -> float | None:
    for config in msg.content.config_records.values():
        if KEY_CLIPPING_NORM in config:
            return float(config[KEY_CLIPPING_NORM])  # type: ignore[arg-type]
    return None


def _outer_clipping_mod() -> str | None:
    """The name of a Flower clipping mod that called this mod (so runs outside it)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = _CLIPPING_MODS.get(frame.f_code)
        if name is not None:
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _memory(ctxt: Context, d: int) -> FloatArray:
    record = ctxt.state.array_records.get(MEMORY_KEY)
    if record is not None and "e" in record:
        e = record["e"].numpy()
        if e.shape == (d,):
            return np.asarray(e, dtype=np.float64)
        log.warning("rpsagg_mod: error-feedback memory of %d coordinates for a model of %d; "
                    "starting from zero", e.size, d)
    return np.zeros(d)


def make_rpsagg_mod(
    client_seeds: Callable[[], int] | None = None,
    *,
    context_seeds: Callable[[Message, Context], int] | None = None,
) -> Mod:
    """A mod that compresses training replies, as ``rpsagg_mod`` does, with its own client
    seeds.

    Parameters
    ----------
    client_seeds : callable, optional
        Draws each reply's 64-bit client seed (default ``secrets.randbits(64)``; tests pass
        a fixed sequence).
    context_seeds : callable, optional
        ``(instruction, context) -> seed`` instead: e.g. a seed derived from the run
        config, the node and the round for a reproducible run.

    Returns
    -------
    Mod
        ``(msg, context, call_next) -> Message``, for ``ClientApp(mods=[...])``.

    Examples
    --------
    >>> import secrets
    >>> from rpsagg_flower import make_rpsagg_mod
    >>> mod = make_rpsagg_mod(lambda: secrets.randbits(64))  # as rpsagg_mod
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
        outer = _outer_clipping_mod()
        if outer is not None:
            return _error(msg, f"{outer} runs outside rpsagg_mod and would receive the "
                               f"compressed reply; list rpsagg_mod first: "
                               f"ClientApp(mods=[rpsagg_mod, {outer}])")
        received = list(msg.content.array_records.values())
        if len(received) != 1:
            return _error(msg, f"expects one ArrayRecord in the message; got {len(received)}")
        try:
            layout = Layout.of(received[0], enc.uncompressed, enc.frozen)
            base = flatten(received[0], layout)
        except ValueError as exc:
            return _error(msg, str(exc))
        if layout.d != enc.d:
            return _error(msg, f"the model has {layout.d} coordinates to compress; the round "
                               f"says {enc.d}")
        clip = _clipping_norm(msg)

        out = call_next(msg, ctxt)
        if out.has_error():
            return out
        replies = list(out.content.array_records.items())
        if len(replies) != 1:
            return _error(msg, f"expects one ArrayRecord in the reply; got {len(replies)}")
        key, record = replies[0]
        try:
            got, absent = reply_arrays(record, layout)
        except ValueError as exc:
            return _error(msg, f"the ClientApp's reply: {exc}")
        slices = layout.compressed_slices()
        delta = np.zeros(layout.d)
        for name, where in slices.items():
            if name in got:
                delta[where] = np.asarray(got[name], dtype=np.float64).reshape(-1) - base[where]
        plain = {name: got[name] for name in layout.plain_keys if name in got}
        changed = [name for name in layout.frozen_keys if name in record and not np.array_equal(
            record[name].numpy(), received[0][name].numpy())]
        if changed:
            log.warning("rpsagg_mod: the frozen arrays %s changed; their change is not sent",
                        changed)
        if clip is not None:
            norm = float(np.linalg.norm(delta))
            if norm > clip * (1.0 + 1e-5) + 1e-6:  # float32 rounding of the clipped arrays
                return _error(msg, f"the round asks for clipping to {clip:g} but the update's "
                                   f"norm is {norm:g}: add Flower's clipping mod after "
                                   f"rpsagg_mod, ClientApp(mods=[rpsagg_mod, fixedclipping_mod])")
        if enc.weight_key:
            weights = [m[enc.weight_key] for m in out.content.metric_records.values()
                       if enc.weight_key in m]
            if len(weights) != 1 or not isinstance(weights[0], int | float) or not (
                math.isfinite(weights[0]) and weights[0] >= 0
            ):
                return _error(msg, f"the reply needs one finite, non-negative metric "
                                   f"{enc.weight_key!r} to weight its update; got {weights}")
            delta *= float(weights[0])
        if enc.error_feedback:
            delta += _memory(ctxt, layout.d)
        # the sketch covers the compressed arrays that the reply carries and that changed
        gone = dict(zip(layout.keys, absent, strict=True))
        zero = {name: not gone[name] and not np.any(delta[where])
                for name, where in slices.items()}
        included = [not (gone[name] or zero[name]) for name in layout.compressed_keys]
        marks = {MARK_ZERO: marks_to_bytes([zero.get(name, False) for name in layout.keys]),
                 MARK_ABSENT: marks_to_bytes(absent)}
        client_seed = context_seeds(msg, ctxt) if context_seeds else draw()
        node = msg.metadata.dst_node_id
        try:
            # an encode depends on neither n nor the transform
            sent = np.zeros(layout.d)  # what the server applies of this message, by itself
            if enc.layer_k:  # one message per compressed array
                ests = enc.layer_estimators(layout.compressed_sizes, n=1)
                msgs = [e.encode(delta[where], layer_seed(client_seed, enc.nonce, node, j))
                        if inc else None
                        for j, (e, where, inc) in enumerate(zip(ests, slices.values(),
                                                                included, strict=True))]
                arrays, meta = layers_to_records(msgs, client_seed, enc.nonce, plain, marks,
                                                 scheme=enc.scheme)
                if enc.error_feedback:
                    for e, m, where in zip(ests, msgs, slices.values(), strict=True):
                        if m is not None:
                            sent[where] = e.decode([m])
            else:
                mask = layout.coordinate_mask(included)
                d_sent = int(mask.sum())
                one = None
                if d_sent:
                    est = (enc if d_sent == layout.d else enc.reduced(d_sent)).estimator(n=1)
                    one = est.encode(delta[mask] if d_sent < layout.d else delta,
                                     derive_round_seed(client_seed, enc.nonce, str(node)))
                    if enc.error_feedback:
                        sent[mask] = est.decode([one])
                msgs = [one]
                arrays, meta = encoded_to_records(one, client_seed, enc.nonce, plain, marks,
                                                  scheme=enc.scheme)
            packed = reply_record(pack_reply(arrays, meta, layout))
            scheme = next((m.scheme for m in msgs if m is not None), enc.scheme)
            if enc.error_feedback:
                # the server applies gamma times this message's unbiased decode, by itself;
                # the rest is carried to the next round
                ctxt.state.array_records[MEMORY_KEY] = ArrayRecord(
                    {"e": Array(delta - enc.error_feedback * sent)})
        except ValueError as exc:
            return _error(msg, f"cannot encode the update: {exc}")
        raw = record.count_bytes()
        # the packed reply takes the model's place, under its name and in its position
        records = list(out.content.items())
        for name, _ in records:
            del out.content[name]
        for name, rec in records:
            out.content[name] = packed if name == key else rec
        log.info(
            "rpsagg_mod: %s update of %d coordinates sent as %d B instead of %d B",
            scheme, layout.d, packed.count_bytes(), raw,
        )
        return out

    return rpsagg_mod


rpsagg_mod: Mod = make_rpsagg_mod()
"""The client mod, with fresh ``secrets.randbits(64)`` client seeds:
``ClientApp(mods=[rpsagg_mod])``.

In a training round that ``RandProjSpatialFedAvg`` configured (its config has
``rpsagg.scheme``), it runs the ClientApp, takes the difference between the
floating-point arrays the ClientApp returned and those it received, flattened across the
``ArrayRecord``, and replies with the estimator's message of it (``k`` values or their
codes, a 64-bit client seed) packed into one record under the ``ArrayRecord``'s name.
Integer and boolean arrays, and those the strategy names ``uncompressed``, travel as they
are beside the sketch; arrays the strategy names ``frozen`` are not sent. Every other
message passes through unchanged.

A reply the mod cannot compress (two ``ArrayRecord``s, arrays of another shape, no
weight metric, ``num-examples`` by default; a clipping mod listed before it) becomes an error
reply (``MOD_FAILED_PRECONDITION``, reason starting ``rpsagg_mod:``). With Flower's
client-side clipping, list it first: ``ClientApp(mods=[rpsagg_mod, fixedclipping_mod])``.
``make_rpsagg_mod`` builds one with other client seeds.
"""

__all__ = ["MEMORY_KEY", "make_rpsagg_mod", "rpsagg_mod"]
