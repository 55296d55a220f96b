"""Server configuration from flags, environment variables and a TOML config file.

Precedence: command-line flag > environment variable ``RPSAGG_<FLAG>`` (``--round-timeout``
-> ``RPSAGG_ROUND_TIMEOUT``) > ``--config FILE`` (TOML, keys spelled like the flags with
``-`` or ``_``) > default.

The environment and the file are pydantic-settings sources (``RPSAGG_`` environment
variables, a TOML file), merged in that order with the flags (parsed by argparse, for their
help and messages) on top; pydantic converts every value to its field's type, and
:class:`ServerConfig` then checks the combination.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError, create_model, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from rpsagg import ESTIMATOR_NAMES, QUANTIZER_NAMES
from rpsagg.projections import AUTO_BLOCK_SIZE, AUTO_BLOCK_THRESHOLD, auto_block_size
from rpsagg.schemes import DEFAULT_ESTIMATOR, names_where, scheme_traits, transform_option
from rpsagg.tasks import DATA_SOURCES, EXTERNAL_DATA, TASKS
from rpsagg_server.bounds import check_finite, check_range

SCHEMES = ESTIMATOR_NAMES + QUANTIZER_NAMES
QUANTIZABLE = names_where(lambda t: t.quantizable)
BITS_SCHEMES = " and ".join(names_where(lambda t: t.takes_bits))
PROJECTION_SCHEMES = ", ".join(names_where(lambda t: t.takes_projection))
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
#: ``--value-bits auto`` (stored as 0): each round's width chosen with its k
VALUE_BITS_AUTO = 0
#: the widths ``--value-bits auto`` chooses from
AUTO_VALUE_BITS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


#: ``--block-size auto`` (stored as -1): blockwise in blocks of AUTO_BLOCK_SIZE for d above
#: AUTO_BLOCK_THRESHOLD (rpsagg.projections.auto_block_size)
BLOCK_SIZE_AUTO = -1


def parse_block_size(value: object) -> int:
    """``--block-size`` as given: 0 (one transform over all of d), a power of two >= 2, or
    ``auto`` (stored as :data:`BLOCK_SIZE_AUTO`)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return BLOCK_SIZE_AUTO
    try:
        size = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        size = -1
    if (isinstance(value, float) and value != size) or isinstance(value, bool) or not (
            size == 0 or (size >= 2 and size & (size - 1) == 0)):
        raise ValueError(f"--block-size must be 0, a power of two >= 2 or auto; got {value!r}")
    return size


