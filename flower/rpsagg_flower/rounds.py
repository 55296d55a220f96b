"""One training round on the server: its plan, the replies accepted for it and their joint
decode (the mean update), for :class:`~rpsagg_flower.strategy.RandProjSpatialFedAvg`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict
from numpy.typing import NDArray

from rpsagg import DecodeResult, Encoded, Estimator
from rpsagg_flower.carrier import Reply, read_reply
from rpsagg_flower.correlation import r_hat
from rpsagg_flower.dpcheck import CHECK_RECORD
from rpsagg_flower.payload import Layout
from rpsagg_flower.records import (
    records_to_encoded,
    records_to_layers,
    records_to_plain,
    reply_marks,
)
from rpsagg_flower.settings import RoundEncoding
from rpsagg_flower.wire import distinct_wire_bytes, wire_bytes

log = logging.getLogger("flwr.rpsagg_flower")  # through Flower's log handlers

#: what a decode returned: the estimator, the messages it decoded, its result
Decoded = tuple[Estimator, list[Encoded], DecodeResult]


@dataclass
class RoundPlan:
    """What ``configure_train`` sent for a round, and the estimators to decode it."""

    server_round: int
    encoding: RoundEncoding
    estimator: Estimator
    layout: Layout
    arrays: ArrayRecord
    #: the strategy's transform, solver and error_tol, for the reduced estimators
    decoding: tuple[str | float, str, float | str | None]
    layers: list[Estimator] | None = None  # per-layer compression
    n: int = 1  # messages sent
    prior: float | None = None
    reduced: dict[tuple[bool, ...], Estimator] = field(default_factory=dict)

    def group_estimator(self, included: tuple[bool, ...]) -> Estimator:
        """The estimator of the sketches of the compressed arrays flagged ``included``."""
        if all(included):
            return self.estimator
        est = self.reduced.get(included)
        if est is None:
            d = int(self.layout.coordinate_mask(included).sum())
            transform, solver, error_tol = self.decoding
            est = self.encoding.reduced(d).estimator(self.n, transform, self.prior, solver,
                                                     error_tol)
            self.reduced[included] = est
        return est


@dataclass
class Accepted:
    """A reply accepted into the round's decode."""

    content_index: int
    encoded: Encoded | list[Encoded | None] | None  # None: no sketch (nothing included)
    weight: float
    wire_bytes: int
    payload_bytes: int  # the compressed records' data and keys (count_bytes)
    fedavg_bytes: int  # the same reply with the model's arrays, as FedAvg's would travel
    plain: dict[str, NDArray[np.generic]]
    included: tuple[bool, ...]  # per compressed array: in this reply's sketch
    carried: frozenset[str]  # the arrays the reply carries (zero-marked ones included)


def fedavg_wire(msg: Message, reply: Reply, wire: int, model_bytes: int,
                sizes: dict[str, int]) -> int:
    """Wire bytes of ``msg`` (``wire`` of them) had it carried the model's arrays as FedAvg's
    ClientApp returns them (``model_bytes``: :func:`distinct_wire_bytes` of the model, in
    NumPy's format) under the name of the ClientApp's ``ArrayRecord``, without the records
    that carry the compressed ``reply`` and the check record (:mod:`rpsagg_flower.dpcheck`):
    its other records and its metadata as they are."""
    content = msg.content
    kept = {name: rec for name, rec in content.items()
            if name not in reply.records and name != CHECK_RECORD}
    shell = RecordDict({**kept, reply.model_record: ArrayRecord()})  # the FedAvg reply's
    # RecordDict object (ids of the same length), its other records
    others = sum(wire_bytes(rec, sizes) for rec in kept.values())
    return (wire - wire_bytes(content, sizes) + len(shell.deflate()) + others
            + model_bytes)


