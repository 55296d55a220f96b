"""Server construction (``create_server``), the serve loop, and the ``rpsagg-server`` command.

The gRPC server (``grpc.aio``), the round engine and, when ``http_app_factory`` is given, an
ASGI app served by uvicorn all run on one asyncio event loop. Decoding runs in a worker
thread so submissions and status calls stay fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sqlite3
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import uvicorn
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from rpsagg.schemes import WireProfile
from rpsagg_server import jobs
from rpsagg_server.decode.decodepool import DecodePool
from rpsagg_server.domain.errors import DomainError, StartupError
from rpsagg_server.domain.jobstate import JobState
from rpsagg_server.http.connections import (
    ConnectionLimits,
    ConnectionsCollector,
    bounded_protocol,
)
from rpsagg_server.http.service import create_standing_app
from rpsagg_server.jobs.catalog import CatalogError
from rpsagg_server.jobs.firstjoin import learned_config
from rpsagg_server.jobs.jobhost import JobHost
from rpsagg_server.jobs.jobruntime import CANNOT_OPEN, JobRuntime
from rpsagg_server.jobs.sizing import wire_limit
from rpsagg_server.process import eventloop
from rpsagg_server.process.startup import (
    bind_grpc,
    bind_http_sockets,
    check_database,
    check_tls,
    check_tokens,
    load_admin_tokens,
    load_http_tokens,
)
from rpsagg_server.readmodel.events import SubmissionRefused
from rpsagg_server.readmodel.state import ServerState
from rpsagg_server.rounds.engine import RoundEngine
from rpsagg_server.rounds.taskeval import TaskMonitor
from rpsagg_server.rpc.auth import TokenInterceptor
from rpsagg_server.rpc.guard import (
    ConnectionGuard,
    GuardCollector,
    grpc_connection_options,
    server_budget,
)
from rpsagg_server.rpc.refusals import RefusalInterceptor, status_of
from rpsagg_server.rpc.servicer import AggregationServicer
from rpsagg_server.settings.descriptors import ACCEPT_BACKLOG, connection_cap, descriptor_limit
from rpsagg_server.settings.flags import load_config
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.settings.tokenfiles import TokenBook
from rpsagg_server.store.database import Store
from rpsagg_wire.v1 import serde

log = logging.getLogger("rpsagg.server")
#: builds the dashboard's ASGI app of a server's jobs (and, given, its admin tokens)
HttpAppFactory = Callable[..., Any]
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
    try:
        if not cfg.no_default_job:
            host.expect_default(cfg)
        limit = host.request_limit
        # displacement near the cap (its port is known once bound)
        guard = ConnectionGuard(0, budget.grpc)
        # refusals are answered outside the token check, which raises its own
        interceptors: list[grpc.aio.ServerInterceptor] = [guard.interceptor(),
                                                          RefusalInterceptor()]
        if tokens is not None:
            interceptors.append(TokenInterceptor(tokens, _count_refusal(host)))
        server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 256 * 1024 * 1024),
            ("grpc.so_reuseport", 0),  # a second server on the same port is an error
            *grpc_connection_options(cfg, budget.grpc),
        ])
        server.add_generic_rpc_handlers((AggregationServicer(host).generic_handler(),))
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


def _count_refusal(host: JobHost) -> Callable[[str, DomainError], None]:
    """The interceptor's refusals of Submit calls, as events of the default job (the
    metrics count them; a refused call's job is not read)."""
    def refused(method: str, exc: DomainError) -> None:
        rt = host.default()
        if method == "Submit" and rt is not None:
            rt.engine.publish(SubmissionRefused(status_of(exc).name, exc.message))
    return refused


#: Seconds the dashboard (uvicorn) gets to accept connections before start-up fails.
DASHBOARD_START_S = 30.0


