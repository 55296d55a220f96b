"""Wire edge of the ``rpsagg.v1`` protocol: protobuf bytes <-> frozen dataclasses.

This is the only module that imports the generated ``*_pb2`` code. Servers register raw
(bytes-in) method handlers and parse here, so malformed bytes become a specific
``WireError`` (mapped to INVALID_ARGUMENT) instead of a generic deserialization failure.
Clients pass :func:`serializer` / :func:`deserializer` to ``channel.unary_unary``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from numpy.typing import NDArray

from rpsagg.quantize import pack_codes, unpack_codes
from rpsagg_wire.v1 import aggregation_pb2 as pb
from rpsagg_wire.v1.messages import (
    Contributor,
    GetResultRequest,
    GetRoundRequest,
    JoinReply,
    JoinRequest,
    RoundEvent,
    RoundInfo,
    RoundResult,
    RoundState,
    Submission,
    SubmitReply,
    VectorPayload,
    WatchRequest,
)

# re-exported: the job's field read without a parse is importable here too
from rpsagg_wire.v1.peek import JOB_FIELD as JOB_FIELD
from rpsagg_wire.v1.peek import peek_job as peek_job

SERVICE = "rpsagg.v1.Aggregation"
#: the protocol's package, what ``--version`` and ``/api/status`` name (``rpsagg.v1``)
PROTOCOL = SERVICE.rsplit(".", 1)[0]
#: the wire's ``RoundState`` numbers: each state's position in :class:`RoundState`
STATES = tuple(RoundState)


def _state_number(state: RoundState) -> Any:
    """The ``RoundState`` enum number of a state (typed loosely: the stubs want the enum's
    own value type, which a plain index is at run time)."""
    return STATES.index(RoundState(state))


def method_path(name: str) -> str:
    """Full gRPC method path, e.g. ``/rpsagg.v1.Aggregation/Submit``."""
    return f"/{SERVICE}/{name}"


class WireError(ValueError):
    """A message that does not parse or whose packed arrays are malformed."""


# -- arrays ----------------------------------------------------------------------------------
def _unpack(raw: bytes, dtype: str, what: str) -> NDArray[Any]:
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise WireError(f"{what} has {len(raw)} bytes, not a multiple of {size}")
    return np.frombuffer(raw, dtype=dtype)


def _tensor(arr: NDArray[np.float64] | None) -> pb.Tensor:
    if arr is None:
        return pb.Tensor()
    a = np.ascontiguousarray(arr, dtype="<f8")
    return pb.Tensor(shape=list(a.shape), float64_le=a.tobytes())


def _from_tensor(t: pb.Tensor, what: str) -> NDArray[np.float64] | None:
    if not t.shape and not t.float64_le:
        return None
    flat = _unpack(t.float64_le, "<f8", what).astype(np.float64)
    shape = tuple(int(s) for s in t.shape)
    if math.prod(shape) != flat.size:
        raise WireError(f"{what} has {flat.size} values for shape {shape}")
    return flat.reshape(shape)


def _parse(cls: Any, raw: bytes, what: str) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(raw)
    except DecodeError as exc:
        raise WireError(f"malformed {what} message: {exc}") from None
    return msg


# -- per-message converters ------------------------------------------------------------------
def _enc_join_req(r: JoinRequest) -> bytes:
    return bytes(pb.JoinRequest(client_id=r.client_id, d=r.d, job=r.job).SerializeToString())


def _dec_join_req(raw: bytes) -> JoinRequest:
    m = _parse(pb.JoinRequest, raw, "JoinRequest")
    return JoinRequest(client_id=m.client_id, d=m.d, job=m.job)


def _enc_join_reply(r: JoinReply) -> bytes:
    msg = pb.JoinReply(client_index=r.client_index, n=r.n, task=r.task, data_hint=r.data_hint)
    msg.task_params.update(r.task_params)
    return bytes(msg.SerializeToString())


def _dec_join_reply(raw: bytes) -> JoinReply:
    m = _parse(pb.JoinReply, raw, "JoinReply")
    return JoinReply(client_index=m.client_index, n=m.n, task=m.task, data_hint=m.data_hint,
                     task_params=dict(m.task_params))


def _enc_get_round(r: GetRoundRequest) -> bytes:
    return bytes(pb.GetRoundRequest(client_id=r.client_id, job=r.job).SerializeToString())


def _dec_get_round(raw: bytes) -> GetRoundRequest:
    m = _parse(pb.GetRoundRequest, raw, "GetRoundRequest")
    return GetRoundRequest(client_id=m.client_id, job=m.job)


def _enc_round(r: RoundInfo) -> bytes:
    msg = pb.RoundInfo(
        round_id=r.round_id, nonce=r.nonce, scheme=r.scheme, n=r.n, k=r.k, d=r.d,
        transform=r.transform, task=r.task, m=r.m, global_state=_tensor(r.global_state),
        state=_state_number(r.state), deadline_unix_ms=r.deadline_unix_ms, eval=r.eval,
        job_done=r.job_done, task_step=r.task_step, total_rounds=r.total_rounds,
        job_failure=r.job_failure,
        spec_version=r.spec_version, projection=r.projection, block_size=r.block_size,
        value_bits=0 if r.value_bits == 32 else r.value_bits, bits=r.bits, job_id=r.job_id,
    )
    return bytes(msg.SerializeToString())


def _dec_round(raw: bytes) -> RoundInfo:
    m = _parse(pb.RoundInfo, raw, "RoundInfo")
    return RoundInfo(
        round_id=m.round_id, nonce=m.nonce, scheme=m.scheme, n=m.n, k=m.k, d=m.d,
        transform=m.transform, task=m.task, m=m.m,
        global_state=_from_tensor(m.global_state, "global_state"), state=STATES[m.state],
        deadline_unix_ms=m.deadline_unix_ms, eval=m.eval, job_done=m.job_done,
        task_step=m.task_step, total_rounds=m.total_rounds, job_failure=m.job_failure,
        spec_version=m.spec_version, projection=m.projection, block_size=m.block_size,
        value_bits=m.value_bits or 32, bits=m.bits, job_id=m.job_id,
    )


def _submit_pb(s: Submission) -> pb.SubmitRequest:
    vectors = []
    for v in s.vectors:
        vec = pb.Vector(values_f32=np.ascontiguousarray(v.values, dtype="<f4").tobytes())
        if v.codes is not None:
            vec.values_packed = pack_codes(v.codes, v.value_bits)
            vec.value_bits = v.value_bits
            vec.value_count = int(v.codes.size)
            vec.scale = v.scale
            if v.scales is not None:
                vec.scales_f32 = np.ascontiguousarray(v.scales, dtype="<f4").tobytes()
        if v.indices is not None:
            vec.indices_i32 = np.ascontiguousarray(v.indices, dtype="<i4").tobytes()
        if v.reference is not None:
            vec.reference_f64 = np.ascontiguousarray(v.reference, dtype="<f8").tobytes()
        vectors.append(vec)
    return pb.SubmitRequest(
        round_id=s.round_id, client_id=s.client_id, client_seed=s.client_seed, vectors=vectors,
        spec_version=s.spec_version, job=s.job,
    )


def _codes(v: Any, j: int) -> NDArray[np.uint32]:
    if not 1 <= v.value_bits <= 31:
        raise WireError(f"vectors[{j}].value_bits must be in [1, 31]; got {v.value_bits}")
    try:
        return unpack_codes(v.values_packed, int(v.value_count), int(v.value_bits))
    except ValueError as exc:
        raise WireError(f"vectors[{j}].values_packed: {exc}") from None


def _enc_submit(s: Submission) -> bytes:
    return bytes(_submit_pb(s).SerializeToString(deterministic=True))


def _dec_submit(raw: bytes) -> Submission:
    m = _parse(pb.SubmitRequest, raw, "SubmitRequest")
    vectors = []
    has_refs = False
    for j, v in enumerate(m.vectors):
        values = _unpack(v.values_f32, "<f4", f"vectors[{j}].values_f32").astype(np.float32)
        indices = None
        if v.indices_i32:
            indices = _unpack(v.indices_i32, "<i4", f"vectors[{j}].indices_i32").astype(np.int64)
        reference = None
        if v.reference_f64:
            reference = _unpack(v.reference_f64, "<f8", f"vectors[{j}].reference_f64").astype(
                np.float64
            )
            has_refs = True
        codes = None
        if v.value_bits or v.values_packed or v.value_count:
            codes = _codes(v, j)
            if values.size:
                raise WireError(f"vectors[{j}] has both values_f32 and packed values")
        scales = None
        if v.scales_f32:
            scales = _unpack(v.scales_f32, "<f4", f"vectors[{j}].scales_f32").astype(np.float32)
        vectors.append(VectorPayload(values=values, indices=indices, reference=reference,
                                     codes=codes, value_bits=v.value_bits or 32,
                                     scale=float(v.scale), scales=scales))
    canonical = m.SerializeToString(deterministic=True)
    wire = len(raw)
    if has_refs:  # exactly what the references added: their fields and the longer prefixes
        with_refs = m.ByteSize()
        for v in m.vectors:
            v.ClearField("reference_f64")
        wire -= with_refs - m.ByteSize()
    return Submission(
        round_id=m.round_id, client_id=m.client_id, client_seed=m.client_seed,
        vectors=tuple(vectors), digest=hashlib.sha256(canonical).digest(), wire_bytes=wire,
        spec_version=m.spec_version, canonical=canonical, job=m.job,
    )


def _enc_submit_reply(r: SubmitReply) -> bytes:
    msg = pb.SubmitReply(round_id=r.round_id, received=r.received, duplicate=r.duplicate)
    return bytes(msg.SerializeToString())


def _dec_submit_reply(raw: bytes) -> SubmitReply:
    m = _parse(pb.SubmitReply, raw, "SubmitReply")
    return SubmitReply(round_id=m.round_id, received=m.received, duplicate=m.duplicate)


def _enc_result_req(r: GetResultRequest) -> bytes:
    return bytes(pb.GetResultRequest(round_id=r.round_id, wait=r.wait,
                                     client_id=r.client_id, job=r.job).SerializeToString())


def _dec_result_req(raw: bytes) -> GetResultRequest:
    m = _parse(pb.GetResultRequest, raw, "GetResultRequest")
    return GetResultRequest(round_id=m.round_id, wait=m.wait, client_id=m.client_id,
                            job=m.job)


def _enc_result(r: RoundResult) -> bytes:
    msg = pb.RoundResult(
        round_id=r.round_id, state=_state_number(r.state), reason=r.reason,
        estimate=_tensor(r.estimate), global_state=_tensor(r.global_state), n_prime=r.n_prime,
        beta=r.beta, c=r.c, decode_seconds=r.decode_seconds,
        contributors=[pb.Contributor(client_id=c.client_id, client_seed=c.client_seed)
                      for c in r.contributors],
        r_hat=r.r_hat, eval_sq_error=r.eval_sq_error,
        eval_sq_error_rand_k=r.eval_sq_error_rand_k,
        eval_sq_error_rand_k_spatial=r.eval_sq_error_rand_k_spatial,
        job_done=r.job_done, nonce=r.nonce, transform=r.transform,
        payload_bytes=r.payload_bytes, wire_bytes=r.wire_bytes, **_est_fields(r),
    )
    return bytes(msg.SerializeToString())


def _dec_result(raw: bytes) -> RoundResult:
    m = _parse(pb.RoundResult, raw, "RoundResult")
    return RoundResult(
        round_id=m.round_id, state=STATES[m.state], reason=m.reason,
        estimate=_from_tensor(m.estimate, "estimate"),
        global_state=_from_tensor(m.global_state, "global_state"), n_prime=m.n_prime,
        beta=m.beta, c=m.c, decode_seconds=m.decode_seconds,
        contributors=tuple(Contributor(client_id=c.client_id, client_seed=c.client_seed)
                           for c in m.contributors),
        r_hat=m.r_hat, eval_sq_error=m.eval_sq_error,
        eval_sq_error_rand_k=m.eval_sq_error_rand_k,
        eval_sq_error_rand_k_spatial=m.eval_sq_error_rand_k_spatial, job_done=m.job_done,
        nonce=m.nonce, transform=m.transform, payload_bytes=m.payload_bytes,
        wire_bytes=m.wire_bytes, **_est_values(m),
    )


def _enc_watch(r: WatchRequest) -> bytes:
    return bytes(pb.WatchRequest(client_id=r.client_id, job=r.job).SerializeToString())


def _dec_watch(raw: bytes) -> WatchRequest:
    m = _parse(pb.WatchRequest, raw, "WatchRequest")
    return WatchRequest(client_id=m.client_id, job=m.job)


def _enc_event(e: RoundEvent) -> bytes:
    msg = pb.RoundEvent(round_id=e.round_id, state=_state_number(e.state), reason=e.reason,
                        job_done=e.job_done, received=e.received, **_est_fields(e))
    return bytes(msg.SerializeToString())


def _dec_event(raw: bytes) -> RoundEvent:
    m = _parse(pb.RoundEvent, raw, "RoundEvent")
    return RoundEvent(round_id=m.round_id, state=STATES[m.state], reason=m.reason,
                      job_done=m.job_done, received=m.received, **_est_values(m))


_EST = ("est_sq_error", "est_sq_error_stderr", "est_mean_sq_norm", "est_relative_error")


def _est_fields(r: RoundResult | RoundEvent) -> dict[str, float]:
    """The estimated-error fields to send: the ``optional`` ones that are not NaN (an unset
    field reads back as NaN, and a receiver that predates them ignores them)."""
    return {f: v for f in _EST if not math.isnan(v := getattr(r, f))}


def _est_values(m: Any) -> dict[str, float]:
    """The estimated-error fields received (NaN where unset)."""
    return {f: (getattr(m, f) if m.HasField(f) else math.nan) for f in _EST}


_REQ: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "Join": (_enc_join_req, _dec_join_req),
    "GetRound": (_enc_get_round, _dec_get_round),
    "Submit": (_enc_submit, _dec_submit),
    "GetResult": (_enc_result_req, _dec_result_req),
    "WatchRounds": (_enc_watch, _dec_watch),
}
_REPLY: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "Join": (_enc_join_reply, _dec_join_reply),
    "GetRound": (_enc_round, _dec_round),
    "Submit": (_enc_submit_reply, _dec_submit_reply),
    "GetResult": (_enc_result, _dec_result),
    "WatchRounds": (_enc_event, _dec_event),
}


def serializer(method: str) -> Callable[[Any], bytes]:
    """Client side: request dataclass -> bytes for ``method``."""
    return _REQ[method][0]


def deserializer(method: str) -> Callable[[bytes], Any]:
    """Client side: reply bytes -> dataclass for ``method``."""
    return _REPLY[method][1]


def parse_request(method: str, raw: bytes) -> Any:
    """Server side: request bytes -> dataclass (raises :class:`WireError`)."""
    return _REQ[method][1](raw)


def reply_serializer(method: str) -> Callable[[Any], bytes]:
    """Server side: reply dataclass -> bytes for ``method``."""
    return _REPLY[method][0]


def encode_submission(s: Submission) -> bytes:
    """Canonical bytes of a submission (what is stored and hashed)."""
    return _enc_submit(s)


def canonical_bytes(s: Submission) -> bytes:
    """The canonical bytes a parsed submission's digest was computed from (carried from the
    parse: no second serialization), or ``s`` encoded when it was built in code."""
    return s.canonical or _enc_submit(s)


def decode_submission(raw: bytes) -> Submission:
    """Parse stored or received submission bytes."""
    return _dec_submit(raw)

