"""The server's own settings: :class:`ServerSettings`, the process every job of a server
shares (its ports, TLS and tokens, connection bounds, database, decode workers, event loop
and the bounds on its jobs), one field per flag with its default, description and rule.

A job's settings are :class:`~rpsagg_server.settings.jobspec.JobSpec`; a running server's whole
configuration is both (:class:`~rpsagg_server.settings.serverconfig.ServerConfig`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from rpsagg_server.settings.jobspec import BYTES_PER_COORDINATE
from rpsagg_server.settings.rules import Rule, at_least, finite, one_of, validate_field

EVENT_LOOPS = ("auto", "uvloop", "asyncio")
#: a duration's units (``--keep-finished-for 90d``), in seconds
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: ``--keep-finished-for``'s default: 90 days
DEFAULT_KEEP_FOR = 90.0 * DURATION_UNITS["d"]


def parse_duration(value: object) -> float:
    """A duration as given: seconds (a number), or a number followed by one of
    :data:`DURATION_UNITS` (``90d``, ``12h``, ``1.5w``); ``ValueError`` otherwise."""
    text = str(value).strip().lower()
    scale = DURATION_UNITS.get(text[-1:], 0) if text else 0
    try:
        seconds = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError("--keep-finished-for must be a duration >= 0 such as 90d, 12h, 30m "
                         f"or seconds; got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration in its largest whole unit (``7776000`` -> ``90d``; ``0`` -> ``0``)."""
    for unit, size in sorted(DURATION_UNITS.items(), key=lambda u: -u[1]):
        if seconds and seconds % size == 0:
            return f"{seconds // size:g}{unit}"
    return f"{seconds:g}"
_PORT = Rule(lambda v: 0 <= v <= 65535, "must be in [0, 65535]")

