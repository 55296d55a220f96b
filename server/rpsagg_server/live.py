"""A round in memory, its persistence form, its dashboard view, and submission checks."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rpsagg import SPEC_VERSIONS, Estimator, check_spec_version
from rpsagg.schemes import WireProfile, scheme_traits
from rpsagg.spec import SpecTooOld, UnknownSpecVersion
from rpsagg_server.config import ServerConfig
from rpsagg_server.decoding import DecodeOutcome
from rpsagg_server.errors import DomainError, Forbidden, InvalidRequest, PreconditionFailed
from rpsagg_server.rows import StoredRound
from rpsagg_server.views import Arrival, EstimatedError, EstimateInfo, EvalErrors, RoundView
from rpsagg_wire.v1.serde import Submission

FloatArray = NDArray[np.float64]
MAX_CLIENT_ID = 128
#: the estimate of a round read back without its arrays (``LiveRound.light``)
_UNLOADED: FloatArray = np.empty((0, 0))
_UNLOADED.flags.writeable = False


@dataclass(frozen=True, eq=False)
class RoundArrays:
    """A finished round's arrays: what it costs in memory at large d.

    Attributes
    ----------
    estimate : ndarray, shape (m, d), or None
        A done round's decoded mean (None for a failed round).
    state : ndarray or None
        The task's global state GetResult answers with: after a done round (None in rows
        of a version that did not store it), or the one a failed round started from.
    """

    estimate: FloatArray | None
    state: FloatArray | None

    @property
    def nbytes(self) -> int:
        """Bytes of the two arrays (an array shared by both counted once)."""
        a = 0 if self.estimate is None else self.estimate.nbytes
        b = 0 if self.state is None or self.state is self.estimate else self.state.nbytes
        return a + b

    @classmethod
    def of_row(cls, r: StoredRound, default_shape: tuple[int, int]) -> RoundArrays:
        """The arrays of a whole row, bit for bit as stored (read-only views of the row's
        bytes, no copy); ``default_shape``: the estimate's ``(m, d)`` for rows of before
        the shape was stored."""
        est = None
        if r.estimate is not None:
            est = _array(r.estimate).reshape(r.info.get("shape", default_shape))
        if r.state == "done":
            state = None if r.next_state is None else _array(r.next_state).reshape(
                r.global_shape)
        else:
            state = _array(r.global_state).reshape(r.global_shape)
        return cls(est, state)


def _array(blob: bytes) -> FloatArray:
    """Stored little-endian float64 bytes as an array (a read-only view on this platform's
    byte order, else a copy)."""
    return np.frombuffer(blob, dtype="<f8").astype(np.float64, copy=False)


#: the name the domain's refusals had before :mod:`rpsagg_server.errors` (kept for callers)
Rejected = DomainError


def check_client_id(client_id: str) -> None:
    """Client ids are 1..128 characters of ``[A-Za-z0-9._-]``."""
    ok = 1 <= len(client_id) <= MAX_CLIENT_ID and all(
        ch.isascii() and (ch.isalnum() or ch in "._-") for ch in client_id
    )
    if not ok:
        raise InvalidRequest(
            f"client_id must be 1..{MAX_CLIENT_ID} characters of [A-Za-z0-9._-]; "
            f"got {client_id!r}")


def check_bound(bound: str | None, client_id: str) -> None:
    """Refuse (:class:`~rpsagg_server.errors.Forbidden`) a request naming another client
    than ``bound``, the client its token belongs to (None: a token for any client, or no
    tokens)."""
    if bound is not None and bound != client_id:
        raise Forbidden(
            f"this token belongs to client {bound!r}, not {client_id!r}")


def check_submission_spec(sub: Submission, wire: WireProfile) -> None:
    """Refuse a submission encoded with a wire format that cannot describe this round.

    ``wire``: the round's messages; their ``spec_version`` is the round's (the least version
    that defines what the round uses, :data:`rpsagg.spec.FEATURE_SPEC`). A version the
    server does not speak is an invalid request (the message names the versions it speaks); a
    known version older than the round's (e.g. ``rpsagg-seed-v1`` for a round of the
    randomized DCT) is a failed precondition, naming what needs the round's version
    (:attr:`~rpsagg.schemes.WireProfile.spec_reason`: the projection, quantized values,
    quantized blockwise values). No ``spec_version`` (a client from before the field)
    counts as ``rpsagg-seed-v1``.
    """
    try:
        check_spec_version(sub.spec_version, wire.spec_version)
    except SpecTooOld as exc:
        raise PreconditionFailed(f"submission {exc}; {wire.spec_reason} "
                                 "(see RoundInfo.spec_version)") from None
    except UnknownSpecVersion:
        raise InvalidRequest(
            f"submission encoded with spec version {sub.spec_version!r}, which "
            f"this server does not speak; it speaks {', '.join(SPEC_VERSIONS)}"
            ) from None


def validate_submission(sub: Submission, cfg: ServerConfig, m: int, wire: WireProfile) -> None:
    """Check the shape and content of a submission against the job; raises
    :class:`~rpsagg_server.errors.InvalidRequest`.

    Each vector is checked against the round's :class:`~rpsagg.schemes.WireProfile` (its
    estimator's :attr:`~rpsagg.Estimator.wire`, built once per admission pass); the
    evaluation references against the configuration."""
    if len(sub.vectors) != m:
        raise InvalidRequest(f"expected m={m} vector(s) per submission for task {cfg.task!r}; "
                             f"got {len(sub.vectors)}")
    for j, v in enumerate(sub.vectors):
        try:
            wire.validate(v, f"vectors[{j}]")
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        if cfg.eval:
            if v.reference is None:
                raise InvalidRequest(f"vectors[{j}] lacks its reference vector (the server "
                                     "runs in evaluation mode)")
            if v.reference.size != cfg.d:
                raise InvalidRequest(f"vectors[{j}].reference has {v.reference.size} values; "
                                     f"expected d={cfg.d}")
            if not np.all(np.isfinite(v.reference)):
                raise InvalidRequest(f"vectors[{j}].reference contains NaN or Inf")
            with np.errstate(over="ignore"):
                norm2 = float(np.add.reduce(np.square(v.reference)))  # no BLAS threads
            if not math.isfinite(norm2):  # 1e200 is finite, its square is not
                raise InvalidRequest(f"vectors[{j}].reference has a squared norm that overflows "
                                     "float64; the evaluation could not use it")
        elif v.reference is not None:
            raise InvalidRequest(f"vectors[{j}] carries a reference vector but the server is "
                                 "not in evaluation mode")


@dataclass(eq=False)
class LiveRound:
    """Mutable round record owned by the engine."""

    round_id: int
    nonce: int
    task_step: int
    transform: str
    r_prior: float | None
    global_state: FloatArray
    opened_at: float
    state: str = "open"
    reason: str = ""
    first_at: float | None = None
    deadline: float | None = None
    closed_at: float | None = None
    finished_at: float | None = None
    next_state: FloatArray | None = None
    outcome: DecodeOutcome | None = None
    estimator: Estimator | None = None
    #: transform=auto: the prior of every vector slot (vector j is decoded with
    #: ``r_priors[j]``; ``r_prior`` is vector 0's); None: every vector uses ``estimator``
    r_priors: tuple[float | None, ...] | None = None
    #: the values per client of this round (``--k``, or chosen by --target-rel-error);
    #: 0 in rows of before per-round k: the job's k
    k: int = 0
    #: the bits per value of this round (``--value-bits``, or chosen with k by
    #: ``--value-bits auto``); 0 in rows of before per-round widths: ``--value-bits``
    value_bits: int = 0
    subs: dict[str, Submission] = field(default_factory=dict)
    #: queued writes: client id -> (digest, the write batch's future, index in the batch)
    pending: dict[str, tuple[bytes, asyncio.Future[list[Any]], int]] = field(
        default_factory=dict)
    archived: dict[str, Any] = field(default_factory=dict)
    payload_total: int = 0
    wire_total: int = 0
    _arrivals: list[Arrival] = field(default_factory=list, repr=False)
    timer: asyncio.TimerHandle | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    #: a finished round read back at a restart without its arrays (``global_state`` and
    #: the outcome's estimate are empty; :meth:`arrays` reads them from the store): it
    #: is shown and its result kept, never written back
    light: bool = False

    # -- persistence -----------------------------------------------------------------------
    def stored(self) -> StoredRound:
        """The row to commit."""
        if self.light:
            raise RuntimeError(f"round {self.round_id} was read without its arrays; its "
                               "row is never written back")
        o = self.outcome
        info: dict[str, Any] = {
            "first_at": self.first_at, "deadline": self.deadline, "closed_at": self.closed_at,
            "finished_at": self.finished_at,
        }
        if self.r_priors is not None:
            info["r_priors"] = list(self.r_priors)
        if self.k:
            info["k"] = self.k
        if self.value_bits:
            info["value_bits"] = self.value_bits
        if self.state in ("done", "failed"):
            info["archived"] = {
                "contributors": [[c, str(sub.client_seed)] for c, sub in self.subs.items()],
                "payload_bytes": self.payload_bytes(), "wire_bytes": self.wire_bytes(),
                "m": self.m(),
                "arrivals": [[a.client_id, a.received_at, a.wire_bytes, a.payload_bytes]
                             for a in self.arrivals()],
            }
        if o is not None:
            info.update(n_prime=o.n_prime, beta=o.beta, c=_json_float(o.c), seconds=o.seconds,
                        r_hat=_json_float(o.r_hat), eval_errors=o.eval_errors,
                        shape=list(o.estimate.shape))
            if o.estimated_error is not None:
                e = o.estimated_error
                info["estimated_error"] = [_json_float(e.squared_error),
                                           _json_float(e.squared_error_stderr),
                                           _json_float(e.mean_norm_squared), e.method]
        gs = np.ascontiguousarray(self.global_state, dtype="<f8")
        return StoredRound(
            round_id=self.round_id, nonce=self.nonce, state=self.state, reason=self.reason,
            task_step=self.task_step, transform=self.transform, r_prior=self.r_prior,
            global_state=gs.tobytes(), global_shape=tuple(gs.shape), opened_at=self.opened_at,
            info=info,
            estimate=(None if o is None
                      else np.ascontiguousarray(o.estimate, dtype="<f8").tobytes()),
            next_state=(None if self.next_state is None
                        else np.ascontiguousarray(self.next_state, dtype="<f8").tobytes()),
        )

    @classmethod
    def from_stored(cls, r: StoredRound, cfg: ServerConfig, m: int) -> LiveRound:
        """Rebuild a round from its row (submissions are loaded separately). A row read
        without its arrays (``r.arrays`` False: a finished round) gives a :attr:`light`
        round."""
        light = not r.arrays
        gs = (np.empty((0,)) if light else np.frombuffer(r.global_state, dtype="<f8").astype(
            np.float64).reshape(r.global_shape))
        info = r.info
        live = cls(round_id=r.round_id, nonce=r.nonce, task_step=r.task_step,
                   transform=r.transform, r_prior=r.r_prior, global_state=gs,
                   opened_at=r.opened_at, state=r.state, reason=r.reason,
                   first_at=info.get("first_at"), deadline=info.get("deadline"),
                   closed_at=info.get("closed_at"), finished_at=info.get("finished_at"),
                   light=light)
        live.archived = info.get("archived", {})
        live.k = int(info.get("k") or cfg.k)
        live.value_bits = int(info.get("value_bits") or cfg.fixed_value_bits or 32)
        priors = info.get("r_priors")  # absent in rows of before the per-vector priors
        if priors is not None:
            live.r_priors = tuple(None if p is None else float(p) for p in priors)
        if r.next_state is not None:
            live.next_state = np.frombuffer(r.next_state, dtype="<f8").astype(
                np.float64).reshape(gs.shape)
        if r.estimate is not None:
            est = (_UNLOADED if light
                   else np.frombuffer(r.estimate, dtype="<f8").astype(np.float64).reshape(
                       info.get("shape", [m, cfg.d])))
            ev = info.get("eval_errors")
            se = info.get("estimated_error")  # absent in rows of before the estimate
            estimated = None if se is None else EstimatedError(
                _from_json_float(se[0]), _from_json_float(se[1]), _from_json_float(se[2]),
                str(se[3]))
            live.outcome = DecodeOutcome(
                est, int(info["n_prime"]),
                float(info["beta"]), _from_json_float(info["c"]), float(info["seconds"]),
                _from_json_float(info["r_hat"]), None if ev is None else tuple(ev), estimated,
            )
        return live

    def add(self, sub: Submission, received_at: float) -> None:
        """Record a committed submission (keeps the byte totals current)."""
        self.subs[sub.client_id] = sub
        payload = sub.payload_bytes
        self.payload_total += payload
        self.wire_total += sub.wire_bytes
        self._arrivals.append(Arrival(sub.client_id, received_at, sub.wire_bytes, payload))

    # -- summaries (live, or archived for rounds finished before a restart) ---------------
    def contributors(self) -> list[tuple[str, int]]:
        """``(client_id, client_seed)`` of every committed submission."""
        if self.subs or not self.archived:
            return [(c, s.client_seed) for c, s in self.subs.items()]
        return [(c, int(seed)) for c, seed in self.archived["contributors"]]

    def payload_bytes(self) -> int:
        """Seeds, values and indices received."""
        if self.subs or not self.archived:
            return self.payload_total
        return int(self.archived["payload_bytes"])

    def wire_bytes(self) -> int:
        """Serialized Submit requests received (eval references excluded)."""
        if self.subs or not self.archived:
            return self.wire_total
        return int(self.archived["wire_bytes"])

    def arrivals(self) -> list[Arrival]:
        """Who submitted, when, and how many bytes (the dashboard's per-client figures)."""
        if self.subs or not self.archived:
            return list(self._arrivals)  # kept by add(), in commit order
        return [Arrival(str(c), float(t), int(w), int(p))
                for c, t, w, p in self.archived.get("arrivals", [])]

    def m(self) -> int:
        """Vectors per submission (1 before any arrived)."""
        if self.subs:
            return len(next(iter(self.subs.values())).vectors)
        return int(self.archived.get("m", 1))

    # -- dashboard view --------------------------------------------------------------------
    def view(self, cfg: ServerConfig, clients: dict[str, int], projection: str = "",
             block_size: int = 0) -> RoundView:
        """Snapshot for :class:`~rpsagg_server.state.ServerState`; ``projection`` and
        ``block_size``: the job's (the engine's encoding)."""
        arrived = tuple(sorted((c for c, _ in self.contributors()),
                               key=lambda c: clients.get(c, 0)))
        arrived_set = set(arrived)
        missing = tuple(c for c in sorted(clients, key=clients.__getitem__)
                        if c not in arrived_set)
        o = self.outcome
        m = self.m()
        ev = None
        if o is not None and o.eval_errors is not None:
            ev = EvalErrors(*o.eval_errors)
        return RoundView(
            round_id=self.round_id, state=self.state, reason=self.reason, nonce=self.nonce,
            scheme=cfg.estimator, transform=self.transform, task_step=self.task_step,
            opened_at=self.opened_at, first_submission_at=self.first_at,
            deadline_at=self.deadline, closed_at=self.closed_at, finished_at=self.finished_at,
            clients_expected=cfg.n, clients_arrived=arrived, clients_missing=missing,
            payload_bytes=self.payload_bytes(), wire_bytes=self.wire_bytes(),
            raw_float32_bytes=len(arrived) * m * cfg.d * 4,
            decode_seconds=None if o is None else o.seconds,
            c=None if o is None or math.isnan(o.c) else o.c,
            beta=None if o is None else o.beta,
            r_hat=None if o is None or math.isnan(o.r_hat) else o.r_hat,
            r_prior=self.r_prior, eval_errors=ev,
            arrivals=tuple(sorted(self.arrivals(), key=lambda a: clients.get(a.client_id, 0))),
            estimated_error=None if o is None else o.estimated_error,
            k=(self.k or cfg.k) if scheme_traits(cfg.estimator).takes_k else 0,
            value_bits=self.value_bits or cfg.fixed_value_bits or 32,
            projection=projection, block_size=block_size,
        )


    def estimate_info(self, view: RoundView, cfg: ServerConfig) -> EstimateInfo | None:
        """What the round's estimate came from (None unless it is done): with the
        projection, block size and value bits of ``view``."""
        o = self.outcome
        if o is None or self.state != "done":
            return None
        k = (self.k or cfg.k) if scheme_traits(cfg.estimator).takes_k else 0
        return EstimateInfo(
            round_id=self.round_id, n_prime=o.n_prime, scheme=cfg.estimator,
            transform=self.transform, n=cfg.n, k=k, d=cfg.d,
            wire_bytes=view.wire_bytes,
            payload_bytes=view.payload_bytes, contributors=view.clients_arrived,
            projection=view.projection, m=cfg.mean_vectors, block_size=view.block_size,
            value_bits=view.value_bits)

    def arrays(self) -> RoundArrays | None:
        """A finished round's arrays as the engine holds them (None while it runs, and for
        a :attr:`light` round)."""
        if self.light or self.state not in ("done", "failed"):
            return None
        o = self.outcome
        if self.state == "done":
            return RoundArrays(None if o is None else o.estimate, self.next_state)
        return RoundArrays(None, self.global_state)


def _json_float(x: float) -> float | None:
    return None if math.isnan(x) else x


def _from_json_float(x: float | None) -> float:
    return math.nan if x is None else float(x)
