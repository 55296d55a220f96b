"""The gRPC server of a process: built, recovered and started (:func:`create_server`), its
jobs, interceptors, health servicer and TLS credentials, and its stop
(:class:`RunningServer`)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from rpsagg.schemes import WireProfile
from rpsagg_server import jobs
from rpsagg_server.decode.decodepool import DecodePool
from rpsagg_server.domain.errors import DomainError, StartupError
from rpsagg_server.jobs.catalog import CatalogError
from rpsagg_server.jobs.firstjoin import learned_config
from rpsagg_server.jobs.jobhost import JobHost
from rpsagg_server.jobs.jobruntime import JobRuntime
from rpsagg_server.jobs.sizing import wire_limit
from rpsagg_server.process import eventloop
from rpsagg_server.process.startup import bind_grpc, check_database, check_tls, check_tokens
from rpsagg_server.readmodel.events import SubmissionRefused
from rpsagg_server.readmodel.state import ServerState
from rpsagg_server.rounds.engine import RoundEngine
from rpsagg_server.rounds.taskeval import TaskMonitor
from rpsagg_server.rpc.auth import TokenInterceptor
from rpsagg_server.rpc.guard import ConnectionGuard, grpc_connection_options, server_budget
from rpsagg_server.rpc.refusals import status_of
from rpsagg_server.rpc.servicer import AggregationServicer
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.settings.tokenfiles import TokenBook
from rpsagg_server.store.database import Store
from rpsagg_wire.v1 import serde

log = logging.getLogger("rpsagg.server")
STOP_GRACE = 2.0  # seconds calls in flight get to finish when the server stops


def max_request_bytes(cfg: ServerConfig, m: int, wire: WireProfile) -> int:
    """Request size limit of a job: :func:`rpsagg_server.jobs.sizing.max_request_bytes` for
    ``wire``, what the job's estimator sends (values counted as 4 bytes each, which bounds
    packed codes too; a blockwise job adds 4 bytes per block for the block scales of
    quantized values)."""
    return wire_limit(cfg, m, wire)


@dataclass
class RunningServer:
    """A started server: the gRPC server, its jobs and health servicer. ``engine``,
    ``state``, ``store`` and ``task_monitor`` are the default job's."""

    grpc_server: grpc.aio.Server
    host: JobHost
    health: HealthServicer
    port: int
    serving: bool = True
    guard: ConnectionGuard | None = None

    def _default(self) -> JobRuntime:
        rt = self.host.default()
        if rt is None:
            raise AttributeError("this server has no default job (--no-default-job)")
        return rt

    @property
    def engine(self) -> RoundEngine:
        """The default job's engine."""
        return self._default().engine

    @property
    def state(self) -> ServerState:
        """The default job's read model."""
        return self._default().state

    @property
    def store(self) -> Store:
        """The default job's store."""
        return self._default().store

    @property
    def task_monitor(self) -> TaskMonitor:
        """The default job's task monitor."""
        return self._default().monitor

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """Report NOT_SERVING, stop serving (calls in flight get ``grace`` seconds to
        finish; new ones are refused) and close every job's database."""
        self.serving = False
        await self.health.enter_graceful_shutdown()
        for rt in self.host.jobs.values():
            rt.engine.results.end_watches()
        await asyncio.sleep(0)  # let the streams finish
        if self.guard is not None:
            await self.guard.stop()
        await self.grpc_server.stop(grace)
        await self.host.close()


def _credentials(cfg: ServerConfig) -> grpc.ServerCredentials | None:
    if cfg.tls_cert is None or cfg.tls_key is None:
        return None
    key = Path(cfg.tls_key).read_bytes()
    cert = Path(cfg.tls_cert).read_bytes()
    ca = Path(cfg.tls_client_ca).read_bytes() if cfg.tls_client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=ca is not None)


