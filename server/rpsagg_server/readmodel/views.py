"""The snapshots the read model serves: rounds, clients, the job, beta, task metrics.

Frozen dataclasses, built by the engine (a round's view by
:func:`~rpsagg_server.rounds.roundview.round_view`) and carried by the domain events of
:mod:`rpsagg_server.readmodel.events` to :class:`~rpsagg_server.readmodel.state.ServerState`, which
the dashboard reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
from numpy.typing import NDArray

from rpsagg import ErrorEstimate
from rpsagg_server.domain.jobstate import JobState
from rpsagg_wire.v1.messages import RoundState


@dataclass(frozen=True)
class EvalErrors:
    """Evaluation-mode squared errors of one round (summed over the m vectors).

    Attributes
    ----------
    estimate : float
        ``||x_hat - x_bar||^2`` of the round's estimator.
    rand_k : float
        What Rand-k would have had on the same vectors and seeds.
    rand_k_spatial : float
        What Rand-k-Spatial(avg) would have had.
    truth_sq_norm : float or None
        ``||x_bar||^2`` (summed over the m vectors): relative errors are the squared errors
        divided by it. None for rounds stored before it was recorded.
    """

    estimate: float
    rand_k: float
    rand_k_spatial: float
    truth_sq_norm: float | None = None

    def relative(self) -> tuple[float, float, float] | None:
        """The three squared errors divided by ``||x_bar||^2`` (None when it is unknown or 0)."""
        t = self.truth_sq_norm
        if t is None or not t > 0:
            return None
        return self.estimate / t, self.rand_k / t, self.rand_k_spatial / t


@dataclass(frozen=True)
class EstimatedError:
    """A round's error estimated from its messages alone (every mode, every scheme).

    The library estimates each vector slot's error from the slot's messages
    (:attr:`rpsagg.DecodeResult.error_estimate`); a round of ``m`` vectors sums the slots,
    like :class:`EvalErrors` does (the slots have independent seeds, so their variances add).

    Attributes
    ----------
    squared_error : float
        Estimate of ``E||x_hat - x_bar||^2`` given the round's vectors, summed over the m
        slots (not clipped: it can be slightly negative by chance).
    squared_error_stderr : float
        Its standard error (root of the summed slot variances); nan where it cannot be formed.
    mean_norm_squared : float
        Estimate of ``||x_bar||^2`` summed over the m slots: what the relative error divides by.
    method : str
        How the library obtained the MSE's coefficients (``exact``, ``free``, ``mc``,
        ``per-message``; the slots' distinct methods joined by ``,``).
    """

    squared_error: float
    squared_error_stderr: float
    mean_norm_squared: float
    method: str = ""

    @property
    def relative_error(self) -> float:
        """``squared_error / mean_norm_squared`` (nan when the latter is not positive)."""
        return _ratio(self.squared_error, self.mean_norm_squared)

    @property
    def relative_error_stderr(self) -> float:
        """``squared_error_stderr / mean_norm_squared`` (nan when the latter is not positive)."""
        return _ratio(self.squared_error_stderr, self.mean_norm_squared)

    @classmethod
    def of_slots(cls, slots: Sequence[ErrorEstimate | None]) -> EstimatedError | None:
        """The sum over the slots' :class:`rpsagg.ErrorEstimate` (None if any slot has none)."""
        known = [s for s in slots if s is not None]
        if not known or len(known) != len(slots):
            return None
        var = sum(s.squared_error_stderr ** 2 for s in known)
        methods = ",".join(dict.fromkeys(s.method for s in known if s.method))
        return cls(float(sum(s.squared_error for s in known)), float(math.sqrt(var)),
                   float(sum(s.mean_norm_squared for s in known)), methods)

    def as_dict(self) -> dict[str, float | str]:
        """The fields and the relative error (and its standard error) as plain values."""
        return {"squared_error": self.squared_error,
                "squared_error_stderr": self.squared_error_stderr,
                "mean_norm_squared": self.mean_norm_squared,
                "relative_error": self.relative_error,
                "relative_error_stderr": self.relative_error_stderr, "method": self.method}


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0.0 and math.isfinite(den) else math.nan


