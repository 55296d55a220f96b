"""Response models of the JSON API (they are what ``/docs`` documents).

The models are plain projections of :mod:`rpsagg_server.state` snapshots; the ``from_*``
functions build them, so the routes stay one-liners.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import rpsagg
from rpsagg.v1 import serde
from rpsagg_server.state import ClientView, JobView, RoundView

PROTOCOL = serde.SERVICE.rsplit(".", 1)[0]  # "rpsagg.v1"


class Timestamps(BaseModel):
    """When a round changed state (unix seconds; null until it happens)."""

    opened: float
    first_submission: float | None
    deadline: float | None = Field(description="Null while the deadline is not running.")
    closed: float | None
    finished: float | None


class RoundClients(BaseModel):
    """Who a round is waiting for."""

    expected: int = Field(description="n, the clients the round waits for.")
    arrived: list[str] = Field(description="Client ids that submitted.")
    missing: list[str] = Field(description="Joined client ids that have not submitted.")


class RoundBytes(BaseModel):
    """Bytes received in a round against sending the raw float32 vectors."""

    payload: int = Field(description="Encoded payload: 8-byte seed + 4 bytes per value/index.")
    wire: int = Field(description="Serialized gRPC requests (eval references excluded).")
    raw_float32: int = Field(description="What the raw vectors cost: arrived * m * d * 4.")
    wire_fraction_of_raw: float | None = Field(
        description="wire / raw_float32 (null before any arrival).")


class SquaredErrors(BaseModel):
    """Evaluation mode: ``||x_hat - x_bar||^2`` summed over the round's m vectors."""

    estimate: float = Field(description="The server's estimator.")
    rand_k: float = Field(description="Rand-k on the same vectors and seeds (shadow).")
    rand_k_spatial: float = Field(description="Rand-k-Spatial(avg), same vectors and seeds.")


class Round(BaseModel):
    """One round: state, timing, arrivals, bytes, decode and (evaluation mode) errors."""

    round_id: int
    state: str = Field(description="open, collecting, decoding, done or failed.")
    reason: str = Field(description="Why a round failed (empty otherwise).")
    nonce: str = Field(description="Round nonce (decimal string: it is a 64-bit integer).")
    scheme: str
    transform: str = Field(description="Transform label used (or planned) at decode.")
    task_step: int
    timestamps: Timestamps
    clients: RoundClients
    bytes: RoundBytes
    decode_seconds: float | None
    c: float | None = Field(description="Transform coefficient (spatial schemes).")
    beta: float | None = Field(description="Unbiasing scalar used at decode.")
    r_hat: float | None = Field(description="Correlation R estimated from the sketches.")
    r_prior: float | None = Field(description="Prior R the transform used (transform=auto).")
    squared_error: SquaredErrors | None = Field(
        description="Evaluation mode only; null otherwise (the MSE is then unknown).")


class RoundPage(BaseModel):
    """A page of rounds, newest first."""

    rounds: list[Round]
    total: int = Field(description="Rounds the server knows about.")
    next_before: int | None = Field(
        description="Pass as ``before`` for the next (older) page; null on the last page.")


class Config(BaseModel):
    """The job's configuration (``settings`` has every flag; never token contents)."""

    scheme: str
    transform: str
    n: int
    k: int
    d: int
    task: str
    rounds: int
    round_timeout: float
    min_clients: int
    evaluation: bool = Field(description="Evaluation mode: squared errors are recorded.")
    settings: dict[str, Any]


class Client(BaseModel):
    """A joined client."""

    client_id: str
    index: int
    joined_at: float


class Job(BaseModel):
    """Progress of the server's task."""

    task: str
    steps_done: int
    rounds_planned: int
    done: bool
    r_hat_smoothed: float | None


class Versions(BaseModel):
    """Versions of the specifications the server implements."""

    seed_spec: str = Field(description="Newest wire format (docs/wire-format.md) the server "
                           "speaks; submissions may use it or an older one its rounds allow.")
    protocol: str = Field(description="gRPC protocol package.")
    rpsagg: str = Field(description="Library version.")


class Status(BaseModel):
    """What the server is doing now."""

    config: Config
    current_round: Round | None = Field(
        description="The open/collecting/decoding round; null before the first round "
        "and after the job is done.")
    latest_round: Round | None = Field(description="The newest round in any state.")
    clients_joined: int
    clients: list[Client]
    job: Job | None
    uptime_seconds: float
    started_at: float
    versions: Versions


class Health(BaseModel):
    """Liveness."""

    status: str


class Readiness(BaseModel):
    """Readiness: every check must pass."""

    ready: bool
    checks: dict[str, bool]


def from_round(view: RoundView) -> Round:
    """The API model of a :class:`~rpsagg_server.state.RoundView`."""
    ev = view.eval_errors
    raw = view.raw_float32_bytes
    return Round(
        round_id=view.round_id, state=view.state, reason=view.reason, nonce=str(view.nonce),
        scheme=view.scheme, transform=view.transform, task_step=view.task_step,
        timestamps=Timestamps(
            opened=view.opened_at, first_submission=view.first_submission_at,
            deadline=view.deadline_at, closed=view.closed_at, finished=view.finished_at),
        clients=RoundClients(expected=view.clients_expected,
                             arrived=list(view.clients_arrived),
                             missing=list(view.clients_missing)),
        bytes=RoundBytes(payload=view.payload_bytes, wire=view.wire_bytes, raw_float32=raw,
                         wire_fraction_of_raw=view.wire_bytes / raw if raw else None),
        decode_seconds=view.decode_seconds, c=view.c, beta=view.beta, r_hat=view.r_hat,
        r_prior=view.r_prior,
        squared_error=None if ev is None else SquaredErrors(
            estimate=ev.estimate, rand_k=ev.rand_k, rand_k_spatial=ev.rand_k_spatial),
    )


def from_config(cfg: dict[str, Any]) -> Config:
    """The API model of the server's configuration dict (``ServerConfig.public_dict()``)."""
    return Config(
        scheme=str(cfg["estimator"]), transform=str(cfg["transform"]), n=int(cfg["n"]),
        k=int(cfg["k"]), d=int(cfg["d"]), task=str(cfg["task"]), rounds=int(cfg["rounds"]),
        round_timeout=float(cfg["round_timeout"]), min_clients=int(cfg["min_clients"]),
        evaluation=bool(cfg["eval"]), settings=cfg,
    )


def from_client(c: ClientView) -> Client:
    """The API model of a joined client."""
    return Client(client_id=c.client_id, index=c.index, joined_at=c.joined_at)


def from_job(job: JobView) -> Job:
    """The API model of the task's progress."""
    return Job(task=job.task, steps_done=job.steps_done, rounds_planned=job.rounds_planned,
               done=job.done, r_hat_smoothed=job.r_hat_smoothed)


def versions() -> Versions:
    """The spec versions this build implements."""
    return Versions(seed_spec=rpsagg.SPEC_VERSION, protocol=PROTOCOL, rpsagg=rpsagg.__version__)
