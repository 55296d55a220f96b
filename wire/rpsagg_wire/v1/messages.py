"""The ``rpsagg.v1`` messages as frozen dataclasses (what client and server code handle).

:mod:`rpsagg_wire.v1.serde` converts them to and from protobuf bytes (and re-exports every
name here). Build them by keyword: most have many fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from rpsagg.quantize import packed_size


class RoundState(StrEnum):
    """A round's state, in the order of the wire's ``RoundState`` enum (its numbers are the
    positions: serde maps them). A member equals its name as a string."""

    UNSPECIFIED = "unspecified"  # no round: RoundInfo outside a round, the job's end event
    OPEN = "open"
    COLLECTING = "collecting"
    DECODING = "decoding"
    DONE = "done"
    FAILED = "failed"


#: the states a round goes through (UNSPECIFIED is none)
ROUND_STATES = tuple(s for s in RoundState if s is not RoundState.UNSPECIFIED)
#: a round that takes submissions
ACCEPTING = frozenset({RoundState.OPEN, RoundState.COLLECTING})
#: a round that has not finished
LIVE = frozenset({RoundState.OPEN, RoundState.COLLECTING, RoundState.DECODING})
#: a round that has finished
FINISHED = frozenset({RoundState.DONE, RoundState.FAILED})


@dataclass(frozen=True)
class JoinRequest:
    """Join with a client id (and, optionally, the length d of the client's vectors: a
    server started with ``--d 0`` takes the first join's d for the job; 0: not said)."""

    client_id: str
    d: int = 0
    job: str = ""


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
    job: str = ""


@dataclass(frozen=True)
class RoundInfo:
    """The current round (see ``docs/protocol.md``); ``state`` is a :class:`RoundState`."""

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
    state: RoundState
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
    job_id: int = 0


@dataclass(frozen=True, eq=False)
class VectorPayload:
    """One encoded vector: float32 values (or b-bit codes and a float32 scale), optional
    indices, optional eval reference.

    A quantized vector (``value_bits < 32``) has empty ``values`` and carries ``codes``
    (uint32, each ``< 2^value_bits``) and ``scale``; the decoder turns them into values with
    its scheme's code book (``rpsagg.quantize.dequantize``). A quantized blockwise vector
    carries one float32 scale per block in ``scales`` instead (``scale`` is 0).
    """

    values: NDArray[np.float32]
    indices: NDArray[np.int64] | None = None
    reference: NDArray[np.float64] | None = None
    codes: NDArray[np.uint32] | None = None
    value_bits: int = 32
    scale: float = 0.0
    scales: NDArray[np.float32] | None = None

    @property
    def count(self) -> int:
        """Number of values sent (codes when quantized)."""
        return int(self.values.size if self.codes is None else self.codes.size)

    @property
    def payload_bytes(self) -> int:
        """Values (4 bytes each, or the packed codes plus the 4-byte scale, 4 bytes per block
        scale for blockwise) and indices at 4 bytes each (the seed is counted per
        submission)."""
        if self.codes is None:
            values = 4 * int(self.values.size)
        else:
            scales = 1 if self.scales is None else int(self.scales.size)
            values = packed_size(int(self.codes.size), self.value_bits) + 4 * scales
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
    canonical : bytes
        The deterministic serialization ``digest`` was computed from, as parsed (what the
        server stores); empty for a submission built in code (``serde.canonical_bytes``
        encodes it then).
    """

    round_id: int
    client_id: str
    client_seed: int
    vectors: tuple[VectorPayload, ...]
    digest: bytes = b""
    wire_bytes: int = 0
    spec_version: str = ""
    canonical: bytes = field(default=b"", repr=False)
    job: str = ""

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
    job: str = ""


@dataclass(frozen=True)
class Contributor:
    """A client whose submission was decoded, with its client seed."""

    client_id: str
    client_seed: int


@dataclass(frozen=True, eq=False)
class RoundResult:
    """A round's outcome; NaN stands for "not applicable" in the float fields.

    The ``est_*`` fields are the error the server estimated from the messages alone (every
    mode), summed over the m vectors: ``est_sq_error`` of ``E||estimate - true mean||^2``,
    its standard error, ``est_mean_sq_norm`` of ``||true mean||^2`` and their ratio
    ``est_relative_error``; NaN before the decode or from a server that does not send them.
    """

    round_id: int
    state: RoundState
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
    est_sq_error: float = math.nan
    est_sq_error_stderr: float = math.nan
    est_mean_sq_norm: float = math.nan
    est_relative_error: float = math.nan


@dataclass(frozen=True)
class WatchRequest:
    """Subscribe to round events; ``client_id`` (optional) as in :class:`GetRoundRequest`."""

    client_id: str = ""
    job: str = ""


@dataclass(frozen=True)
class RoundEvent:
    """A round transition; a ``done`` round's event carries its estimated error (the
    ``est_*`` fields of :class:`RoundResult`; NaN otherwise)."""

    round_id: int
    state: RoundState
    reason: str = ""
    job_done: bool = False
    received: int = 0
    est_sq_error: float = math.nan
    est_sq_error_stderr: float = math.nan
    est_mean_sq_norm: float = math.nan
    est_relative_error: float = math.nan
