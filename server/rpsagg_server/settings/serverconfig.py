"""A running server's configuration: :class:`ServerConfig`, its own settings
(:class:`~rpsagg_server.settings.process.ServerSettings`) and its default job's
(:class:`~rpsagg_server.settings.jobspec.JobSpec`), one object the engine reads.

Each field's rule runs as the field is validated; then the checks between fields
(:mod:`rpsagg_server.settings.crosschecks`). Where the values come from (flags, ``RPSAGG_<FLAG>``
variables, ``.env``, a TOML file): :mod:`rpsagg_server.settings.flags`; a job created over the API:
:func:`job_config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from rpsagg.projections import auto_block_size
from rpsagg.schemes import scheme_traits
from rpsagg_server.settings.crosschecks import CHECKS
from rpsagg_server.settings.jobspec import (
    AUTO_VALUE_BITS,
    BYTES_PER_COORDINATE,
    JOB_DEFAULTS,
    JOB_KEYS,
    JOB_RULES,
    JobSpec,
)
from rpsagg_server.settings.process import PATH_KEYS, SERVER_RULES, ServerSettings
from rpsagg_server.settings.rules import AUTO, CHECKED, Rule, field_infos

__all__ = ["AUTO", "AUTO_VALUE_BITS", "BYTES_PER_COORDINATE", "JOB_KEYS", "ServerConfig",
           "automatic_max_d", "first_error", "job_config", "memory_limit"]


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class ServerConfig(ServerSettings, JobSpec):
    """Everything the server needs: its settings and its default job's (``rpsagg-server
    --help`` describes each field); ``task_params`` adds task parameters for the clients.

    Raises
    ------
    pydantic.ValidationError
        A ``ValueError``: the first field or combination refused (:func:`first_error` turns
        it into the one line the command prints).
    """

    task_params: dict[str, float] = Field(default_factory=dict)
    #: the rules of every field, the job's and the server's (one validator runs them)
    RULES: ClassVar[dict[str, Rule]] = {**JOB_RULES, **SERVER_RULES}

    def __post_init__(self) -> None:
        for check in CHECKS:
            check(self)

    def block_size_for(self, d: int) -> int:
        """The block size of a job of dimension ``d``: ``--block-size``, or for ``auto``
        :data:`~rpsagg.projections.AUTO_BLOCK_SIZE` when ``d`` exceeds
        :data:`~rpsagg.projections.AUTO_BLOCK_THRESHOLD` (0: one transform over all of d)."""
        return auto_block_size(d) if self.block_size == AUTO else int(self.block_size)

    @property
    def fixed_value_bits(self) -> int:
        """``--value-bits`` as a number: the width, or 0 where each round chooses its own
        (``auto``; what ``RoundInfo.value_bits`` says outside a round)."""
        return 0 if self.value_bits == AUTO else int(self.value_bits)

    @property
    def blocks(self) -> int:
        """Blocks of a blockwise job, ``ceil(d / block size)`` (0: one transform over d)."""
        size = self.block_size_for(self.d) if self.d else 0
        return -(-self.d // size) if size else 0

    @property
    def least_k(self) -> int:
        """The least k a round may use with ``--target-rel-error``: ``--k-min``, by default
        1, or one value per block (:attr:`blocks`) in a blockwise job."""
        return self.k_min if self.k_min is not None else max(1, self.blocks)

    @property
    def d_limit(self) -> int:
        """The largest d this server takes: ``--max-d``, or automatic
        (:func:`automatic_max_d`)."""
        return self.max_d or automatic_max_d()

    @property
    def params(self) -> dict[str, float]:
        """Task parameters sent to clients at join."""
        out = {"lr": self.lr, "centroids": float(self.centroids), "data_r": self.data_r,
               "seed": float(self.seed), "updates": float(self.kmeans_updates),
               "vectors": float(self.mean_vectors)}
        out.update(self.task_params)
        return out

    def job(self) -> dict[str, Any]:
        """The default job's settings, every one
        (:data:`~rpsagg_server.settings.jobspec.JOB_KEYS`)."""
        return {k: getattr(self, k) for k in JOB_KEYS}

    def public_dict(self) -> dict[str, Any]:
        """The configuration as a dict for the dashboard (open without ``--http-tokens``):
        no file paths.

        The paths of the TLS key and certificates, the token files, the database and the port
        file are replaced by booleans: ``tls``, ``mtls``, ``tokens``, ``http_tokens``,
        ``persistent_db``. ``k`` is 0 for schemes that take none (eden, qsgd), as
        ``RoundInfo.k`` says.
        """
        out = asdict(self)
        for name in PATH_KEYS:
            del out[name]
        if not scheme_traits(self.estimator).takes_k:
            out["k"] = 0
        out.update(tls=self.tls_cert is not None, mtls=self.tls_client_ca is not None,
                   tokens=self.tokens is not None, http_tokens=self.http_tokens is not None,
                   persistent_db=self.db != ":memory:")
        return out


def first_error(exc: ValidationError) -> ValueError:
    """The first refusal of a validation as one line: the rule's own message, or for a
    value of the wrong type the flag, what it must be and what it got."""
    err = exc.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):
        return cause
    name = str(err["loc"][0]) if err["loc"] else ""
    return ValueError(f"--{name.replace('_', '-')} {err['msg'][0].lower()}{err['msg'][1:]}; "
                      f"got {err['input']!r}")


# the automatic --max-d: a d-coordinate round (the estimate, the decode's work vectors, the
# submissions' values) is taken to need BYTES_PER_COORDINATE * d bytes, and a quarter of the
# memory the server may use is given to it
MAX_D_CEILING = 1 << 30


def memory_limit() -> int:
    """Bytes the server may use: its cgroup's limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) where one is set, else the machine's physical memory."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(int(text), physical)
    return int(physical)


