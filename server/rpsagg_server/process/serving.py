"""The serve loop of a process (:func:`serve`): the gRPC server and the dashboard (uvicorn,
its connections bounded) on one event loop, the signals, the drained job end and the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from rpsagg_server.domain.errors import StartupError
from rpsagg_server.domain.jobstate import JobState
from rpsagg_server.http.auth import HttpTokens
from rpsagg_server.http.connections import (
    ConnectionLimits,
    ConnectionsCollector,
    bounded_protocol,
)
from rpsagg_server.jobs.jobruntime import CANNOT_OPEN
from rpsagg_server.process import eventloop
from rpsagg_server.process.grpcserver import RunningServer, create_server
from rpsagg_server.process.startup import (
    bind_http_sockets,
    check_tls,
    load_admin_tokens,
    load_http_tokens,
)
from rpsagg_server.rpc.guard import GuardCollector
from rpsagg_server.settings.descriptors import ACCEPT_BACKLOG, connection_cap, descriptor_limit
from rpsagg_server.settings.serverconfig import ServerConfig

log = logging.getLogger("rpsagg.server")
#: builds the dashboard's ASGI app of a server's jobs (and, given, its admin tokens)
HttpAppFactory = Callable[..., Any]
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


@dataclass(frozen=True)
class HttpPlan:
    """What the dashboard serves with, read and bound before the server starts.

    Attributes
    ----------
    sockets : list of socket
        Its bound sockets (none: no dashboard).
    limits : ConnectionLimits or None
        Its connection bounds (:func:`http_limits`).
    http_tokens, admin_tokens : HttpTokens or None
        Who may read (the admin tokens included), who may create and cancel jobs.
    """

    sockets: list[socket.socket] = field(default_factory=list)
    limits: ConnectionLimits | None = None
    http_tokens: HttpTokens | None = None
    admin_tokens: HttpTokens | None = None


def plan_http(cfg: ServerConfig, http_app_factory: HttpAppFactory | None) -> HttpPlan:
    """The dashboard's TLS files checked, bounds and tokens read and sockets bound (a port
    in use is a start-up error); an empty plan without a factory or ``--http-port``."""
    if http_app_factory is None or not cfg.http_port:
        return HttpPlan()
    check_tls(cfg)
    limits = http_limits(cfg)
    http_tokens = load_http_tokens(cfg)
    admin_tokens = load_admin_tokens(cfg)
    if http_tokens is not None and admin_tokens is not None:
        http_tokens = http_tokens | admin_tokens  # an admin token reads the data too
    return HttpPlan(bind_http_sockets(cfg.http_host, cfg.http_port), limits, http_tokens,
                    admin_tokens)


async def start_dashboard(running: RunningServer, app: Any,
                          plan: HttpPlan) -> tuple[Any, asyncio.Future[None]]:
    """Serve ``app`` on ``plan``'s sockets once it accepts connections (its connections' and
    the gRPC guard's metrics added to the server's registry); returns what
    :func:`start_http` does. A dashboard that does not start within
    :data:`DASHBOARD_START_S` stops the server and raises :class:`StartupError`."""
    registry = running.host.registry  # what the dashboard's /metrics exposes
    if plan.limits is not None:
        registry.register(ConnectionsCollector(plan.limits))
    if running.guard is not None:
        registry.register(GuardCollector(running.guard))
    socks = plan.sockets
    uv, http_task = start_http(app, socks, plan.limits)
    scheme = ("https" if plan.limits is not None and plan.limits.ssl_context is not None
              else "http")
    # the port file (and ``ready``) mean "serving": the dashboard must answer by then
    loop = asyncio.get_running_loop()
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
    log.info("[Server] dashboard on %s%s", ", ".join(
        _url(s.getsockname(), scheme) for s in socks),
        " (bearer tokens for /api and /metrics)" if plan.http_tokens is not None else "")
    return uv, http_task


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
    in flight get :data:`~rpsagg_server.process.grpcserver.STOP_GRACE` seconds.

    ``http_app_factory(host, admin_tokens, http_tokens)`` returns an ASGI app served by
    uvicorn on ``cfg.http_port`` at every address of ``cfg.http_host`` (default 127.0.0.1
    and ::1), on the same event loop (the dashboard); it makes the bearer-token check with
    ``http_tokens`` (``cfg.http_tokens``, and the admin tokens) on the paths it finally
    serves. Over TLS with ``cfg.http_tls``, its connections bounded
    (``cfg.http_header_timeout``, ``cfg.http_max_connections``). Its sockets are bound
    first, so a port in use is a start-up error.
    """
    plan = plan_http(cfg, http_app_factory)
    try:
        running, _ = await create_server(cfg)
    except BaseException:
        for s in plan.sockets:
            s.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    on_signal = _on_signal(cfg, running, stop)
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal)
    uv: Any = None
    http_task = None
    if plan.sockets and http_app_factory is not None:
        app = http_app_factory(running.host, plan.admin_tokens, plan.http_tokens)
        uv, http_task = await start_dashboard(running, app, plan)
    eventloop.freeze_startup_heap()  # started: the per-call garbage is all that is left
    _write_port(cfg, running.port)
    if ready is not None:
        ready(running)
    done_task = asyncio.ensure_future(_until_done(cfg, running, stop))
    try:
        await stop.wait()
    finally:
        done_task.cancel()
        await _stop(running, plan, uv, http_task)


async def _stop(running: RunningServer, plan: HttpPlan, uv: Any,
                http_task: asyncio.Future[None] | None) -> None:
    """Stop the dashboard (``uv`` and its task, if started: 5 s for its app's lifespan to
    shut down), close its sockets, then stop the server."""
    if http_task is not None:
        uv.should_exit = True  # let the app's lifespan shut down
        try:
            await asyncio.wait_for(http_task, 5.0)
        except (TimeoutError, asyncio.CancelledError):
            http_task.cancel()
    for s in plan.sockets:
        s.close()
    log.info("[Server] stopping")
    await running.stop()


def _on_signal(cfg: ServerConfig, running: RunningServer,
               stop: asyncio.Event) -> Callable[[], None]:
    """The handler of SIGINT and SIGTERM: sets ``stop``, except as below."""

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

    return on_signal


async def _until_done(cfg: ServerConfig, running: RunningServer, stop: asyncio.Event) -> None:
    """Set ``stop`` once the default job is done and drained, ``cfg.linger`` has passed and
    no created job is queued or running (never without a default job)."""
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


def _write_port(cfg: ServerConfig, port: int) -> None:
    """Write the bound gRPC port to ``--port-file`` atomically (once serving)."""
    if cfg.port_file:
        tmp = Path(cfg.port_file + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(cfg.port_file)


def _url(addr: tuple[Any, ...], scheme: str = "http") -> str:
    host = str(addr[0])
    return f"{scheme}://[{host}]:{addr[1]}" if ":" in host else f"{scheme}://{host}:{addr[1]}"