@dataclass(frozen=True)
class Arrival:
    """One accepted submission of a round: who, when (unix seconds) and how many bytes."""

    client_id: str
    received_at: float
    wire_bytes: int
    payload_bytes: int


@dataclass(frozen=True)
class RoundView:
    """Snapshot of one round.

    Attributes
    ----------
    round_id, state, reason : int, str, str
        ``state`` is one of :data:`ROUND_STATES`; ``reason`` explains ``failed``.
    nonce : int
        The round nonce mixed into every transform seed.
    scheme, transform : str
        Estimator name and the transform label used (or planned) at decode.
    task_step : int
        Completed task iterations before this round.
    opened_at, first_submission_at, deadline_at, closed_at, finished_at : float or None
        Unix seconds (``deadline_at`` is None while the deadline is not running).
    clients_expected : int
        n.
    clients_arrived, clients_missing : tuple of str
        Client ids that submitted / that joined but have not submitted.
    payload_bytes : int
        Encoded payload received: 8-byte seed + 4 bytes per value and per index.
    wire_bytes : int
        Serialized gRPC request bytes of the accepted submissions (excluding eval references).
    raw_float32_bytes : int
        What sending the vectors uncompressed would cost: ``arrived * m * d * 4``.
    decode_seconds : float or None
    c, beta : float or None
        Transform coefficient and unbiasing scalar used.
    r_hat : float or None
        This round's correlation estimate from the sketches.
    r_prior : float or None
        The prior R the transform used (``transform=auto``).
    eval_errors : EvalErrors or None
        Evaluation mode only.
    estimated_error : EstimatedError or None
        The error estimated from the messages (every mode; None before the decode and for
        rounds stored by versions that did not record it).
    arrivals : tuple of Arrival
        Every accepted submission, in client-index order (empty for rounds finished before
        a restart by a version that did not store them).
    k : int
        Values per client of this round (``--k``, or chosen by ``--target-rel-error``).
    value_bits : int
        Bits per value of this round (32: float32; chosen with k by ``--value-bits auto``).
    projection : str
        The job's projection (``srht``, ``hblocks``, ``dct``; "" for schemes without one).
    block_size : int
        The job's blockwise block size (0: one transform over all of d).
    """

    round_id: int
    state: RoundState
    reason: str
    nonce: int
    scheme: str
    transform: str
    task_step: int
    opened_at: float
    first_submission_at: float | None
    deadline_at: float | None
    closed_at: float | None
    finished_at: float | None
    clients_expected: int
    clients_arrived: tuple[str, ...]
    clients_missing: tuple[str, ...]
    payload_bytes: int
    wire_bytes: int
    raw_float32_bytes: int
    decode_seconds: float | None
    c: float | None
    beta: float | None
    r_hat: float | None
    r_prior: float | None
    eval_errors: EvalErrors | None
    arrivals: tuple[Arrival, ...] = ()
    estimated_error: EstimatedError | None = None
    k: int = 0
    value_bits: int = 32
    projection: str = ""
    block_size: int = 0