def accept(plan: RoundPlan, valid: list[Message], *, missing_payload: str, partial: str,
           weight_of: Callable[[Message], float] | None) -> list[Accepted]:
    """The replies that decode together: one per node, each well-formed for the round
    (``weight_of``: a reply's weight; None: every reply weighs 1).

    ``RuntimeError`` for a reply without the rpsagg payload when ``missing_payload`` is
    ``"raise"``, or one with only some of the model's arrays when ``partial`` is
    ``"refuse"``; any other misfit is left out with a warning."""
    accepted: list[Accepted] = []
    seen: set[int] = set()
    sizes: dict[str, int] = {}  # deflated sizes by object id, shared by the replies
    model_bytes = distinct_wire_bytes(plan.arrays)
    for i, msg in enumerate(valid):
        node = msg.metadata.src_node_id
        try:
            if node in seen:
                raise ValueError("a second reply from this node")
            reply = read_reply(msg.content, plan.layout)
            if reply is None:
                why = (f"the reply from node {node} has no rpsagg payload: is rpsagg_mod "
                       f"in the ClientApp's mods, ClientApp(mods=[rpsagg_mod])?")
                if missing_payload == "raise":
                    raise RuntimeError(why + " (missing_payload='drop' drops such replies)")
                raise ValueError(why)
            found = _read(plan, reply, node, partial)
            weight = 1.0 if weight_of is None else weight_of(msg)
        except ValueError as exc:
            log.warning("aggregate_train: reply from node %d dropped: %s", node, exc)
            continue
        seen.add(node)
        wire = wire_bytes(msg, sizes)
        payload = sum(msg.content[name].count_bytes() for name in reply.records)
        encoded, plain, included, carried = found
        accepted.append(Accepted(i, encoded, weight, wire, payload,
                                 fedavg_wire(msg, reply, wire, model_bytes, sizes),
                                 plain, included, carried))
    return accepted


def _read(plan: RoundPlan, reply: Reply, node: int, partial: str
          ) -> tuple[Encoded | list[Encoded | None] | None, dict[str, NDArray[np.generic]],
                     tuple[bool, ...], frozenset[str]]:
    """A reply's sketch, its plain arrays, which compressed arrays its sketch includes and
    which arrays it carries."""
    layout, meta = plan.layout, reply.meta
    zero, absent = reply_marks(meta, layout)
    lacks = [key for key, no in zip(layout.keys, absent, strict=True) if no]
    if lacks and partial == "refuse":
        raise RuntimeError(
            f"the reply from node {node} carries only some of the model's arrays: it lacks "
            f"{lacks}. RandProjSpatialFedAvg(partial='allow') averages each array over the "
            f"replies that carry it; or return every array from the ClientApp, or name the "
            f"untrained ones in frozen=[...]")
    flags = dict(zip(layout.keys, zip(zero, absent, strict=True), strict=True))
    included = tuple(not any(flags[key]) for key in layout.compressed_keys)
    encoded: Encoded | list[Encoded | None] | None
    if plan.layers:
        encoded = records_to_layers(plan.layers, reply.arrays, meta, plan.encoding.nonce,
                                    node, included)
    elif any(included):
        encoded = records_to_encoded(plan.group_estimator(included), reply.arrays, meta,
                                     plan.encoding.nonce, node)
    else:
        encoded = None
    plain = records_to_plain(reply.arrays, layout, absent)
    carried = frozenset(k for k, no in zip(layout.keys, absent, strict=True) if not no)
    return encoded, plain, included, carried