def parse_value_bits(value: object) -> int:
    """``--value-bits`` as given: an integer in [1, 32], or ``auto`` (stored as
    :data:`VALUE_BITS_AUTO`)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return VALUE_BITS_AUTO
    try:
        bits = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        bits = -1
    if not 1 <= bits <= 32 or (isinstance(value, float) and value != bits):
        raise ValueError(f"--value-bits must be in [1, 32] or auto; got {value!r}")
    return bits


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs; see ``rpsagg-server --help`` for each field."""

    grpc_port: int = 50051
    http_port: int = 8000
    host: str = "[::]"
    http_host: str = "127.0.0.1,::1"
    http_tokens: str | None = None
    http_tls: bool = False
    http_header_timeout: float = 30.0
    http_max_connections: int = 0
    http_body_cache_bytes: int = 256 << 20
    grpc_max_connections: int = 0
    grpc_handshake_timeout: float = 5.0
    grpc_idle_timeout: float = 10.0
    n: int = 10
    k: int = 102
    d: int = 1024
    max_d: int = 0
    target_rel_error: float = 0.0
    k_min: int | None = None
    k_max: int = 0
    estimator: str = DEFAULT_ESTIMATOR
    transform: str = "avg"
    value_bits: int = 32
    bits: int = 0
    block_size: int = 0
    task: str = "power-iteration"
    rounds: int = 10
    round_timeout: float = 30.0
    min_clients: int = 1
    max_failed_rounds: int = 10
    db: str = "rpsagg.db"
    result_cache_bytes: int = 64 << 20
    eval: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    tokens: str | None = None
    insecure: bool = False
    data: str = "synthetic"
    data_r: float = 0.0
    mean_vectors: int = 1
    seed: int = 0
    lr: float = 0.1
    centroids: int = 10
    kmeans_updates: int = 1
    drain: float = 10.0
    linger: float = 2.0
    port_file: str | None = None
    decode_device: str | None = None
    decode_threads: int | None = None
    decode_backend: str = "local"
    ray_address: str | None = None
    event_loop: str = "auto"
    on_finished_job: str = "keep"
    admin_tokens: str | None = None
    no_default_job: bool = False
    max_jobs: int = 16
    jobs_memory_bytes: int = 0
    max_request_bytes: int = 0
    task_params: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in fields(self):  # first: what follows may compute with the numbers
            check_range(f.name, getattr(self, f.name))
        if self.estimator not in SCHEMES:
            raise ValueError(f"--estimator must be one of {', '.join(SCHEMES)}")
        traits = scheme_traits(self.estimator)
        if self.value_bits == VALUE_BITS_AUTO:
            if not traits.quantizable:
                raise ValueError(f"--value-bits applies to {', '.join(QUANTIZABLE)}; "
                                 f"use --bits for {BITS_SCHEMES}")
            if not self.target_rel_error > 0:
                raise ValueError("--value-bits auto chooses each round's value width for "
                                 "--target-rel-error: pass it too")
        elif self.value_bits != 32:
            if not traits.quantizable:
                raise ValueError(f"--value-bits applies to {', '.join(QUANTIZABLE)}; "
                                 f"use --bits for {BITS_SCHEMES}")
            if not 1 <= self.value_bits <= 31:
                raise ValueError(f"--value-bits must be in [1, 32]; got {self.value_bits}")
        if traits.takes_bits:
            from rpsagg import make_estimator

            if self.bits == 0:
                raise ValueError(f"--estimator {self.estimator} needs --bits")
            make_estimator(self.estimator, n=max(self.n, 1), d=max(self.d, 1), bits=self.bits)
        elif self.bits != 0:
            raise ValueError(f"--bits applies to {BITS_SCHEMES}; use --value-bits for "
                             f"{self.estimator}")
        self._check_block_size(traits.takes_projection)
        if self.task not in TASKS:
            raise ValueError(f"--task must be one of {', '.join(TASKS)}; got {self.task!r}")
        self._check_transform(traits.takes_transform)
        if self.d == 0 and self.data != EXTERNAL_DATA:
            raise ValueError("--d 0 (d from the first client's join) goes with --data "
                             f"{EXTERNAL_DATA}")
        if self.d < 0:
            raise ValueError(f"--d must be >= 1 (or 0 with --data {EXTERNAL_DATA}: from the "
                             f"first client's join); got {self.d}")
        if self.max_d < 0:
            raise ValueError(f"--max-d must be >= 0 (0: automatic); got {self.max_d}")
        if self.d > self.d_limit:
            raise ValueError(f"--d {self.d} is above --max-d {self.d_limit} (the largest d "
                             "this server may allocate for; raise --max-d for more)")
        if not traits.takes_k:
            pass  # eden, qsgd send every coordinate: --k is ignored (RoundInfo.k is 0)
        elif self.d and not 1 <= self.k <= self.d:
            raise ValueError(f"--k must be in [1, d] = [1, {self.d}]; got {self.k}")
        elif self.k < 1:
            raise ValueError(f"--k must be >= 1; got {self.k}")
        if not (math.isfinite(self.target_rel_error) and self.target_rel_error >= 0):
            raise ValueError(f"--target-rel-error must be a finite number >= 0 (0: off); "
                             f"got {self.target_rel_error}")
        if self.target_rel_error > 0:
            if not traits.takes_k:
                raise ValueError(f"--target-rel-error chooses k: --estimator {self.estimator} "
                                 "takes no k")
            if traits.sends_indices:
                raise ValueError(f"--target-rel-error needs a predicted error that depends on "
                                 f"R alone; --estimator {self.estimator}'s depends on the "
                                 "vectors' shape")
            top = self.k_max or self.k
            if self.k_min is not None and not 1 <= self.k_min <= top:
                raise ValueError(f"--k-min must be in [1, k-max] = [1, {top}]; got "
                                 f"{self.k_min}")
            if self.d and top > self.d:
                raise ValueError(f"--k-max must be <= d = {self.d}; got {top}")
        elif self.k_max or self.k_min not in (None, 1):  # 1: the default it once had
            raise ValueError("--k-min and --k-max go with --target-rel-error")
        if self.n < 1:
            raise ValueError(f"--n must be >= 1; got {self.n}")
        if not 1 <= self.min_clients <= self.n:
            raise ValueError(f"--min-clients must be in [1, n]; got {self.min_clients}")
        if self.rounds < 0:
            raise ValueError(f"--rounds must be >= 0 (0: until stopped); got {self.rounds}")
        if self.data not in (*DATA_SOURCES, EXTERNAL_DATA):
            raise ValueError(f"--data must be one of {', '.join((*DATA_SOURCES, EXTERNAL_DATA))};"
                             f" got {self.data!r}")
        if self.data == EXTERNAL_DATA and self.task != "mean":
            raise ValueError(f"--data {EXTERNAL_DATA} (the clients' own vectors) goes with "
                             f"--task mean; got --task {self.task}")
        if self.data == "synthetic" and not 0 <= self.data_r <= self.n - 1:
            raise ValueError(f"--data-r must be in [0, n-1] = [0, {self.n - 1}] for synthetic "
                             f"data (the clients' generator refuses others); got {self.data_r}")
        if self.mean_vectors < 1:
            raise ValueError(f"--mean-vectors must be >= 1; got {self.mean_vectors}")
        if self.mean_vectors != 1 and self.task != "mean":
            raise ValueError("--mean-vectors applies to --task mean")
        if self.max_failed_rounds < 0:
            raise ValueError(f"--max-failed-rounds must be >= 0 (0: no limit); "
                             f"got {self.max_failed_rounds}")
        if self.result_cache_bytes < 0:
            raise ValueError(f"--result-cache-bytes must be >= 0 (0: no cache); "
                             f"got {self.result_cache_bytes}")
        if not (math.isfinite(self.drain) and self.drain >= 0):
            raise ValueError(f"--drain must be a finite number >= 0; got {self.drain}")
        if self.on_finished_job not in ("keep", "new"):
            raise ValueError(f"--on-finished-job must be keep or new; got {self.on_finished_job!r}")
        if not self.http_host.strip(","):
            raise ValueError("--http-host needs at least one address")
        for name in ("grpc_port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 65535]; "
                                 f"got {getattr(self, name)}")
        if not (math.isfinite(self.round_timeout) and self.round_timeout > 0):
            raise ValueError(f"--round-timeout must be a finite number > 0; "
                             f"got {self.round_timeout}")
        if not (math.isfinite(self.http_header_timeout) and self.http_header_timeout > 0):
            raise ValueError(f"--http-header-timeout must be a finite number > 0; "
                             f"got {self.http_header_timeout}")
        if self.http_max_connections < 0:
            raise ValueError(f"--http-max-connections must be >= 0 (0: automatic); "
                             f"got {self.http_max_connections}")
        if self.http_body_cache_bytes < 0:
            raise ValueError(f"--http-body-cache-bytes must be >= 0 (0: none kept); "
                             f"got {self.http_body_cache_bytes}")
        if self.grpc_max_connections < 0:
            raise ValueError(f"--grpc-max-connections must be >= 0 (0: automatic); "
                             f"got {self.grpc_max_connections}")
        for name in ("grpc_handshake_timeout", "grpc_idle_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number > 0; "
                                 f"got {value}")
        if self.http_tls and not self.tls_cert:
            raise ValueError("--http-tls serves the dashboard with --tls-cert and --tls-key: "
                             "pass them too")
        if math.isnan(self.linger):
            raise ValueError("--linger must be a number of seconds; got nan")
        if not self.insecure:
            if not (self.tls_cert and self.tls_key):
                raise ValueError(
                    "TLS is required: pass --tls-cert and --tls-key (or --insecure, explicitly, "
                    "to run without TLS and tokens)"
                )
            if not self.tokens:
                raise ValueError("--tokens FILE is required unless --insecure is given")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.kmeans_updates not in (0, 1):
            raise ValueError(f"--kmeans-updates must be 0 or 1; got {self.kmeans_updates}")
        if self.centroids < 1:
            raise ValueError(f"--centroids must be >= 1; got {self.centroids}")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")
        if self.decode_device is not None:
            if not traits.takes_projection:
                raise ValueError(f"--decode-device applies to --estimator {PROJECTION_SCHEMES}")
            try:
                from rpsagg.device import resolve_device
            except ImportError as exc:  # pragma: no cover - the test set-up installs torch
                raise ValueError(f"--decode-device needs PyTorch: {exc}") from exc
            resolve_device(self.decode_device)  # fails now, not at the first round
        if self.decode_threads is not None and self.decode_threads < 1:
            raise ValueError(f"--decode-threads must be >= 1; got {self.decode_threads}")
        if self.decode_backend not in ("local", "ray"):
            raise ValueError(f"--decode-backend must be local or ray; got {self.decode_backend!r}")
        if self.decode_backend == "ray":
            if not traits.takes_projection:
                raise ValueError("--decode-backend ray applies to --estimator "
                                 f"{PROJECTION_SCHEMES}")
            # find it without importing it: Ray reads its environment when imported, and
            # rpsagg_server.raydecode sets that environment first
            if importlib.util.find_spec("ray") is None:  # pragma: no cover - tests install it
                raise ValueError(
                    "--decode-backend ray needs Ray: pip install 'rpsagg-server[ray]'")
        elif self.ray_address is not None:
            raise ValueError("--ray-address goes with --decode-backend ray")
        if self.max_jobs < 1:
            raise ValueError(f"--max-jobs must be >= 1; got {self.max_jobs}")
        for name in ("jobs_memory_bytes", "max_request_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0 (0: automatic); "
                                 f"got {getattr(self, name)}")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"--event-loop must be one of {', '.join(EVENT_LOOPS)}; "
                             f"got {self.event_loop!r}")
        if self.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("--event-loop uvloop needs uvloop: pip install uvloop")
        for f in fields(self):  # last: the checks above say more of the fields they know
            check_finite(f.name, getattr(self, f.name))

    def _check_transform(self, takes_transform: bool) -> None:
        """``--transform``: a name, or a number R in [0, n-1] (what the estimator reads)."""
        if not takes_transform:
            return
        try:
            transform_option(self.transform, max(self.n, 1))
        except ValueError as exc:
            raise ValueError(f"--{exc}") from None

    def _check_block_size(self, takes_projection: bool) -> None:
        """``--block-size``: Rand-Proj-Spatial only, a known d, and at least one value per
        block (k, and with --target-rel-error the least k, >= ceil(d / block size): an
        explicit --k-min, else --k-max, since --k-min's default is the blocks)."""
        if self.block_size == 0:
            return
        if self.block_size != BLOCK_SIZE_AUTO:
            parse_block_size(self.block_size)
        if not takes_projection:
            raise ValueError(f"--block-size applies to --estimator {PROJECTION_SCHEMES}")
        if self.d == 0:
            raise ValueError("--block-size needs --d (a job whose d comes from the first "
                             "join runs one transform over all of d)")
        size, blocks = self.block_size_for(self.d), self.blocks
        if size > self.d:
            raise ValueError(f"--block-size {size} is above d = {self.d} (use 0: one "
                             "transform over all of d)")
        if blocks:
            least, flag = self.k, "--k"
            if self.target_rel_error > 0 and self.k_min is not None:
                least, flag = self.k_min, "--k-min"
            elif self.target_rel_error > 0:  # --k-min is the blocks: --k-max must reach it
                least, flag = self.k_max or self.k, "--k-max" if self.k_max else "--k"
            if least < blocks:
                raise ValueError(f"{flag} must be >= the number of blocks ceil(d / block "
                                 f"size) = {blocks} with --block-size {size}; got {least}")

    def block_size_for(self, d: int) -> int:
        """The block size of a job of dimension ``d``: ``--block-size``, or for ``auto``
        :data:`~rpsagg.projections.AUTO_BLOCK_SIZE` when ``d`` exceeds
        :data:`~rpsagg.projections.AUTO_BLOCK_THRESHOLD` (0: one transform over all of d)."""
        if self.block_size == BLOCK_SIZE_AUTO:
            return auto_block_size(d)
        return self.block_size

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

    def public_dict(self) -> dict[str, Any]:
        """The configuration as a dict for the dashboard (open without ``--http-tokens``):
        no file paths.

        The paths of the TLS key and certificates, the token files, the database and the port
        file are replaced by booleans: ``tls``, ``mtls``, ``tokens``, ``http_tokens``,
        ``persistent_db``. ``k`` is 0 for schemes that take none (eden, qsgd), as
        ``RoundInfo.k`` says.
        """
        out = asdict(self)
        for name in _PATHS:
            del out[name]
        if not scheme_traits(self.estimator).takes_k:
            out["k"] = 0
        out.update(tls=self.tls_cert is not None, mtls=self.tls_client_ca is not None,
                   tokens=self.tokens is not None, http_tokens=self.http_tokens is not None,
                   persistent_db=self.db != ":memory:")
        return out