def automatic_max_d() -> int:
    """The largest power of two d with ``BYTES_PER_COORDINATE * d`` within a quarter of
    :func:`memory_limit` (at least 2^16, at most 2^30)."""
    budget = memory_limit() // 4 // BYTES_PER_COORDINATE
    return min(MAX_D_CEILING, 1 << max(16, budget.bit_length() - 1))


#: what a created job's configuration sets of the server's own settings (``db`` aside)
_JOB_OWN: dict[str, Any] = {"port_file": None, "on_finished_job": "keep",
                            "no_default_job": False}
_ADAPTER = TypeAdapter(ServerConfig)


def job_config(server: ServerConfig, settings: Mapping[str, Any], db: str) -> ServerConfig:
    """The configuration of a job created over the API: ``settings`` (keys of
    :data:`~rpsagg_server.settings.jobspec.JOB_KEYS`, JSON values) over the defaults, the server's
    own fields as they are.

    Raises ``ValueError`` with one line naming the setting: an unknown key, a value of the
    wrong type, or what the flags' checks refuse (``n = 0``, ``d`` above ``--max-d``...).
    """
    if not isinstance(settings, Mapping):
        raise ValueError("the job's settings must be a JSON object")
    values: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in JOB_KEYS:
            raise ValueError(f"unknown job setting {key!r} (job settings: "
                             f"{', '.join(JOB_KEYS)})")
        values[key] = json_value(key, value)
    if values.get("d", 1) == 0:
        raise ValueError("d must be >= 1 for a job created over the API (a d from the first "
                         "join is the default job's alone)")
    own = {f.name: getattr(server, f.name) for f in fields(ServerSettings)}
    own.update(_JOB_OWN, db=db)
    # the server's own values were checked when it started: only the job's rules run
    context = {CHECKED: own.keys() - {*_JOB_OWN, "db"}}
    try:
        return _ADAPTER.validate_python({**own, **JOB_DEFAULTS, **values}, context=context)
    except ValidationError as exc:
        raise first_error(exc) from None


def json_value(key: str, value: Any) -> Any:
    """A JSON value for job setting ``key``, strictly of its type (no numbers from booleans,
    no fractions for integers; ``auto`` where the setting takes it; a number R for
    ``transform``)."""
    kind = field_infos(JobSpec)[key].annotation
    if isinstance(value, str) and key in ("value_bits", "block_size"):
        return value  # auto, in any case (the field's parser refuses other text)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{key} must be true or false; got {value!r}")
    if isinstance(value, bool):
        raise ValueError(f"{key} must be a number; got {value!r}")
    if kind is float:
        if isinstance(value, int | float):
            return float(value)
        raise ValueError(f"{key} must be a number; got {value!r}")
    if kind is str:
        if isinstance(value, str) or (key == "transform" and isinstance(value, int | float)):
            return value
        raise ValueError(f"{key} must be a string; got {value!r}")
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return int(value)
    raise ValueError(f"{key} must be an integer; got {value!r}")