def decode(plan: RoundPlan, accepted: list[Accepted], weights: NDArray[np.float64]
           ) -> tuple[NDArray[np.float64], list[str], list[Decoded], float]:
    """The mean update, the compressed arrays no reply changed (kept as they are), the
    decodes (estimator, messages, result) and their seconds.

    Each sketch is decoded jointly with the other replies' of the same coordinates (per
    layer; or per set of included arrays, in the common case one set); array ``a``'s update
    is ``sum_i w_i u_i[a] / sum_{i carries a} w_i`` over the replies that carry it, where a
    zero-marked reply contributes exactly zero."""
    layout, big_n = plan.layout, len(accepted)
    total, decoded = _joint_sum(plan, accepted)
    update = np.zeros(layout.d)
    keep = []
    for j, (name, where) in enumerate(layout.compressed_slices().items()):
        carriers = [name in a.carried for a in accepted]
        if not any(a.included[j] for a in accepted):
            keep.append(name)  # every carrier marks it zero, or no reply carries it
            continue
        mean_w = (weights.mean() if all(carriers)
                  else weights[np.asarray(carriers)].sum() / big_n)
        update[where] = total[where] / mean_w
    return update, keep, decoded, sum(float(r.seconds) for _, _, r in decoded)


def byte_metrics(accepted: list[Accepted], msgs: list[Encoded]) -> dict[str, int | float]:
    """The round's ``rpsagg.*`` byte counts: its accepted replies and their messages."""
    up = sum(a.wire_bytes for a in accepted)
    raw = sum(a.fedavg_bytes for a in accepted)
    return {"rpsagg.n-prime": len(accepted), "rpsagg.bytes-up": up,
            "rpsagg.payload-bytes-up": sum(a.payload_bytes for a in accepted),
            "rpsagg.bytes-up-uncompressed": raw, "rpsagg.compression-ratio": raw / up,
            "rpsagg.payload-bytes": sum(m.payload_bytes for m in msgs)}


def decode_metrics(decoded: list[Decoded]) -> tuple[dict[str, float], float | None]:
    """The ``rpsagg.*`` metrics of a round decoded as one group (``decoded``: one entry;
    else none): beta, the estimated error where the decoder gives one, and ``r-hat``, the
    estimated correlation R of the updates, which is also returned (None without one)."""
    if len(decoded) != 1:  # no sketch, or replies of several groups decoded apart
        return {}, None
    est, msgs, result = decoded[0]
    metrics = {"rpsagg.beta": float(result.beta)}
    error = result.error_estimate
    if error is not None:
        metrics["rpsagg.estimated-squared-error"] = float(error.squared_error)
        metrics["rpsagg.estimated-squared-error-stderr"] = float(error.squared_error_stderr)
        metrics["rpsagg.estimated-relative-error"] = float(error.relative_error)
    rhat = r_hat(est, msgs)
    if rhat is not None:
        metrics["rpsagg.r-hat"] = rhat
    return metrics, rhat


def _joint_sum(plan: RoundPlan, accepted: list[Accepted]
               ) -> tuple[NDArray[np.float64], list[Decoded]]:
    """``sum_i w_i u_i / n'`` over the compressed coordinates, from the joint decodes."""
    layout, big_n = plan.layout, len(accepted)
    total = np.zeros(layout.d)
    decoded: list[Decoded] = []
    if plan.layers:
        for j, (est, where) in enumerate(zip(plan.layers, layout.compressed_slices().values(),
                                             strict=True)):
            msgs = [m for a in accepted if (m := a.encoded[j]) is not None]  # type: ignore[index]
            if msgs:
                result = est.decode_with_info(msgs)
                share = 1.0 if len(msgs) == big_n else len(msgs) / big_n
                total[where] += share * result.estimate
                decoded.append((est, msgs, result))
        return total, decoded
    groups: dict[tuple[bool, ...], list[Accepted]] = {}
    for a in accepted:
        if a.encoded is not None:
            groups.setdefault(a.included, []).append(a)
    for included, members in groups.items():
        est = plan.group_estimator(included)
        msgs = [a.encoded for a in members if isinstance(a.encoded, Encoded)]
        result = est.decode_with_info(msgs)
        share = 1.0 if len(members) == big_n else len(members) / big_n
        if all(included):
            total += share * result.estimate
        else:
            total[layout.coordinate_mask(included)] += share * result.estimate
        decoded.append((est, msgs, result))
    return total, decoded


__all__ = ["Accepted", "Decoded", "RoundPlan", "accept", "byte_metrics", "decode",
           "fedavg_wire"]