# the automatic --max-d: a d-coordinate round (the estimate, the decode's work vectors, the
# submissions' values) is taken to need BYTES_PER_COORDINATE * d bytes, and a quarter of the
# memory the server may use is given to it
BYTES_PER_COORDINATE = 64
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


_PATHS = ("tls_cert", "tls_key", "tls_client_ca", "tokens", "http_tokens", "db", "port_file",
          "admin_tokens")


_BOOL = {"eval", "insecure", "http_tls", "no_default_job"}

#: The settings of a job (``POST /api/jobs`` takes these keys); every other field of
#: :class:`ServerConfig` is the server's, shared by its jobs.
JOB_KEYS = ("estimator", "n", "k", "d", "transform", "task", "data", "data_r", "rounds",
            "round_timeout", "min_clients", "max_failed_rounds", "value_bits", "bits",
            "block_size", "eval", "mean_vectors", "seed", "lr", "centroids", "kmeans_updates",
            "target_rel_error", "k_min", "k_max")


@functools.cache
def _config_hints() -> dict[str, Any]:
    """The field types of :class:`ServerConfig` (resolved once)."""
    return typing.get_type_hints(ServerConfig)


def job_config(server: ServerConfig, settings: Mapping[str, Any], db: str) -> ServerConfig:
    """The configuration of a job created over the API: ``settings`` (keys of
    :data:`JOB_KEYS`, JSON values) over the defaults, the server's own fields as they are.

    Raises ``ValueError`` with one line naming the setting: an unknown key, a value of the
    wrong type, or what the flags' checks refuse (``n = 0``, ``d`` above ``--max-d``...).
    """
    if not isinstance(settings, Mapping):
        raise ValueError("the job's settings must be a JSON object")
    hints = _config_hints()
    values: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in JOB_KEYS:
            raise ValueError(f"unknown job setting {key!r} (job settings: "
                             f"{', '.join(JOB_KEYS)})")
        values[key] = _job_value(key, value, hints[key])
    if values.get("d", 1) == 0:
        raise ValueError("d must be >= 1 for a job created over the API (a d from the first "
                         "join is the default job's alone)")
    defaults = {f.name: f.default for f in fields(ServerConfig) if f.name in JOB_KEYS}
    own = {f.name: getattr(server, f.name) for f in fields(ServerConfig)
           if f.name not in JOB_KEYS and f.name != "task_params"}
    own.update(db=db, port_file=None, on_finished_job="keep", no_default_job=False)
    return ServerConfig(**{**own, **defaults, **values})


