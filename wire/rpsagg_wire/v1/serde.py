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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from numpy.typing import NDArray

from rpsagg._quantize import pack_codes, packed_size, unpack_codes
from rpsagg_wire.v1 import aggregation_pb2 as pb

SERVICE = "rpsagg.v1.Aggregation"
METHODS = ("Join", "GetRound", "Submit", "GetResult", "WatchRounds")
STATES = ("unspecified", "open", "collecting", "decoding", "done", "failed")


def _state_number(name: str) -> Any:
    """The ``RoundState`` enum number of a state name (typed loosely: the stubs want the
    enum's own value type, which a plain index is at run time)."""
    return STATES.index(name)


def method_path(name: str) -> str:
    """Full gRPC method path, e.g. ``/rpsagg.v1.Aggregation/Submit``."""
    return f"/{SERVICE}/{name}"


class WireError(ValueError):
    """A message that does not parse or whose packed arrays are malformed."""


# -- dataclasses -----------------------------------------------------------------------------
@dataclass(frozen=True)
class JoinRequest:
    """Join with a client id."""

    client_id: str


@dataclass(frozen=True)
class JoinReply:
    """The client's index among the n clients and what the task needs to know."""

    client_index: int
    n: int
    task: str
    data_hint: str = ""
    task_params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GetRoundRequest:
    """Ask for the current round; ``client_id`` (optional) names the asking client, which
    then counts as having seen ``job_done`` when the reply says so (the drained job end)."""

    client_id: str = ""


@dataclass(frozen=True)
class RoundInfo:
    """The current round (see ``docs/protocol.md``); ``state`` is a name from STATES."""

    round_id: int
    nonce: int
    scheme: str
    n: int
    k: int
    d: int
    transform: str
    task: str
    m: int
    global_state: NDArray[np.float64] | None
    state: str
    deadline_unix_ms: int
    eval: bool
    job_done: bool
    task_step: int
    total_rounds: int = 0
    job_failure: str = ""
    spec_version: str = ""
    projection: str = ""
    block_size: int = 0
    value_bits: int = 32
    bits: int = 0


@dataclass(frozen=True, eq=False)
class VectorPayload:
    """One encoded vector: float32 values (or b-bit codes and a float32 scale), optional
    indices, optional eval reference.

    A quantized vector (``value_bits < 32``) has empty ``values`` and carries ``codes``
    (uint32, each ``< 2^value_bits``) and ``scale``; the decoder turns them into values with
    its scheme's code book (``rpsagg._quantize.dequantize``).
    """

    values: NDArray[np.float32]
    indices: NDArray[np.int64] | None = None
    reference: NDArray[np.float64] | None = None
    codes: NDArray[np.uint32] | None = None
    value_bits: int = 32
    scale: float = 0.0

    @property
    def count(self) -> int:
        """Number of values sent (codes when quantized)."""
        return int(self.values.size if self.codes is None else self.codes.size)

    @property
    def payload_bytes(self) -> int:
        """Values (4 bytes each, or the packed codes plus the 4-byte scale) and indices at 4
        bytes each (the seed is counted per submission)."""
        if self.codes is None:
            values = 4 * int(self.values.size)
        else:
            values = packed_size(int(self.codes.size), self.value_bits) + 4
        return values + (0 if self.indices is None else 4 * int(self.indices.size))


@dataclass(frozen=True, eq=False)
class Submission:
    """One client's submission for one round.

    Attributes
    ----------
    digest : bytes
        SHA-256 of the deterministic serialization: equal digests mean byte-identical
        submissions (a retry).
    wire_bytes : int
        Size of the serialized request minus the eval references (communication cost).
    spec_version : str
        Wire format the vectors were encoded with, as sent; ``""`` (a client from before the
        field) stands for ``rpsagg-seed-v1``.
    """

    round_id: int
    client_id: str
    client_seed: int
    vectors: tuple[VectorPayload, ...]
    digest: bytes = b""
    wire_bytes: int = 0
    spec_version: str = ""

    @property
    def payload_bytes(self) -> int:
        """8-byte seed plus the vectors' values and indices."""
        return 8 + sum(v.payload_bytes for v in self.vectors)


