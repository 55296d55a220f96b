"""A job's settings: :class:`JobSpec`, one field per setting, each with its default, its
description and its rule.

The same fields are the job flags of ``rpsagg-server`` (``--n``, ``--value-bits``...), their
``RPSAGG_<FLAG>`` variables and config-file keys, the body of ``POST /api/jobs`` (its OpenAPI
request schema), the settings a created job's catalog row stores, and (the fields marked
:data:`IDENTITY`) what a restart compares with the job its database holds: adding a setting
is one field here and its docs. The checks that involve the server's own settings too
(``d`` within ``--max-d``...) are :class:`~rpsagg_server.settings.serverconfig.ServerConfig`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from rpsagg import ESTIMATOR_NAMES, QUANTIZER_NAMES
from rpsagg.projections import AUTO_BLOCK_SIZE, AUTO_BLOCK_THRESHOLD
from rpsagg.schemes import DEFAULT_ESTIMATOR, names_where
from rpsagg.tasks import DATA_SOURCES, EXTERNAL_DATA, TASKS
from rpsagg_server.settings.rules import (
    AUTO,
    Rule,
    at_least,
    field_infos,
    finite,
    one_of,
    validate_field,
)

SCHEMES = ESTIMATOR_NAMES + QUANTIZER_NAMES
PROJECTION_SCHEMES = ", ".join(names_where(lambda t: t.takes_projection))
#: the widths ``--value-bits auto`` chooses from
AUTO_VALUE_BITS = (1, 2, 3, 4, 6, 8, 12, 16, 32)
#: the memory a round is taken to need per coordinate and vector (ServerConfig's --max-d)
BYTES_PER_COORDINATE = 64


class _Identity:
    """Marks the settings that make a job's database its own (:data:`IDENTITY`)."""

    def __repr__(self) -> str:
        return "IDENTITY"


#: metadata of the fields a restart compares with its database's job (a difference is an
#: error: the database belongs to another job); a field added later is compared with its
#: default where an older database has none
IDENTITY = _Identity()

#: each field's own rule (what involves another field is ServerConfig's)
JOB_RULES: dict[str, Rule] = {
    "estimator": one_of(SCHEMES, show=False),
    "n": at_least(1),
    "d": Rule(lambda v: v >= 0, f"must be >= 1 (or 0 with --data {EXTERNAL_DATA}: from the "
              "first client's join)"),
    "task": one_of(tuple(TASKS)),
    "data": one_of((*DATA_SOURCES, EXTERNAL_DATA)),
    "rounds": at_least(0, "0: until stopped"),
    "round_timeout": finite(0, strict=True),
    "max_failed_rounds": at_least(0, "0: no limit"),
    "mean_vectors": at_least(1),
    "centroids": at_least(1),
    "seed": at_least(0),
    "kmeans_updates": Rule(lambda v: v in (0, 1), "must be 0 or 1"),
    "target_rel_error": finite(0, note="0: off"),
}