async def create_server(cfg: ServerConfig) -> tuple[RunningServer, int]:
    """Build, recover and start a server; returns it and the bound gRPC port.

    The server hosts the default job (the job flags'; none with ``--no-default-job``) and
    the jobs created over the API (:class:`~rpsagg_server.jobs.jobhost.JobHost`; those of the
    catalog are reopened here).

    User errors (unreadable or mismatched TLS files, an unreadable token file, a corrupt or
    foreign database, an address gRPC cannot listen on) raise :class:`StartupError` before
    the job's state is touched; a database of a job with other settings raises ``ValueError``.

    Parameters
    ----------
    cfg : ServerConfig
        ``grpc_port=0`` binds any free port (tests).
    """
    check_tls(cfg)
    check_tokens(cfg)
    check_database(cfg)
    budget = server_budget(cfg)
    tokens = TokenBook.from_file(cfg.tokens) if cfg.tokens else None
    creds = _credentials(cfg)
    cfg, host = open_host(cfg)
    try:
        if not cfg.no_default_job:
            host.expect_default(cfg)
        limit = host.request_limit
        # displacement near the cap (its port is known once bound)
        guard = ConnectionGuard(0, budget.grpc)
        server = grpc_server(cfg, host, guard, tokens, limit, budget.grpc)
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        # bind before the jobs open, so a port in use is reported before anything is logged
        port = bind_grpc(server, cfg.host, cfg.grpc_port, creds)
        guard.port = port
        if cfg.no_default_job:
            host.drop_default()
        else:  # with --d 0 it waits for its first join (jobs/firstjoin.py)
            await host.open_default(cfg)
        await host.restore()
    except BaseException:
        await host.close()
        raise
    await server.start()
    guard.start()
    for name in ("", serde.SERVICE):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("[Server] listening on %s:%d (%s, %s loop), max request %d bytes", cfg.host, port,
             "TLS" if creds else "insecure", eventloop.running_name(), limit)
    log.info("[Server] %s; gRPC handshake %g s, idle %g s", budget.describe(),
             cfg.grpc_handshake_timeout, cfg.grpc_idle_timeout)
    log.info("[Server] jobs: %s; at most %d running, %.0f MiB of job memory",
             ", ".join(host.jobs) or "none yet", cfg.max_jobs, host.memory_budget / 2**20)
    running = RunningServer(server, host, health, port, guard=guard)
    for rt in host.jobs.values():
        rt.state.add_check("grpc", lambda: running.serving)
    host.on_open.append(lambda rt: rt.state.add_check("grpc", lambda: running.serving))
    return running, port


def open_host(cfg: ServerConfig) -> tuple[ServerConfig, JobHost]:
    """The jobs of a starting server, their catalog open (:class:`StartupError` if it
    cannot be), with the configuration they run with.

    With ``--on-finished-job new`` a finished default job's database is first moved to
    ``<db>.jobs/``; with ``--d 0`` the returned configuration has the d an earlier start's
    first join said.
    """
    if cfg.on_finished_job == "new" and not cfg.no_default_job:
        try:
            jobs.archive_finished_job(cfg.db)
        except (OSError, sqlite3.Error) as exc:
            raise StartupError(f"--db {cfg.db}: cannot move its finished job to "
                               f"{jobs.jobs_dir(cfg.db)} ({exc})") from None
    if not cfg.no_default_job:  # --d 0: the d of an earlier start's first join
        cfg = learned_config(cfg)
    try:
        host = JobHost(cfg, DecodePool())
        host.add_past_jobs()
    except (OSError, sqlite3.Error, CatalogError) as exc:
        raise StartupError(f"--db {cfg.db}: cannot open the job catalog beside it "
                           f"({exc})") from None
    return cfg, host


def grpc_server(cfg: ServerConfig, host: JobHost, guard: ConnectionGuard,
                tokens: TokenBook | None, limit: int, max_connections: int) -> grpc.aio.Server:
    """The gRPC server of ``host``'s jobs, not yet bound: the connection guard's and the
    token interceptors, requests of at most ``limit`` bytes, connections bounded
    (``max_connections``, the timeouts of ``cfg``), the service and nothing else (its
    handlers answer their own refusals: :meth:`AggregationServicer.generic_handler`)."""
    interceptors: list[grpc.aio.ServerInterceptor] = [guard.interceptor()]
    if tokens is not None:
        interceptors.append(TokenInterceptor(tokens, _count_refusal(host)))
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", 256 * 1024 * 1024),
        ("grpc.so_reuseport", 0),  # a second server on the same port is an error
        *grpc_connection_options(cfg, max_connections),
    ])
    server.add_generic_rpc_handlers((AggregationServicer(host).generic_handler(),))
    return server


def _count_refusal(host: JobHost) -> Callable[[str, DomainError], None]:
    """The interceptor's refusals of Submit calls, as events of the default job (the
    metrics count them; a refused call's job is not read)."""
    def refused(method: str, exc: DomainError) -> None:
        rt = host.default()
        if method == "Submit" and rt is not None:
            rt.engine.publish(SubmissionRefused(status_of(exc).name, exc.message))
    return refused