@dataclass(frozen=True)
class SubmitReply:
    """Ack: the submission is committed (``duplicate`` for an identical retry)."""

    round_id: int
    received: int
    duplicate: bool


@dataclass(frozen=True)
class GetResultRequest:
    """Ask for a round's result (0 = latest finished); ``wait`` blocks until it finishes.

    ``client_id`` (optional) names the asking client, as in :class:`GetRoundRequest`.
    """

    round_id: int = 0
    wait: bool = False
    client_id: str = ""


@dataclass(frozen=True)
class Contributor:
    """A client whose submission was decoded, with its client seed."""

    client_id: str
    client_seed: int


@dataclass(frozen=True, eq=False)
class RoundResult:
    """A round's outcome; NaN stands for "not applicable" in the float fields."""

    round_id: int
    state: str
    reason: str
    estimate: NDArray[np.float64] | None
    global_state: NDArray[np.float64] | None
    n_prime: int
    beta: float
    c: float
    decode_seconds: float
    contributors: tuple[Contributor, ...]
    r_hat: float
    eval_sq_error: float
    eval_sq_error_rand_k: float
    eval_sq_error_rand_k_spatial: float
    job_done: bool
    nonce: int
    transform: str
    payload_bytes: int = 0
    wire_bytes: int = 0


@dataclass(frozen=True)
class WatchRequest:
    """Subscribe to round events; ``client_id`` (optional) as in :class:`GetRoundRequest`."""

    client_id: str = ""


@dataclass(frozen=True)
class RoundEvent:
    """A round transition."""

    round_id: int
    state: str
    reason: str = ""
    job_done: bool = False
    received: int = 0


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
    return bytes(pb.JoinRequest(client_id=r.client_id).SerializeToString())


def _dec_join_req(raw: bytes) -> JoinRequest:
    return JoinRequest(_parse(pb.JoinRequest, raw, "JoinRequest").client_id)


def _enc_join_reply(r: JoinReply) -> bytes:
    msg = pb.JoinReply(client_index=r.client_index, n=r.n, task=r.task, data_hint=r.data_hint)
    msg.task_params.update(r.task_params)
    return bytes(msg.SerializeToString())


def _dec_join_reply(raw: bytes) -> JoinReply:
    m = _parse(pb.JoinReply, raw, "JoinReply")
    return JoinReply(m.client_index, m.n, m.task, m.data_hint, dict(m.task_params))


def _enc_get_round(r: GetRoundRequest) -> bytes:
    return bytes(pb.GetRoundRequest(client_id=r.client_id).SerializeToString())


def _dec_get_round(raw: bytes) -> GetRoundRequest:
    return GetRoundRequest(_parse(pb.GetRoundRequest, raw, "GetRoundRequest").client_id)


def _enc_round(r: RoundInfo) -> bytes:
    msg = pb.RoundInfo(
        round_id=r.round_id, nonce=r.nonce, scheme=r.scheme, n=r.n, k=r.k, d=r.d,
        transform=r.transform, task=r.task, m=r.m, global_state=_tensor(r.global_state),
        state=_state_number(r.state), deadline_unix_ms=r.deadline_unix_ms, eval=r.eval,
        job_done=r.job_done, task_step=r.task_step, total_rounds=r.total_rounds,
        job_failure=r.job_failure,
        spec_version=r.spec_version, projection=r.projection, block_size=r.block_size,
        value_bits=0 if r.value_bits == 32 else r.value_bits, bits=r.bits,
    )
    return bytes(msg.SerializeToString())