def _job_value(key: str, value: Any, kind: Any) -> Any:
    """A JSON value converted to ``key``'s type (strictly: no numbers from booleans, no
    fractions for integers)."""
    kinds = set(typing.get_args(kind) or (kind,)) - {type(None)}
    if key == "value_bits" and isinstance(value, str):
        return parse_value_bits(value)
    if key == "block_size" and isinstance(value, str):
        return parse_block_size(value)
    if bool in kinds:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{key} must be true or false; got {value!r}")
    if isinstance(value, bool):
        raise ValueError(f"{key} must be a number; got {value!r}")
    if int in kinds:
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            return int(value)
        raise ValueError(f"{key} must be an integer; got {value!r}")
    if float in kinds:
        if isinstance(value, int | float):
            return float(value)
        raise ValueError(f"{key} must be a number; got {value!r}")
    if isinstance(value, str):
        return value
    if key == "transform" and isinstance(value, int | float):  # a number R
        return str(value)
    raise ValueError(f"{key} must be a string; got {value!r}")


class _Parser(argparse.ArgumentParser):
    """Bad flags raise ``ValueError`` (one line on stderr, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rpsagg-server",
        description="Rand-Proj-Spatial aggregation server (gRPC). Every flag can also be set "
        "with RPSAGG_<FLAG> or in a TOML --config file.",
    )
    p.add_argument("--config", help="TOML file with any of the options below")
    helps = {
        "grpc_port": "gRPC port (0 = any free port)",
        "http_port": "dashboard HTTP port (0 disables it)",
        "host": "gRPC address to bind ([::]: every address, IPv4 and IPv6)",
        "http_host": "dashboard addresses, comma-separated (default loopback only; 0.0.0.0 "
                     "or :: publishes it: then use --http-tokens and --http-tls)",
        "http_tokens": "file of dashboard bearer tokens, one per line: /api/* and /metrics "
                       "then need 'Authorization: Bearer TOKEN' (health probes stay open)",
        "http_tls": "serve the dashboard over HTTPS with --tls-cert and --tls-key",
        "http_header_timeout": "seconds an HTTP request (TLS handshake, headers, body) has to "
                               "arrive complete before its connection is closed",
        "http_max_connections": "HTTP connections open at once, at most (0: automatic, a "
                                "quarter of the file descriptor limit, at most 1024)",
        "http_body_cache_bytes": "bytes of formatted JSON and CSV estimate downloads kept "
        "on disk (in a private temporary directory; least recently used out; 0: none beyond "
        "the downloads in progress). Default 256 MiB: about 12 bodies at d = 2^20",
        "grpc_max_connections": "gRPC connections open at once, at most; one more is closed "
                                "at accept (0: automatic, the descriptors the dashboard's cap "
                                "and the reserve leave, at most 4096)",
        "grpc_handshake_timeout": "seconds a gRPC connection has to finish its TLS and HTTP/2 "
                                  "handshake (the client's preface and SETTINGS) before it is "
                                  "closed",
        "grpc_idle_timeout": "seconds a gRPC connection with no call in flight stays open "
                             "(the client reconnects when it calls again)",
        "n": "number of clients",
        "k": "floats per client per vector (with --target-rel-error: of the first round, and "
        "the default --k-max); eden and qsgd send every coordinate and ignore it",
        "target_rel_error": "choose each round's k: the smallest in [--k-min, --k-max] whose "
        "predicted relative error at the least of the smoothed R_hat of earlier rounds and "
        "the last round's is at most this (0: off, a fixed --k)",
        "k_min": "with --target-rel-error: the smallest k a round may use (default 1; with "
        "--block-size, one value per block: ceil(d / block size))",
        "k_max": "with --target-rel-error: the largest k a round may use (0: --k)",
        "d": "vector length (0 with --data external: the first client's join says it, and "
        "it is fixed for the job)",
        "max_d": "the largest d this server takes, for --d and for the first join of a --d 0 "
        "job (a join above it is refused and fixes nothing); 0: automatic, the largest power "
        f"of two d with {BYTES_PER_COORDINATE} bytes per coordinate within a quarter of the "
        "memory the server may use (its cgroup's limit, else the machine's memory), at most "
        "2^30",
        "estimator": f"one of {', '.join(SCHEMES)}",
        "value_bits": "bits per sent value of rand-k, rand-k-spatial and rand-proj-spatial "
        "(1..32; below 32 unbiased stochastic rounding with a float32 scale per message; "
        "auto with --target-rel-error: each round the width, among "
        f"{', '.join(map(str, AUTO_VALUE_BITS))}, and k with the fewest bytes that meet the "
        "target)",
        "bits": "eden (1, 2, 4, 8) and qsgd (1..16): bits per coordinate",
        "block_size": f"{PROJECTION_SCHEMES}: encode and decode blocks of this many coordinates "
        "(a power of two >= 2) independently, each with its own SRHT (and, with --value-bits, "
        "its own float32 scale); announced as RoundInfo.block_size. 0 (default): one "
        "transform over all of d; auto: blocks of "
        f"{AUTO_BLOCK_SIZE} for d above {AUTO_BLOCK_THRESHOLD}, else 0",
        "transform": "avg, max, one, auto (smoothed R_hat) or a number R",
        "task": f"one of {', '.join(TASKS)}",
        "rounds": "rounds (task steps) to run; 0: until stopped (the first SIGINT or SIGTERM "
        "ends the job after the current round, a second one stops at once)",
        "round_timeout": "seconds from a round's first submission to its deadline",
        "min_clients": "minimum arrivals to decode at the deadline",
        "max_failed_rounds": "end the job as failed after this many consecutive failed rounds "
        "(0: no limit)",
        "db": "SQLite database path (':memory:' keeps nothing)",
        "result_cache_bytes": "bytes of finished rounds' estimates and task states kept in "
        "memory (least recently read first out; the others are read back from the database "
        "on demand; 0: none). Default 64 MiB: 8 rounds at d = 2^20",
        "eval": "evaluation mode: clients also send raw vectors; record squared errors",
        "tls_cert": "PEM server certificate",
        "tls_key": "PEM server key",
        "tls_client_ca": "PEM CA bundle: require client certificates (mTLS)",
        "tokens": "file of client tokens, one per line: 'TOKEN' or 'CLIENT_ID TOKEN'",
        "insecure": "run without TLS and tokens (explicit; development only)",
        "data": "data source the clients use: synthetic, fashion-mnist, ujiindoorloc, or "
        "external (--task mean over the clients' own vectors: rpsagg-client --vectors)",
        "mean_vectors": "mean: vectors per client per round (m; the mean of each is "
        "estimated separately)",
        "data_r": "correlation R of the synthetic data",
        "seed": "seed of the initial task state and of the synthetic data",
        "lr": "linreg learning rate",
        "centroids": "kmeans: number of centroids (m)",
        "kmeans_updates": "kmeans: 1 (default) clients send centroid updates, 0 whole centroids",
        "drain": "after the job is done, wait at most this many seconds for every joined "
        "client to be told so",
        "linger": "seconds to keep serving after the drain (negative: until signalled)",
        "port_file": "write the bound gRPC port to this file once gRPC and the dashboard both "
                 "accept connections (for --grpc-port 0)",
        "decode_device": "decode rand-proj-spatial rounds on this PyTorch device (cuda, "
        "cuda:N, cpu; needs rpsagg[torch]); default: numpy on the CPU",
        "decode_threads": "CPU threads of a decode (default: every core of the process)",
        "decode_backend": "local (default) or ray: decode rounds as Ray tasks "
        "(needs rpsagg-server[ray])",
        "event_loop": "auto (default: uvloop where installed, else asyncio's), uvloop or "
        "asyncio: the loop that runs gRPC, the round engine and the dashboard",
        "on_finished_job": "started on the database of a finished job: keep (serve that job "
        "again) or new (move it to <db>.jobs/, where the dashboard lists it, and start a new "
        "job); an unfinished job is resumed either way",
        "admin_tokens": "file of admin bearer tokens, one per line: creating and cancelling "
        "jobs over the HTTP API (POST /api/jobs) needs one unless --insecure is given",
        "no_default_job": "start an empty standing service: no job from the job flags, only "
        "the jobs created over the HTTP API (rpsagg-jobs create)",
        "max_jobs": "jobs running at once (the default job included); more wait queued",
        "jobs_memory_bytes": "memory the jobs may take together, by each job's estimate "
        "(docs/architecture.md); a job that would not fit is refused at creation (0: "
        "automatic, half the memory the server may use)",
        "max_request_bytes": "the largest gRPC request the server takes from any job "
        "(each job is held to its own, smaller limit too; 0: automatic, the default job's "
        "limit or 64 MiB, whichever is larger)",
        "ray_address": "Ray cluster to join with --decode-backend ray (e.g. 10.0.0.5:6379); "
        "default: start a local one",
    }
    for name, info in _Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if name in _BOOL:
            p.add_argument(flag, action="store_true", default=None, help=helps[name])
        elif name == "value_bits":
            p.add_argument(flag, type=_value_bits_flag, default=None, help=helps[name])
        elif name == "block_size":
            p.add_argument(flag, type=_block_size_flag, default=None, help=helps[name])
        else:
            p.add_argument(flag, type=_flag_type(info), default=None, help=helps[name])
    return p


def _value_bits_flag(text: str) -> int:
    """argparse's type for ``--value-bits`` (its message kept)."""
    try:
        return parse_value_bits(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _block_size_flag(text: str) -> int:
    """argparse's type for ``--block-size`` (its message kept)."""
    try:
        return parse_block_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _flag_type(info: FieldInfo) -> type:
    """int or float for a field of that type (``int | None`` included), else str."""
    kinds = set(typing.get_args(info.annotation) or (info.annotation,)) - {type(None)}
    return next((t for t in (int, float) if t in kinds), str)


class _SettingsBase(BaseSettings):
    """The options every source can set, converted by pydantic to their field types."""

    model_config = SettingsConfigDict(env_prefix="RPSAGG_", extra="forbid",
                                      coerce_numbers_to_str=True)

    @field_validator("value_bits", mode="before", check_fields=False)
    @classmethod
    def _value_bits(cls, value: Any) -> int:
        """``auto`` from the environment or a config file (a value already read: as is)."""
        if isinstance(value, int) and not isinstance(value, bool) and value == VALUE_BITS_AUTO:
            return value
        return parse_value_bits(value)

    @field_validator("block_size", mode="before", check_fields=False)
    @classmethod
    def _block_size(cls, value: Any) -> int:
        """``auto`` from the environment or a config file (a value already read: as is)."""
        if isinstance(value, int) and not isinstance(value, bool) and value == BLOCK_SIZE_AUTO:
            return value
        return parse_block_size(value)

    @field_validator(*sorted(_BOOL), mode="before", check_fields=False)
    @classmethod
    def _switch(cls, value: Any) -> bool:
        """A switch from the environment is on for 1, true, yes or on (any case)."""
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)


