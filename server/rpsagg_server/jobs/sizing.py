"""What a job's settings imply before it opens: the largest request it takes and the memory
it is taken to need (what ``--max-request-bytes`` and ``--jobs-memory-bytes`` bound)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rpsagg.schemes import WireProfile, estimator_from_options
from rpsagg.tasks import make_task
from rpsagg_server.domain.errors import InvalidRequest, StartupError
from rpsagg_server.settings.bounds import INT32_MAX
from rpsagg_server.settings.serverconfig import BYTES_PER_COORDINATE, ServerConfig, job_config

#: the largest request any job may take, unless ``--max-request-bytes`` says otherwise
AUTO_REQUEST_BYTES = 64 << 20


@dataclass(frozen=True)
class Need:
    """What a job's settings imply: its configuration, vectors per submission (m) and
    memory estimate."""

    cfg: ServerConfig
    m: int
    memory: int


def max_request_bytes(cfg: ServerConfig, m: int, max_values: int, sends_indices: bool,
                      block_size: int) -> int:
    """Request size limit of a job: m vectors of values (+ indices) (+ float64 reference),
    plus 25% and 4 KiB of slack, so a slightly wrong submission still reaches validation and
    gets a precise refusal (an invalid request), while anything far larger is refused before it is
    parsed. Values count 4 bytes each (which bounds packed codes too); a blockwise job adds
    4 bytes per block for the block scales of quantized values."""
    indices = max_values if sends_indices else 0
    reference = 8 * cfg.d if cfg.eval else 0
    scales = 4 * -(-cfg.d // block_size) if block_size else 0
    per_vector = 4 * max_values + 4 * indices + reference + scales + 32
    return int(1.25 * (m * per_vector + 1024)) + 4096


def wire_limit(cfg: ServerConfig, m: int, wire: WireProfile) -> int:
    """:func:`max_request_bytes` for ``wire``, what the job's estimator sends."""
    return max_request_bytes(cfg, m, wire.max_values, wire.sends_indices,
                             wire.block_size if wire.block_size else 0)


def job_memory(cfg: ServerConfig, m: int) -> int:
    """The memory a job is taken to need, in bytes: a round of d coordinates per vector
    (:data:`~rpsagg_server.settings.serverconfig.BYTES_PER_COORDINATE` each: the estimate, the
    decode's work vectors, the next state), n submissions of k values (and in evaluation mode a
    d-long
    float64 reference) per vector, and its cache of finished rounds (at most
    ``--result-cache-bytes``, at most two rounds' estimate and state); once the job ends,
    :func:`ended_memory`."""
    d = max(cfg.d, 1)
    round_bytes = BYTES_PER_COORDINATE * d * m
    subs = cfg.n * m * (8 * max(cfg.k, 1) + (8 * d if cfg.eval else 0))
    cache = min(cfg.result_cache_bytes, 2 * 16 * d * m)
    return round_bytes + subs + cache


def ended_memory(cfg: ServerConfig, m: int) -> int:
    """The memory an ended job keeps: one round's estimate and state in its cache (older
    rounds are read back from its database when asked for)."""
    return min(cfg.result_cache_bytes, 16 * max(cfg.d, 1) * m)


def client_wire(cfg: ServerConfig) -> WireProfile:
    """What a job's clients send at most (``--k-max`` values; what bounds a request)."""
    return estimator_from_options(cfg.estimator, n=cfg.n, k=cfg.k_max or cfg.k, d=cfg.d,
                                  transform=cfg.transform, prior_r=None, projection="auto",
                                  block_size=cfg.block_size_for(cfg.d),
                                  value_bits=cfg.fixed_value_bits or 32, bits=cfg.bits).wire


def flag_names(message: str) -> str:
    """A flag's check message with the flags spelled as job settings (``--min-clients`` ->
    ``min_clients``)."""
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)


def vet(server: ServerConfig, settings: Mapping[str, Any]) -> tuple[Need, int]:
    """Everything a created job's settings imply, derived before anything is recorded: its
    configuration, task, memory estimate and request limit
    (:class:`~rpsagg_server.domain.errors.InvalidRequest`, one line naming the setting, for
    whatever the flags' checks or the library's refuse)."""
    try:
        cfg = job_config(server, settings, ":memory:")
        m = make_task(cfg.task, cfg.d, cfg.params).m
        probe = client_wire(cfg)
    except ValueError as exc:
        raise InvalidRequest(flag_names(str(exc))) from None
    return Need(cfg, m, job_memory(cfg, m)), wire_limit(cfg, m, probe)


def server_request_limit(cfg: ServerConfig, current: int) -> int:
    """The server's request limit once the default job (``cfg``) is known: raised to the
    job's when ``--max-request-bytes`` is automatic (the gRPC server is built with it; a job
    that waits for its d counts with ``--max-d``); :class:`StartupError` when an explicit
    limit is below the job's."""
    sized = cfg if cfg.d else replace(cfg, d=cfg.d_limit)
    need = wire_limit(sized, make_task(sized.task, sized.d, sized.params).m,
                      client_wire(sized))
    if not cfg.max_request_bytes:
        return max(current, min(need, INT32_MAX))
    if need > current and cfg.d:
        raise StartupError(f"--max-request-bytes {current} is below the default "
                           f"job's request limit of {need} bytes")
    return current
