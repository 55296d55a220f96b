"""Response models of the JSON API (they are what ``/docs`` documents).

The models are plain projections of :mod:`rpsagg_server.readmodel.state` snapshots; the ``from_*``
functions build them, so the routes stay one-liners.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

import rpsagg
from rpsagg_server.readmodel.state import (
    BetaView,
    ClientStats,
    ClientView,
    JobView,
    RoundView,
    TaskMetrics,
)
from rpsagg_server.readmodel.views import EstimatedError
from rpsagg_wire.v1 import serde


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

    estimate: float | None = Field(description="The server's estimator (null when it could "
                                   "not be computed, e.g. an overflow).")
    rand_k: float | None = Field(description="Rand-k on the same vectors and seeds (shadow).")
    rand_k_spatial: float | None = Field(
        description="Rand-k-Spatial(avg), same vectors and seeds.")
    truth_sq_norm: float | None = Field(
        description="||x_bar||^2 summed over m: what the relative errors divide by.")


class RelativeErrors(BaseModel):
    """Evaluation mode: ``||x_hat - x_bar||^2 / ||x_bar||^2`` (sums over the m vectors)."""

    estimate: float | None = Field(description="The server's estimator.")
    rand_k: float | None = Field(description="Rand-k on the same vectors and seeds.")
    rand_k_spatial: float | None = Field(
        description="Rand-k-Spatial(avg), same vectors and seeds.")


class ErrorEstimate(BaseModel):
    """The round's error estimated from its messages alone (every mode, every scheme),
    summed over the round's m vectors like the evaluation-mode errors."""

    squared_error: float | None = Field(
        description="Estimate of E||x_hat - x_bar||^2 given the round's vectors (unbiased; "
        "not clipped, so it can be slightly negative by chance).")
    squared_error_stderr: float | None = Field(description="Its standard error.")
    mean_norm_squared: float | None = Field(
        description="Estimate of ||x_bar||^2: what the relative error divides by.")
    relative_error: float | None = Field(
        description="squared_error / mean_norm_squared (null when the latter is not "
        "positive).")
    relative_error_stderr: float | None = Field(
        description="squared_error_stderr / mean_norm_squared.")
    method: str = Field(description="How the MSE's coefficients were obtained: exact, free "
                        "(free-probability limit), mc (Monte Carlo) or per-message.")


class Arrival(BaseModel):
    """One accepted submission of a round."""

    client_id: str
    received_at: float = Field(description="Unix seconds when the request reached the "
                               "server (what the deadline is compared with).")
    wire_bytes: int
    payload_bytes: int


class TaskProgress(BaseModel):
    """The task measured on the global state after the round (evaluation mode)."""

    name: str = Field(description="What value is: Rayleigh quotient, k-means objective, "
                      "regression loss.")
    value: float = Field(description="Task.metric averaged over the n clients' shards.")
    optimum: float | None = Field(
        description="Best value where known (power iteration: the top eigenvalue).")
    eigenvector_distance: float | None = Field(
        description="Power iteration: sin of the angle between the iterate and the top "
        "eigenvector (0 = converged).")


class Round(BaseModel):
    """One round: state, timing, arrivals, bytes, decode and (evaluation mode) errors."""

    round_id: int
    state: str = Field(description="open, collecting, decoding, done or failed.")
    reason: str = Field(description="Why a round failed (empty otherwise).")
    nonce: str = Field(description="Round nonce (decimal string: it is a 64-bit integer).")
    scheme: str
    transform: str = Field(description="Transform label used (or planned) at decode.")
    k: int = Field(default=0, description="Values per client of this round (the job's k, or "
                   "the one --target-rel-error chose).")
    value_bits: int = Field(default=32, description="Bits per value of this round (32: "
                            "float32; chosen with k by --value-bits auto).")
    projection: str = Field(default="", description="The projection the sketches are encoded "
                            "with (srht, hblocks, dct; empty for schemes without one).")
    block_size: int = Field(default=0, description="Blockwise block size (--block-size; 0: "
                            "one transform over all of d).")
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
    relative_error: RelativeErrors | None = Field(
        description="Evaluation mode: the squared errors divided by ||x_bar||^2; null "
        "otherwise (or when ||x_bar|| = 0).")
    error_estimate: ErrorEstimate | None = Field(
        default=None, description="The error estimated from the messages alone, in every "
        "mode; null before the decode (and for rounds stored by versions without it).")
    arrivals: list[Arrival] = Field(
        description="Accepted submissions in client-index order: when, and their bytes.")
    task_progress: TaskProgress | None = Field(
        description="The task after this round; null while unknown (see the status's "
        "task_metrics_note).")


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
    target_rel_error: float | None = Field(
        default=None, description="--target-rel-error: the relative error each round's k is "
        "chosen for; null when k is fixed.")
    settings: dict[str, Any]


class Client(BaseModel):
    """A joined client."""

    client_id: str
    index: int
    joined_at: float


class ClientActivity(BaseModel):
    """What one joined client did (``GET /api/clients``)."""

    client_id: str
    index: int = Field(description="Its data shard among the n.")
    joined_at: float = Field(description="Unix seconds.")
    last_seen: float = Field(
        description="Unix seconds of its latest accepted submission (its join if none).")
    rounds_contributed: int = Field(description="Rounds with its accepted submission.")
    rounds_missed: int = Field(
        description="Finished rounds that closed after it joined without its submission.")
    bytes_sent: int = Field(description="Serialized Submit requests (eval references "
                            "excluded), summed over its submissions.")
    payload_bytes_sent: int = Field(description="Seeds, values and indices it sent.")
    straggler: bool = Field(description="It missed the latest finished round.")