def _settings_model() -> type[_SettingsBase]:
    """The settings model: every :class:`ServerConfig` field but ``task_params``."""
    hints = typing.get_type_hints(ServerConfig)
    spec: dict[str, Any] = {}
    for f in fields(ServerConfig):
        if f.name != "task_params":
            assert f.default is not MISSING
            spec[f.name] = (hints[f.name], f.default)
    model: type[_SettingsBase] = create_model("ServerSettings", __base__=_SettingsBase, **spec)
    return model


_Settings = _settings_model()


class _Environment(EnvSettingsSource):
    """``RPSAGG_<FLAG>`` variables of a given mapping (``os.environ`` by default)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # the hook pydantic-settings' own dotenv source overrides to read another mapping;
        # the names are exactly RPSAGG_<FIELD IN CAPITALS> (the source matches lower case)
        return {k.lower(): v for k, v in self._env.items()
                if k.startswith("RPSAGG_") and k == k.upper()}


class _ConfigFile(TomlConfigSettingsSource):
    """The ``--config`` TOML file; keys are spelled like the flags, with ``-`` or ``_``."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        raw = super()._read_file(file_path)
        out = {}
        for key, value in raw.items():
            name = key.replace("-", "_")
            if name not in _Settings.model_fields:
                raise ValueError(f"{file_path}: unknown option {key!r}")
            out[name] = value
        return out