@dataclass(frozen=True)
class EstimateInfo:
    """What a done round's estimate came from (its values live in the store and the
    bounded cache of :mod:`~rpsagg_server.rounds.archive`, not here).

    Attributes
    ----------
    round_id : int
    n_prime : int
        Clients whose submissions it was decoded from.
    scheme, transform : str
        Estimator and the transform label it decoded with.
    n, k, d : int
        The job's clients, values per client per vector (0 for schemes that take no k:
        eden, qsgd), and vector length.
    wire_bytes, payload_bytes : int
        Serialized Submit requests received (evaluation references excluded), and their
        seeds, values and indices.
    contributors : tuple of str
        The client ids, in client-index order.
    projection : str
        The projection the sketches were encoded with (``srht``, ``hblocks``, ``dct``; ""
        for schemes without one).
    m : int
        Vectors per client per round (``--mean-vectors``).
    block_size : int
        The blockwise block size the sketches were encoded with (0: one transform).
    value_bits : int
        Bits per sent value of the round (32: float32 values).
    """

    round_id: int
    n_prime: int
    scheme: str
    transform: str
    n: int
    k: int
    d: int
    wire_bytes: int
    payload_bytes: int
    contributors: tuple[str, ...]
    projection: str = ""
    m: int = 1
    block_size: int = 0
    value_bits: int = 32


@dataclass(frozen=True, eq=False)
class EstimateView(EstimateInfo):
    """A finished round's estimate and what it came from (``/api/rounds/{id}/estimate``):
    the fields of :class:`EstimateInfo` and the values.

    Attributes
    ----------
    values : ndarray, shape (m, d)
        The decoded mean of each of the m vector slots, bit for bit as stored (read-only
        where it was read back from the store: read it, never write it).
    """

    values: NDArray[np.float64] = field(default_factory=lambda: np.empty((0, 0)))

    @classmethod
    def of(cls, info: EstimateInfo, values: NDArray[np.float64]) -> EstimateView:
        """The view of ``info``'s round with its ``values``."""
        return cls(**{f.name: getattr(info, f.name) for f in fields(EstimateInfo)},
                   values=values)


@dataclass(frozen=True)
class ClientView:
    """A joined client: id, index (its data shard) and when it joined (unix seconds)."""

    client_id: str
    index: int
    joined_at: float


@dataclass(frozen=True)
class TaskMetrics:
    """The task's progress measured on the global state after a round.

    Attributes
    ----------
    name : str
        What ``value`` is (e.g. ``"Rayleigh quotient"``, ``"k-means objective"``).
    value : float
        The task's own metric (``Task.metric``) averaged over the n clients' shards.
    optimum : float or None
        The best value where the server knows it (power iteration: the top eigenvalue).
    eigenvector_distance : float or None
        Power iteration: ``sin`` of the angle between the iterate and the top eigenvector
        (0 when converged, 1 when orthogonal).
    """

    name: str
    value: float
    optimum: float | None = None
    eigenvector_distance: float | None = None


@dataclass(frozen=True)
class JobView:
    """Progress of the server's task.

    Attributes
    ----------
    task : str
    steps_done : int
        Rounds that finished with an estimate (task iterations taken).
    rounds_planned : int
        ``--rounds``.
    done : bool
    r_hat_smoothed : float or None
        The smoothed correlation prior (``transform=auto``), in units of R for n clients.
    failure : str
        Why the job ended without finishing its rounds (``--max-failed-rounds``
        consecutive failed rounds); empty while it runs and when it finished.
    """

    task: str
    steps_done: int
    rounds_planned: int
    done: bool
    r_hat_smoothed: float | None
    failure: str = ""

    @property
    def state(self) -> JobState:
        """``running``, ``done`` or ``failed``."""
        return (JobState.FAILED if self.failure else JobState.DONE if self.done
                else JobState.RUNNING)


BETA_STATES = ("computing", "ready", "failed", "not needed")


@dataclass(frozen=True)
class BetaView:
    """The start-up computation of beta for n (the first decode waits for it).

    Attributes
    ----------
    state : str
        One of :data:`BETA_STATES` (``not needed`` when the job was already done).
    n : int
    started_at : float
        Unix seconds.
    seconds : float or None
        How long it took, once finished.
    value : float or None
        beta, once ready.
    error : str
        Why it failed.
    """

    state: str
    n: int
    started_at: float
    seconds: float | None = None
    value: float | None = None
    error: str = ""