#: each field's own rule (what involves another field is ServerConfig's)
SERVER_RULES: dict[str, Rule] = {
    "grpc_port": _PORT,
    "http_port": _PORT,
    "http_host": Rule(lambda v: bool(v.strip(",")), "needs at least one address", None),
    "http_header_timeout": finite(0, strict=True),
    "http_max_connections": at_least(0, "0: automatic"),
    "http_body_cache_bytes": at_least(0, "0: none kept"),
    "grpc_max_connections": at_least(0, "0: automatic"),
    "grpc_handshake_timeout": finite(0, strict=True),
    "grpc_idle_timeout": finite(0, strict=True),
    "max_d": at_least(0, "0: automatic"),
    "result_cache_bytes": at_least(0, "0: no cache"),
    "drain": finite(0),
    "linger": Rule(lambda v: not math.isnan(v), "must be a number of seconds"),
    "decode_threads": at_least(1),
    "decode_backend": one_of(("local", "ray")),
    "event_loop": one_of(EVENT_LOOPS),
    "on_finished_job": one_of(("keep", "new")),
    "max_jobs": at_least(1),
    "keep_finished_jobs": at_least(0, "0: none kept"),
    "keep_finished_for": finite(0, note="seconds, or a number with s, m, h, d or w; 0: no "
                                "age limit"),
    "jobs_memory_bytes": at_least(0, "0: automatic"),
    "max_request_bytes": at_least(0, "0: automatic"),
}


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class ServerSettings:
    """The server's own settings (see ``rpsagg-server --help``)."""

    # -- gRPC
    grpc_port: int = Field(50051, description="gRPC port (0 = any free port)")
    host: str = Field("[::]", description="gRPC address to bind ([::]: every address, IPv4 "
                      "and IPv6)")
    grpc_max_connections: int = Field(
        0, description="gRPC connections open at once, at most; one more is closed at accept "
        "(0: automatic, the descriptors the dashboard's cap and the reserve leave, at most "
        "4096)")
    grpc_handshake_timeout: float = Field(
        5.0, description="seconds a gRPC connection has to finish its TLS and HTTP/2 "
        "handshake (the client's preface and SETTINGS) before it is closed")
    grpc_idle_timeout: float = Field(
        10.0, description="seconds a gRPC connection with no call in flight stays open (the "
        "client reconnects when it calls again)")
    max_request_bytes: int = Field(
        0, description="the largest gRPC request the server takes from any job (each job is "
        "held to its own, smaller limit too; 0: automatic, the default job's limit or 64 MiB, "
        "whichever is larger)")
    # -- security
    tls_cert: str | None = Field(None, description="PEM server certificate")
    tls_key: str | None = Field(None, description="PEM server key")
    tls_client_ca: str | None = Field(
        None, description="PEM CA bundle: require client certificates (mTLS)")
    tokens: str | None = Field(
        None, description="file of client tokens, one per line: 'TOKEN', 'CLIENT_ID TOKEN' "
        "or 'JOB CLIENT_ID TOKEN'")
    insecure: bool = Field(False, description="run without TLS and tokens (explicit; "
                           "development only)")
    # -- the dashboard
    http_port: int = Field(8000, description="dashboard HTTP port (0 disables it)")
    http_host: str = Field(
        "127.0.0.1,::1", description="dashboard addresses, comma-separated (default loopback "
        "only; 0.0.0.0 or :: publishes it: then use --http-tokens and --http-tls)")
    http_tokens: str | None = Field(
        None, description="file of dashboard bearer tokens, one per line: every path but the "
        "health probes, the page and the API's schema then needs 'Authorization: Bearer "
        "TOKEN'")
    http_tls: bool = Field(False, description="serve the dashboard over HTTPS with "
                           "--tls-cert and --tls-key")
    http_header_timeout: float = Field(
        30.0, description="seconds an HTTP request (TLS handshake, headers, body) has to "
        "arrive complete before its connection is closed (408 once a request began)")
    http_max_connections: int = Field(
        0, description="HTTP connections open at once, at most (0: automatic, a quarter of "
        "the file descriptor limit, at most 1024)")
    http_body_cache_bytes: int = Field(
        256 << 20, description="bytes of formatted JSON and CSV estimate downloads kept on "
        "disk (in a private temporary directory; least recently used out; 0: none beyond the "
        "downloads in progress): about 12 bodies at d = 2^20 by default")
    admin_tokens: str | None = Field(
        None, description="file of admin bearer tokens, one per line: creating and "
        "cancelling jobs over the HTTP API (POST /api/jobs) needs one unless --insecure is "
        "given")
    # -- storage and the job's life
    db: str = Field("rpsagg.db", description="SQLite database path (':memory:' keeps "
                    "nothing)")
    result_cache_bytes: int = Field(
        64 << 20, description="bytes of finished rounds' estimates and task states kept in "
        "memory (least recently read first out; the others are read back from the database "
        "on demand; 0: none): 8 rounds at d = 2^20 by default")
    on_finished_job: str = Field(
        "keep", description="started on the database of a finished job: keep (serve that job "
        "again) or new (move it to <db>.jobs/, where the dashboard lists it, and start a new "
        "job); an unfinished job is resumed either way")
    drain: float = Field(10.0, description="after the job is done, wait at most this many "
                         "seconds for every joined client to be told so")
    linger: float = Field(2.0, description="seconds to keep serving after the drain "
                          "(negative: until signalled)")
    port_file: str | None = Field(
        None, description="write the bound gRPC port to this file once gRPC and the "
        "dashboard both accept connections (for --grpc-port 0)")
    # -- jobs
    no_default_job: bool = Field(
        False, description="start an empty standing service: no job from the job flags, "
        "only the jobs created over the HTTP API (rpsagg-jobs create)")
    max_jobs: int = Field(16, description="jobs running at once (the default job "
                          "included); more wait queued")
    keep_finished_jobs: int = Field(
        1000, description="created jobs that ended (done, failed, cancelled) whose data the "
        "server keeps, the most recently ended; beyond it the job that ended first is removed "
        "(its database deleted, its row dropped), with a line in the log")
    keep_finished_for: float = Field(
        DEFAULT_KEEP_FOR, description="how long the server keeps an ended created job's data "
        "after its end: a duration such as 90d, 12h, 30m or seconds (0: no age limit); an "
        "older one is removed as by --keep-finished-jobs")
    jobs_memory_bytes: int = Field(
        0, description="memory the jobs may take together, by each job's estimate "
        "(docs/architecture.md); a job that would not fit is refused at creation (0: "
        "automatic, half the memory the server may use)")
    max_d: int = Field(
        0, description="the largest d this server takes, for --d and for the first join of a "
        "--d 0 job (a join above it is refused and fixes nothing); 0: automatic, the largest "
        f"power of two d with {BYTES_PER_COORDINATE} bytes per coordinate within a quarter "
        "of the memory the server may use (its cgroup's limit, else the machine's memory), "
        "at most 2^30")
    # -- decoding and the event loop
    decode_device: str | None = Field(
        None, description="decode rand-proj-spatial rounds on this PyTorch device (cuda, "
        "cuda:N, cpu; needs rpsagg[torch]); default: numpy on the CPU")
    decode_threads: int | None = Field(
        None, description="CPU threads of a decode (default: every core of the process)")
    decode_backend: str = Field("local", description="local or ray: decode rounds as Ray "
                                "tasks (needs rpsagg-server[ray])")
    ray_address: str | None = Field(
        None, description="Ray cluster to join with --decode-backend ray (e.g. "
        "10.0.0.5:6379); default: start a local one")
    event_loop: str = Field(
        "auto", description="auto (uvloop where installed, else asyncio's), uvloop or "
        "asyncio: the loop that runs gRPC, the round engine and the dashboard")

    #: the rules of the fields (a class that adds fields adds theirs)
    RULES: ClassVar[dict[str, Rule]] = SERVER_RULES

    @field_validator("*")
    @classmethod
    def _rule(cls, value: Any, info: ValidationInfo) -> Any:
        return validate_field(cls.RULES, value, info)


#: the settings that name files (the dashboard shows whether they are set, never the paths)
PATH_KEYS = ("tls_cert", "tls_key", "tls_client_ca", "tokens", "http_tokens", "db",
             "port_file", "admin_tokens")
