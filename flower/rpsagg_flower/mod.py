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

Differential privacy with client-side clipping: Flower's clipping mod must run *inside*
rpsagg_mod, so that it clips the uncompressed update that rpsagg_mod then compresses; in
the other order it would receive the compressed reply. A mod cannot see the mods around it,
so the order is declared, not guessed: :func:`client_mods` builds
``[make_rpsagg_mod(clipping_inside=True), fixedclipping_mod]`` (or ``adaptiveclipping_mod``);
a round that asks for clipping (``clipping_norm`` in its config) reaching a mod that was not
built so is answered with an error naming :func:`client_mods`, and one whose update comes
back with a larger norm than asked is refused too.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType
from flwr.clientapp.typing import ClientAppCallable, Mod

from rpsagg.spec import derive_round_seed
from rpsagg_flower.carrier import reply_record
from rpsagg_flower.dpcheck import CHECK_RECORD, asked, check_record
from rpsagg_flower.payload import (
    MARK_ABSENT,
    MARK_ZERO,
    FloatArray,
    Layout,
    flatten,
    marks_to_bytes,
    reply_arrays,
)
from rpsagg_flower.records import encoded_to_records, layer_seed, layers_to_records
from rpsagg_flower.reply import pack_reply
from rpsagg_flower.settings import KEY_CLIPPING_NORM, KEY_SCHEME, RoundEncoding

log = logging.getLogger("flwr.rpsagg_flower")  # through Flower's log handlers

#: Key of the error-feedback memory in the ClientApp's ``context.state``.
MEMORY_KEY = "rpsagg.memory"

#: The error code of a mod's refusal: Flower's ``ErrorCode.MOD_FAILED_PRECONDITION`` (in
#: ``flwr.common.constant``, outside the app API; the tests compare the two).
MOD_FAILED_PRECONDITION = 6