class Job(BaseModel):
    """Progress of the server's task."""

    task: str
    steps_done: int
    rounds_planned: int
    done: bool
    r_hat_smoothed: float | None
    state: str = Field(description="running, done, or failed (--max-failed-rounds).")
    failure: str = Field(description="Why the job failed; empty unless state is failed.")


class Beta(BaseModel):
    """The start-up computation of beta for n; the first decode waits for it."""

    state: str = Field(description="computing, ready, failed, or not needed (job done).")
    n: int
    started_at: float
    elapsed_seconds: float = Field(description="Seconds it has taken (so far, or in all).")
    value: float | None
    error: str


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
    beta: Beta | None = Field(description="beta for n, computed at start-up; /readyz is "
                              "503 until it is ready.")
    task_metrics_note: str = Field(
        description="Why rounds carry no task_progress (empty when the server measures "
        "the task).")
    task_start: TaskProgress | None = Field(
        default=None, description="The task measured on its starting state, before round 1 "
        "(evaluation mode, where the server measures the task): where the progress starts.")
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


def from_task(task: TaskMetrics) -> TaskProgress:
    """The API model of :class:`~rpsagg_server.readmodel.state.TaskMetrics`."""
    return TaskProgress(name=task.name, value=task.value, optimum=task.optimum,
                        eigenvector_distance=task.eigenvector_distance)


def from_round(view: RoundView, task: TaskMetrics | None = None) -> Round:
    """The API model of a :class:`~rpsagg_server.readmodel.views.RoundView` (and its
    task metrics)."""
    ev = view.eval_errors
    rel = None if ev is None else ev.relative()
    raw = view.raw_float32_bytes
    return Round(
        round_id=view.round_id, state=view.state, reason=view.reason, nonce=str(view.nonce),
        scheme=view.scheme, transform=view.transform, k=view.k, value_bits=view.value_bits,
        projection=view.projection, block_size=view.block_size,
        task_step=view.task_step,
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
            estimate=_finite(ev.estimate), rand_k=_finite(ev.rand_k),
            rand_k_spatial=_finite(ev.rand_k_spatial),
            truth_sq_norm=None if ev.truth_sq_norm is None else _finite(ev.truth_sq_norm)),
        relative_error=None if rel is None else RelativeErrors(
            estimate=_finite(rel[0]), rand_k=_finite(rel[1]), rand_k_spatial=_finite(rel[2])),
        error_estimate=None if view.estimated_error is None else from_estimated(
            view.estimated_error),
        arrivals=[Arrival(client_id=a.client_id, received_at=a.received_at,
                          wire_bytes=a.wire_bytes, payload_bytes=a.payload_bytes)
                  for a in view.arrivals],
        task_progress=None if task is None else from_task(task),
    )


def from_estimated(e: EstimatedError) -> ErrorEstimate:
    """The API model of a round's :class:`~rpsagg_server.readmodel.views.EstimatedError`."""
    return ErrorEstimate(
        squared_error=_finite(e.squared_error),
        squared_error_stderr=_finite(e.squared_error_stderr),
        mean_norm_squared=_finite(e.mean_norm_squared), relative_error=_finite(e.relative_error),
        relative_error_stderr=_finite(e.relative_error_stderr), method=e.method)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def from_config(cfg: dict[str, Any]) -> Config:
    """The API model of the server's configuration dict (``ServerConfig.public_dict()``)."""
    return Config(
        scheme=str(cfg["estimator"]), transform=str(cfg["transform"]), n=int(cfg["n"]),
        k=int(cfg["k"]), d=int(cfg["d"]), task=str(cfg["task"]), rounds=int(cfg["rounds"]),
        round_timeout=float(cfg["round_timeout"]), min_clients=int(cfg["min_clients"]),
        evaluation=bool(cfg["eval"]),
        target_rel_error=float(cfg.get("target_rel_error") or 0.0) or None, settings=cfg,
    )


def from_client(c: ClientView) -> Client:
    """The API model of a joined client."""
    return Client(client_id=c.client_id, index=c.index, joined_at=c.joined_at)


def from_client_stats(c: ClientStats) -> ClientActivity:
    """The API model of a client's activity."""
    return ClientActivity(
        client_id=c.client_id, index=c.index, joined_at=c.joined_at, last_seen=c.last_seen,
        rounds_contributed=c.rounds_contributed, rounds_missed=c.rounds_missed,
        bytes_sent=c.wire_bytes_sent, payload_bytes_sent=c.payload_bytes_sent,
        straggler=c.straggler)


def from_job(job: JobView) -> Job:
    """The API model of the task's progress."""
    return Job(task=job.task, steps_done=job.steps_done, rounds_planned=job.rounds_planned,
               done=job.done, r_hat_smoothed=job.r_hat_smoothed, state=job.state,
               failure=job.failure)


def from_beta(beta: BetaView, now: float) -> Beta:
    """The API model of the start-up beta computation (``now``: unix seconds)."""
    elapsed = beta.seconds if beta.seconds is not None else max(0.0, now - beta.started_at)
    return Beta(state=beta.state, n=beta.n, started_at=beta.started_at,
                elapsed_seconds=elapsed, value=beta.value, error=beta.error)


def versions() -> Versions:
    """The spec versions this build implements."""
    return Versions(seed_spec=rpsagg.SPEC_VERSION, protocol=serde.PROTOCOL,
                    rpsagg=rpsagg.__version__)