def start_http(app: Any, sockets: list[socket.socket],
               limits: ConnectionLimits | None = None) -> tuple[Any, asyncio.Future[None]]:
    """Serve an ASGI app with uvicorn on already-bound ``sockets`` (on the running loop).

    ``limits`` bound its connections (:mod:`rpsagg_server.http.connections`: a deadline per
    request, a cap on open connections, TLS); default: 30 s and the automatic cap.
    Returns the ``uvicorn.Server`` (set ``should_exit`` to stop it) and its task.
    """
    if limits is None:
        limits = ConnectionLimits(30.0, connection_cap(0, descriptor_limit()))
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                       http=bounded_protocol(limits),
                                       backlog=ACCEPT_BACKLOG,
                                       # no WebSocket routes; an upgrade would hand the
                                       # connection to a protocol outside the bounds
                                       ws="none"))
    return uv, asyncio.ensure_future(_serve_http(uv, sockets))


async def _serve_http(uv: Any, sockets: list[socket.socket]) -> None:
    """``uv.serve``, with uvicorn's ``sys.exit`` on a failed start-up turned into a return
    (:func:`serve` then reports a start-up error instead of the process dying mid-start)."""
    try:
        await uv.serve(sockets=sockets)
    except SystemExit as exc:
        log.error("[Server] the dashboard exited (uvicorn status %s)", exc.code)


def http_limits(cfg: ServerConfig) -> ConnectionLimits:
    """The dashboard's connection bounds from ``cfg`` (:class:`StartupError` if the cap
    leaves too few descriptors, or the TLS files do not load)."""
    try:
        cap = connection_cap(cfg.http_max_connections, descriptor_limit())
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    ctx = None
    if cfg.http_tls and cfg.tls_cert and cfg.tls_key:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)  # check_tls has read them
    return ConnectionLimits(cfg.http_header_timeout, cap, ctx)