def _error(msg: Message, reason: str) -> Message:
    """An error reply to the instruction ``msg`` (never to a reply: a reply's source and
    destination are the other way round and the SuperNode could not route it)."""
    log.error("rpsagg_mod: %s", reason)
    return Message(Error(code=MOD_FAILED_PRECONDITION, reason=f"rpsagg_mod: {reason}"),
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


def _memory(ctxt: Context, d: int) -> FloatArray:
    record = ctxt.state.array_records.get(MEMORY_KEY)
    if record is not None and "e" in record:
        e = record["e"].numpy()
        if e.shape == (d,):
            return np.asarray(e, dtype=np.float64)
        log.warning("rpsagg_mod: error-feedback memory of %d coordinates for a model of %d; "
                    "starting from zero", e.size, d)
    return np.zeros(d)


class _Refused(Exception):
    """A step's refusal: the instruction is answered with an error reply giving ``reason``."""


@dataclass(frozen=True)
class _Instruction:
    """What a training instruction of RandProjSpatialFedAvg carries, checked."""

    enc: RoundEncoding
    received: ArrayRecord
    layout: Layout
    base: FloatArray
    clip: float | None


@dataclass
class _Update:
    """The ClientApp's reply as rpsagg_mod compresses it."""

    key: str  # the reply's ArrayRecord's name, where the packed reply goes
    record: ArrayRecord
    delta: FloatArray  # the compressed arrays' update, flattened, weighted, with memory
    plain: dict[str, np.ndarray]
    absent: tuple[bool, ...]


def _instruction(msg: Message, enc: RoundEncoding, clipping_inside: bool) -> _Instruction:
    """Step 1: the instruction's model and settings, and whether its clipping can be done."""
    clip = _clipping_norm(msg)
    if clip is not None and not clipping_inside:
        raise _Refused(
            f"the round asks for client-side clipping (clipping_norm {clip:g}), which must "
            "run inside rpsagg_mod on the uncompressed update; build the mods with "
            "rpsagg_flower.client_mods(fixedclipping_mod) (or adaptiveclipping_mod), or "
            "declare a clipping mod on the train function with "
            "make_rpsagg_mod(clipping_inside=True)")
    received = list(msg.content.array_records.values())
    if len(received) != 1:
        raise _Refused(f"expects one ArrayRecord in the message; got {len(received)}")
    try:
        layout = Layout.of(received[0], enc.uncompressed, enc.frozen)
        base = flatten(received[0], layout)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if layout.d != enc.d:
        raise _Refused(f"the model has {layout.d} coordinates to compress; the round says "
                       f"{enc.d}")
    return _Instruction(enc, received[0], layout, base, clip)


def _update(ins: _Instruction, out: Message, ctxt: Context) -> _Update:
    """Step 2: the reply's update to the received arrays: clipped as asked, weighted by
    the round's weight metric, plus the error-feedback memory."""
    replies = list(out.content.array_records.items())
    if len(replies) != 1:
        raise _Refused(f"expects one ArrayRecord in the reply; got {len(replies)}")
    key, record = replies[0]
    layout = ins.layout
    try:
        got, absent = reply_arrays(record, layout)
    except ValueError as exc:
        raise _Refused(f"the ClientApp's reply: {exc}") from None
    delta = np.zeros(layout.d)
    for name, where in layout.compressed_slices().items():
        if name in got:
            delta[where] = np.asarray(got[name], dtype=np.float64).reshape(-1) - ins.base[where]
    changed = [name for name in layout.frozen_keys if name in record and not np.array_equal(
        record[name].numpy(), ins.received[name].numpy())]
    if changed:
        log.warning("rpsagg_mod: the frozen arrays %s changed; their change is not sent",
                    changed)
    if ins.clip is not None:
        norm = float(np.linalg.norm(delta))
        if norm > ins.clip * (1.0 + 1e-5) + 1e-6:  # float32 rounding of the clipped arrays
            raise _Refused(f"the round asks for clipping to {ins.clip:g} but the update's "
                           f"norm is {norm:g}: the clipping mod must run inside rpsagg_mod, "
                           "rpsagg_flower.client_mods(fixedclipping_mod)")
    weight_key = ins.enc.weight_key
    if weight_key:
        weights = [m[weight_key] for m in out.content.metric_records.values()
                   if weight_key in m]
        if len(weights) != 1 or not isinstance(weights[0], int | float) or not (
            math.isfinite(weights[0]) and weights[0] >= 0
        ):
            raise _Refused(f"the reply needs one finite, non-negative metric {weight_key!r} "
                           f"to weight its update; got {weights}")
        delta *= float(weights[0])
    if ins.enc.error_feedback:
        delta += _memory(ctxt, layout.d)
    plain = {name: got[name] for name in layout.plain_keys if name in got}
    return _Update(key, record, delta, plain, absent)


def _encode(ins: _Instruction, up: _Update, client_seed: int, node: int,
            ctxt: Context) -> tuple[ArrayRecord | ConfigRecord, str]:
    """Step 3: the packed reply record of the update (and its scheme); with error feedback,
    what the server does not apply of it is kept in ``ctxt.state`` for the next round."""
    enc, layout = ins.enc, ins.layout
    slices = layout.compressed_slices()
    # the sketch covers the compressed arrays that the reply carries and that changed
    gone = dict(zip(layout.keys, up.absent, strict=True))
    zero = {name: not gone[name] and not np.any(up.delta[where])
            for name, where in slices.items()}
    included = [not (gone[name] or zero[name]) for name in layout.compressed_keys]
    marks = {MARK_ZERO: marks_to_bytes([zero.get(name, False) for name in layout.keys]),
             MARK_ABSENT: marks_to_bytes(up.absent)}
    sent = np.zeros(layout.d)  # what the server applies of this message, by itself
    # an encode depends on neither n nor the transform
    if enc.layer_k:  # one message per compressed array
        ests = enc.layer_estimators(layout.compressed_sizes, n=1)
        msgs = [e.encode(up.delta[where], layer_seed(client_seed, enc.nonce, node, j))
                if inc else None
                for j, (e, where, inc) in enumerate(zip(ests, slices.values(), included,
                                                        strict=True))]
        arrays, meta = layers_to_records(msgs, client_seed, enc.nonce, up.plain, marks,
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
            one = est.encode(up.delta[mask] if d_sent < layout.d else up.delta,
                             derive_round_seed(client_seed, enc.nonce, str(node)))
            if enc.error_feedback:
                sent[mask] = est.decode([one])
        msgs = [one]
        arrays, meta = encoded_to_records(one, client_seed, enc.nonce, up.plain, marks,
                                          scheme=enc.scheme)
    packed = reply_record(pack_reply(arrays, meta, layout))
    if enc.error_feedback:
        # the server applies gamma times this message's unbiased decode, by itself; the
        # rest is carried to the next round
        ctxt.state.array_records[MEMORY_KEY] = ArrayRecord(
            {"e": Array(up.delta - enc.error_feedback * sent)})
    return packed, next((m.scheme for m in msgs if m is not None), enc.scheme)


def _swap_model(out: Message, key: str, packed: ArrayRecord | ConfigRecord,
                check: bool) -> None:
    """Step 4: the packed reply takes the model's place, under its name and position; the
    check record (:mod:`rpsagg_flower.dpcheck`), where the round asks for it, goes first."""
    records = list(out.content.items())
    for name, _ in records:
        del out.content[name]
    if check:
        out.content[CHECK_RECORD] = check_record()
    for name, rec in records:
        out.content[name] = packed if name == key else rec


def make_rpsagg_mod(
    client_seeds: Callable[[], int] | None = None,
    *,
    context_seeds: Callable[[Message, Context], int] | None = None,
    clipping_inside: bool = False,
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
    clipping_inside : bool
        A Flower clipping mod runs inside this mod (listed after it, or on the train
        function): rounds that ask for client-side clipping are compressed, their update
        checked to be within the norm. Without it such a round is refused (the mod cannot
        see where the clipping mod is). :func:`client_mods` sets it.

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
            if enc is None:  # not a round of RandProjSpatialFedAvg
                return call_next(msg, ctxt)
            ins = _instruction(msg, enc, clipping_inside)
        except (_Refused, ValueError) as exc:
            return _error(msg, str(exc))
        out = call_next(msg, ctxt)  # the ClientApp's own errors are its own
        if out.has_error():
            return out
        try:
            up = _update(ins, out, ctxt)
            seed = context_seeds(msg, ctxt) if context_seeds else draw()
            packed, scheme = _encode(ins, up, seed, msg.metadata.dst_node_id, ctxt)
        except ValueError as exc:
            return _error(msg, f"cannot encode the update: {exc}")
        except _Refused as exc:
            return _error(msg, str(exc))
        raw = up.record.count_bytes()
        _swap_model(out, up.key, packed,
                    any(asked(c) for c in msg.content.config_records.values()))
        log.info("rpsagg_mod: %s update of %d coordinates sent as %d B instead of %d B",
                 scheme, ins.layout.d, packed.count_bytes(), raw)
        return out

    return rpsagg_mod


def client_mods(clipping_mod: Mod | None = None, *,
                client_seeds: Callable[[], int] | None = None,
                context_seeds: Callable[[Message, Context], int] | None = None) -> list[Mod]:
    """The ClientApp's mods for RandProjSpatialFedAvg, in the order that works:
    ``ClientApp(mods=client_mods())``.

    Parameters
    ----------
    clipping_mod : Mod, optional
        Flower's ``fixedclipping_mod`` or ``adaptiveclipping_mod`` (with a client-side
        clipping wrapper on the server): it runs inside the rpsagg mod, on the uncompressed
        update.
    client_seeds, context_seeds : callable, optional
        As :func:`make_rpsagg_mod`'s.

    Returns
    -------
    list of Mod
        ``[rpsagg_mod]``, or ``[make_rpsagg_mod(clipping_inside=True), clipping_mod]``.

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> from flwr.clientapp.mod import fixedclipping_mod
    >>> from rpsagg_flower import client_mods
    >>> app = ClientApp(mods=client_mods(fixedclipping_mod))
    """
    if clipping_mod is None and client_seeds is None and context_seeds is None:
        return [rpsagg_mod]
    mod = make_rpsagg_mod(client_seeds, context_seeds=context_seeds,
                          clipping_inside=clipping_mod is not None)
    return [mod] if clipping_mod is None else [mod, clipping_mod]


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
weight metric, ``num-examples`` by default; a round that asks for client-side clipping)
becomes an error reply (``MOD_FAILED_PRECONDITION``, reason starting ``rpsagg_mod:``). With
Flower's client-side clipping, build the mods with
``ClientApp(mods=client_mods(fixedclipping_mod))``. ``make_rpsagg_mod`` builds one with
other client seeds.
"""

__all__ = ["MEMORY_KEY", "client_mods", "make_rpsagg_mod", "rpsagg_mod"]