def _dec_round(raw: bytes) -> RoundInfo:
    m = _parse(pb.RoundInfo, raw, "RoundInfo")
    return RoundInfo(
        m.round_id, m.nonce, m.scheme, m.n, m.k, m.d, m.transform, m.task, m.m,
        _from_tensor(m.global_state, "global_state"), STATES[m.state], m.deadline_unix_ms,
        m.eval, m.job_done, m.task_step, m.total_rounds, m.job_failure,
        m.spec_version, m.projection, m.block_size, m.value_bits or 32, m.bits,
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
        if v.indices is not None:
            vec.indices_i32 = np.ascontiguousarray(v.indices, dtype="<i4").tobytes()
        if v.reference is not None:
            vec.reference_f64 = np.ascontiguousarray(v.reference, dtype="<f8").tobytes()
        vectors.append(vec)
    return pb.SubmitRequest(
        round_id=s.round_id, client_id=s.client_id, client_seed=s.client_seed, vectors=vectors,
        spec_version=s.spec_version,
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
        vectors.append(VectorPayload(values, indices, reference, codes, v.value_bits or 32,
                                     float(v.scale)))
    canonical = m.SerializeToString(deterministic=True)
    wire = len(raw)
    if has_refs:  # exactly what the references added: their fields and the longer prefixes
        with_refs = m.ByteSize()
        for v in m.vectors:
            v.ClearField("reference_f64")
        wire -= with_refs - m.ByteSize()
    return Submission(
        m.round_id, m.client_id, m.client_seed, tuple(vectors),
        hashlib.sha256(canonical).digest(), wire, m.spec_version,
    )


def _enc_submit_reply(r: SubmitReply) -> bytes:
    msg = pb.SubmitReply(round_id=r.round_id, received=r.received, duplicate=r.duplicate)
    return bytes(msg.SerializeToString())


def _dec_submit_reply(raw: bytes) -> SubmitReply:
    m = _parse(pb.SubmitReply, raw, "SubmitReply")
    return SubmitReply(m.round_id, m.received, m.duplicate)


def _enc_result_req(r: GetResultRequest) -> bytes:
    return bytes(pb.GetResultRequest(round_id=r.round_id, wait=r.wait,
                                     client_id=r.client_id).SerializeToString())


def _dec_result_req(raw: bytes) -> GetResultRequest:
    m = _parse(pb.GetResultRequest, raw, "GetResultRequest")
    return GetResultRequest(m.round_id, m.wait, m.client_id)


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
        payload_bytes=r.payload_bytes, wire_bytes=r.wire_bytes,
    )
    return bytes(msg.SerializeToString())


def _dec_result(raw: bytes) -> RoundResult:
    m = _parse(pb.RoundResult, raw, "RoundResult")
    return RoundResult(
        m.round_id, STATES[m.state], m.reason, _from_tensor(m.estimate, "estimate"),
        _from_tensor(m.global_state, "global_state"), m.n_prime, m.beta, m.c, m.decode_seconds,
        tuple(Contributor(c.client_id, c.client_seed) for c in m.contributors), m.r_hat,
        m.eval_sq_error, m.eval_sq_error_rand_k, m.eval_sq_error_rand_k_spatial, m.job_done,
        m.nonce, m.transform, m.payload_bytes, m.wire_bytes,
    )


def _enc_watch(r: WatchRequest) -> bytes:
    return bytes(pb.WatchRequest(client_id=r.client_id).SerializeToString())


def _dec_watch(raw: bytes) -> WatchRequest:
    return WatchRequest(_parse(pb.WatchRequest, raw, "WatchRequest").client_id)


def _enc_event(e: RoundEvent) -> bytes:
    msg = pb.RoundEvent(round_id=e.round_id, state=_state_number(e.state), reason=e.reason,
                        job_done=e.job_done, received=e.received)
    return bytes(msg.SerializeToString())


def _dec_event(raw: bytes) -> RoundEvent:
    m = _parse(pb.RoundEvent, raw, "RoundEvent")
    return RoundEvent(m.round_id, STATES[m.state], m.reason, m.job_done, m.received)


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


def decode_submission(raw: bytes) -> Submission:
    """Parse stored or received submission bytes."""
    return _dec_submit(raw)