async def serve(
    cfg: ServerConfig,
    http_app_factory: HttpAppFactory | None = None,
    ready: Callable[[RunningServer], None] | None = None,
) -> None:
    """Run until the default job is done and drained (plus ``cfg.linger`` seconds; forever
    if negative) and no created job is queued or running, or a signal (with ``--rounds 0``,
    the first signal ends the default job instead:
    :meth:`~rpsagg_server.rounds.engine.RoundEngine.stop_job`). Without a default job
    (``--no-default-job``): until a signal.

    The drained job end: once the job is done (or failed), every read keeps answering
    ``job_done`` until each joined client has been told so, or ``cfg.drain`` seconds have
    passed; then ``cfg.linger`` seconds; then health ``NOT_SERVING`` and a stop in which calls
    in flight get :data:`STOP_GRACE` seconds.

    ``http_app_factory(host, admin_tokens, http_tokens)`` returns an ASGI app served by
    uvicorn on ``cfg.http_port`` at every address of ``cfg.http_host`` (default 127.0.0.1
    and ::1), on the same event loop (the dashboard); it makes the bearer-token check with
    ``http_tokens`` (``cfg.http_tokens``, and the admin tokens) on the paths it finally
    serves. Over TLS with ``cfg.http_tls``, its connections bounded
    (``cfg.http_header_timeout``, ``cfg.http_max_connections``). Its sockets are bound
    first, so a port in use is a start-up error.
    """
    socks: list[socket.socket] = []
    http_tokens = limits = admin_tokens = None
    if http_app_factory is not None and cfg.http_port:
        check_tls(cfg)
        limits = http_limits(cfg)
        http_tokens = load_http_tokens(cfg)
        admin_tokens = load_admin_tokens(cfg)
        if http_tokens is not None and admin_tokens is not None:
            http_tokens = http_tokens | admin_tokens  # an admin token reads the data too
        socks = bind_http_sockets(cfg.http_host, cfg.http_port)
    try:
        running, _ = await create_server(cfg)
    except BaseException:
        for s in socks:
            s.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        """--rounds 0 (until stopped): the first signal ends the job cleanly after the
        current round (then drain and linger as at any job's end); else, or again: stop."""
        default = running.host.default()
        engine = None if default is None else default.engine
        if (engine is not None and cfg.rounds == 0 and not engine.job_done
                and not engine.progress.stopping):
            log.info("[Server] signal: ending the job after the current round (signal again "
                     "to stop at once)")
            engine.stop_job()
        else:
            stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal)
    http_task = None
    if socks and http_app_factory is not None:
        app = http_app_factory(running.host, admin_tokens, http_tokens)
        registry = running.host.registry  # what the dashboard's /metrics exposes
        if limits is not None:
            registry.register(ConnectionsCollector(limits))
        if running.guard is not None:
            registry.register(GuardCollector(running.guard))
        uv, http_task = start_http(app, socks, limits)
        scheme = "https" if limits is not None and limits.ssl_context is not None else "http"
        # the port file (and ``ready``) mean "serving": the dashboard must answer by then
        end = loop.time() + DASHBOARD_START_S
        while not uv.started and not http_task.done() and loop.time() < end:
            await asyncio.sleep(0.01)
        if not uv.started:  # no port file: it promises that both servers accept
            where = ", ".join(_url(s.getsockname(), scheme) for s in socks)
            uv.should_exit = True
            http_task.cancel()
            with contextlib.suppress(BaseException):
                await http_task
            for s in socks:
                s.close()
            await running.stop()
            raise StartupError(f"the dashboard did not start on {where} within "
                               f"{DASHBOARD_START_S:g} s (see the log above)")
        else:
            log.info("[Server] dashboard on %s%s", ", ".join(
                _url(s.getsockname(), scheme) for s in socks),
                " (bearer tokens for /api and /metrics)" if http_tokens is not None else "")
    eventloop.freeze_startup_heap()  # started: the per-call garbage is all that is left
    _write_port(cfg, running.port)
    if ready is not None:
        ready(running)

    async def until_done() -> None:
        try:  # a --d 0 job opens once its first join said d
            default = await running.host.wait_default()
        except CANNOT_OPEN as exc:
            log.error("[Server] the default job could not start: %s; stopping", exc)
            stop.set()
            return
        if default is None:
            return  # a standing service without a default job: until a signal
        engine = default.engine
        await engine.done_event.wait()
        started = time.monotonic()
        if await engine.results.drain(cfg.drain):
            log.info("[Server] job end drained: all %d joined clients were told (%.1f s)",
                     len(engine.clients), time.monotonic() - started)
        else:
            missing = engine.results.undrained()
            log.warning("[Server] job end: drain bound of %.1f s passed; %d joined client(s) "
                        "were not told: %s", cfg.drain, len(missing),
                        ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))
        if cfg.linger >= 0:
            await asyncio.sleep(cfg.linger)
            if running.host.running() or any(
                    j["state"] == JobState.QUEUED for j in running.host.list()):
                log.info("[Server] the default job is over; serving until the created jobs "
                         "end: %s", ", ".join(running.host.running()))
                await running.host.wait_idle()
            stop.set()

    done_task = asyncio.ensure_future(until_done())
    try:
        await stop.wait()
    finally:
        done_task.cancel()
        if http_task is not None:
            uv.should_exit = True  # let the app's lifespan shut down
            try:
                await asyncio.wait_for(http_task, 5.0)
            except (TimeoutError, asyncio.CancelledError):
                http_task.cancel()
        for s in socks:
            s.close()
        log.info("[Server] stopping")
        await running.stop()


def _write_port(cfg: ServerConfig, port: int) -> None:
    """Write the bound gRPC port to ``--port-file`` atomically (once serving)."""
    if cfg.port_file:
        tmp = Path(cfg.port_file + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(cfg.port_file)


def _url(addr: tuple[Any, ...], scheme: str = "http") -> str:
    host = str(addr[0])
    return f"{scheme}://[{host}]:{addr[1]}" if ":" in host else f"{scheme}://{host}:{addr[1]}"


def configure_logging() -> None:
    """The project's log handler, level from ``RPSAGG_LOG_LEVEL`` (default INFO)."""
    level = os.environ.get("RPSAGG_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpsagg-server``: a user error is one line on stderr and exit 2."""
    try:
        cfg = load_config(argv)
    except (ValueError, OSError) as exc:
        return _user_error(exc)
    configure_logging()
    try:
        eventloop.run(serve(cfg, http_app_factory=create_standing_app), cfg.event_loop)
    except (StartupError, ValueError) as exc:
        return _user_error(exc)
    return 0


def _user_error(exc: BaseException) -> int:
    print(f"rpsagg-server: {exc}", file=sys.stderr)
    return 2