def parse_value_bits(value: object) -> int | Literal["auto"]:
    """``--value-bits`` as given: an integer in [1, 32], or ``auto``."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        bits = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        bits = -1
    if isinstance(value, bool) or not 1 <= bits <= 32 or (
            isinstance(value, float) and value != bits):
        raise ValueError(f"--value-bits must be in [1, 32] or auto; got {value!r}")
    return bits


def parse_block_size(value: object) -> int | Literal["auto"]:
    """``--block-size`` as given: 0 (one transform over all of d), a power of two >= 2, or
    ``auto``."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        size = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        size = -1
    if (isinstance(value, float) and value != size) or isinstance(value, bool) or not (
            size == 0 or (size >= 2 and size & (size - 1) == 0)):
        raise ValueError(f"--block-size must be 0, a power of two >= 2 or auto; got {value!r}")
    return size


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class JobSpec:
    """A job's settings (see ``rpsagg-server --help`` or the fields' descriptions)."""

    # -- the scheme
    estimator: Annotated[str, IDENTITY] = Field(
        DEFAULT_ESTIMATOR, description=f"one of {', '.join(SCHEMES)}")
    n: Annotated[int, IDENTITY] = Field(10, description="number of clients")
    k: Annotated[int, IDENTITY] = Field(
        102, description="floats per client per vector (with --target-rel-error: of the "
        "first round, and the default --k-max); eden and qsgd send every coordinate and "
        "ignore it")
    d: Annotated[int, IDENTITY] = Field(
        1024, description="vector length (0 with --data external: the first client's join "
        "says it, and it is fixed for the job)")
    transform: Annotated[str, IDENTITY] = Field(
        "avg", description="avg, max, one, auto (smoothed R_hat) or a number R")
    # -- the task and its data
    task: Annotated[str, IDENTITY] = Field(
        "power-iteration", description=f"one of {', '.join(TASKS)}")
    data: str = Field("synthetic", description="data source the clients use: synthetic, "
                      "fashion-mnist, ujiindoorloc, or external (--task mean over the "
                      "clients' own vectors: rpsagg-client --vectors)")
    data_r: float = Field(0.0, description="correlation R of the synthetic data")
    # -- the rounds
    rounds: int = Field(10, description="rounds (task steps) to run; 0: until stopped (the "
                        "first SIGINT or SIGTERM ends the job after the current round, a "
                        "second one stops at once)")
    round_timeout: float = Field(
        30.0, description="seconds from a round's first submission to its deadline")
    min_clients: int = Field(1, description="minimum arrivals to decode at the deadline")
    max_failed_rounds: int = Field(
        10, description="end the job as failed after this many consecutive failed rounds "
        "(0: no limit)")
    # -- the values on the wire
    value_bits: int | Literal["auto"] = Field(
        32, description="bits per sent value of rand-k, rand-k-spatial and rand-proj-spatial "
        "(1..32; below 32 unbiased stochastic rounding with a float32 scale per message; "
        "auto with --target-rel-error: each round the width, among "
        f"{', '.join(map(str, AUTO_VALUE_BITS))}, and k with the fewest bytes that meet the "
        "target)")
    bits: int = Field(0, description="eden (1, 2, 4, 8) and qsgd (1..16): bits per coordinate")
    block_size: int | Literal["auto"] = Field(
        0, description=f"{PROJECTION_SCHEMES}: encode and decode blocks of this many "
        "coordinates (a power of two >= 2) independently, each with its own SRHT (and, with "
        "--value-bits, its own float32 scale); announced as RoundInfo.block_size. 0: one "
        f"transform over all of d; auto: blocks of {AUTO_BLOCK_SIZE} for d above "
        f"{AUTO_BLOCK_THRESHOLD}, else 0")
    # -- evaluation and the tasks' parameters
    eval: Annotated[bool, IDENTITY] = Field(
        False, description="evaluation mode: clients also send raw vectors; record squared "
        "errors")
    mean_vectors: Annotated[int, IDENTITY] = Field(
        1, description="mean: vectors per client per round (m; the mean of each is "
        "estimated separately)")
    seed: int = Field(0, description="seed of the initial task state and of the synthetic "
                      "data")
    lr: float = Field(0.1, description="linreg learning rate")
    centroids: int = Field(10, description="kmeans: number of centroids (m)")
    kmeans_updates: int = Field(
        1, description="kmeans: 1 clients send centroid updates, 0 whole centroids")
    # -- target mode
    target_rel_error: float = Field(
        0.0, description="choose each round's k: the smallest in [--k-min, --k-max] whose "
        "predicted relative error at the least of the smoothed R_hat of earlier rounds and "
        "the last round's is at most this (0: off, a fixed --k)")
    k_min: int | None = Field(
        None, description="with --target-rel-error: the smallest k a round may use (by "
        "default 1; with --block-size, one value per block: ceil(d / block size))")
    k_max: int = Field(0, description="with --target-rel-error: the largest k a round may "
                       "use (0: --k)")

    @field_validator("value_bits", mode="before")
    @classmethod
    def _value_bits(cls, value: Any) -> int | Literal["auto"]:
        return parse_value_bits(value)

    @field_validator("block_size", mode="before")
    @classmethod
    def _block_size(cls, value: Any) -> int | Literal["auto"]:
        return parse_block_size(value)

    @field_validator("transform", mode="before")
    @classmethod
    def _transform(cls, value: Any) -> Any:
        """A number R as its text (``--transform 2.5``, ``"transform": 2.5``)."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value

    #: the rules of the fields (a class that adds fields adds theirs)
    RULES: ClassVar[dict[str, Rule]] = JOB_RULES

    @field_validator("*")
    @classmethod
    def _rule(cls, value: Any, info: ValidationInfo) -> Any:
        return validate_field(cls.RULES, value, info)


#: the settings of a job, in their order (``POST /api/jobs`` takes these keys)
JOB_KEYS: tuple[str, ...] = tuple(field_infos(JobSpec))
#: the settings a restart compares with its database's job
IDENTITY_KEYS: tuple[str, ...] = tuple(
    name for name, info in field_infos(JobSpec).items() if IDENTITY in info.metadata)
#: each job setting's default
JOB_DEFAULTS: dict[str, Any] = {name: info.default
                                for name, info in field_infos(JobSpec).items()}