class _Checked(PydanticBaseSettingsSource):
    """Every value of ``source`` must convert to its field's type, whether a source above
    overrides it or not (``RPSAGG_K=many`` is an error even with ``--k 4``)."""

    def __init__(self, source: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self.source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = self.source()
        try:
            _Settings.model_validate(values)  # validation only: no sources are read
        except ValidationError as exc:
            raise _type_error(exc) from None
        return values


def _type_error(exc: ValidationError) -> ValueError:
    """The first conversion error, as the one line the command prints."""
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else ""
    flag = name.replace("_", "-")
    kinds = set(typing.get_args(_Settings.model_fields[name].annotation)
                or (_Settings.model_fields[name].annotation,)) if name else set()
    kind = "an integer" if int in kinds else "a number" if float in kinds else "a string"
    return ValueError(f"--{flag} (RPSAGG_{name.upper()} or config key {flag}) must be "
                      f"{kind}; got {err['input']!r}")


def load_config(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> ServerConfig:
    """Parse flags, environment and config file into a validated :class:`ServerConfig`."""
    environ: Mapping[str, str] = os.environ if env is None else env
    args = _parser().parse_args(argv)
    flags = {name: getattr(args, name) for name in _Settings.model_fields
             if getattr(args, name) is not None}
    config_path = args.config or environ.get("RPSAGG_CONFIG")
    if config_path:
        Path(config_path).open("rb").close()  # an unreadable file is an error, not empty

    class Settings(_Settings):  # type: ignore[misc, valid-type]
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [
                init_settings, _Checked(_Environment(settings_cls, environ))]
            if config_path:
                sources.append(_Checked(_ConfigFile(settings_cls, toml_file=Path(config_path))))
            return tuple(sources)

    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        raise _type_error(exc) from None
    return ServerConfig(**settings.model_dump())
