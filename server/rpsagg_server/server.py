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
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from rpsagg.v1 import serde
from rpsagg_server.config import ServerConfig, load_config
from rpsagg_server.http import create_app
from rpsagg_server.rounds import RoundEngine
from rpsagg_server.servicer import AggregationServicer, TokenBook
from rpsagg_server.state import ServerState
from rpsagg_server.store import Store

log = logging.getLogger("rpsagg.server")
HttpAppFactory = Callable[[ServerState], Any]


def max_request_bytes(cfg: ServerConfig, m: int) -> int:
    """Request size limit: m vectors of values (+ indices) (+ float64 reference), plus 25% and
    4 KiB of slack, so a slightly wrong submission still reaches validation and gets a
    precise INVALID_ARGUMENT, while anything far larger is refused by gRPC with
    RESOURCE_EXHAUSTED before it is buffered or parsed.
    """
    values = cfg.d if cfg.estimator in ("full", "rand-k-wangni") else cfg.k
    indices = values if cfg.estimator in ("rand-k-wangni", "induced") else 0
    reference = 8 * cfg.d if cfg.eval else 0
    per_vector = 4 * values + 4 * indices + reference + 32
    return int(1.25 * (m * per_vector + 1024)) + 4096


@dataclass
class RunningServer:
    """A started server: the gRPC server, its engine, state, store and health servicer."""

    grpc_server: grpc.aio.Server
    engine: RoundEngine
    state: ServerState
    store: Store
    health: HealthServicer
    port: int
    serving: bool = True

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving (in-flight calls get ``grace`` seconds) and close the database."""
        self.serving = False
        await self.health.enter_graceful_shutdown()
        self.engine.end_watches()
        await asyncio.sleep(0)  # let the streams finish
        await self.grpc_server.stop(grace)
        await self.engine.close()
        self.store.close()


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

    Parameters
    ----------
    cfg : ServerConfig
        ``grpc_port=0`` binds any free port (tests).
    """
    store = Store(cfg.db)
    state = ServerState(cfg.public_dict())
    engine = RoundEngine(cfg, store, state)
    try:
        await engine.start()
    except BaseException:
        store.close()
        raise
    tokens = TokenBook.from_file(cfg.tokens) if cfg.tokens else None
    limit = max_request_bytes(cfg, engine.m)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ])
    server.add_generic_rpc_handlers((AggregationServicer(engine, tokens).generic_handler(),))
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    address = f"{cfg.host}:{cfg.grpc_port}"
    creds = _credentials(cfg)
    port = (server.add_secure_port(address, creds) if creds is not None
            else server.add_insecure_port(address))
    await server.start()
    for name in ("", serde.SERVICE):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("[Server] listening on %s:%d (%s), max request %d bytes", cfg.host, port,
             "TLS" if creds else "insecure", limit)
    running = RunningServer(server, engine, state, store, health, port)
    state._add_check("database", store.writable)  # the last transaction (or heartbeat) committed
    state._add_check("grpc", lambda: running.serving)
    return running, port


async def serve(
    cfg: ServerConfig,
    http_app_factory: HttpAppFactory | None = None,
    ready: Callable[[RunningServer], None] | None = None,
) -> None:
    """Run until the job is done (plus ``cfg.linger`` seconds; forever if negative) or a signal.

    ``http_app_factory(state)`` returns an ASGI app served by uvicorn on ``cfg.http_port``
    on the same event loop (the dashboard).
    """
    running, _ = await create_server(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    http_task = None
    if http_app_factory is not None and cfg.http_port:
        import uvicorn  # optional: the dashboard's dependency

        app = http_app_factory(running.state)
        uv = uvicorn.Server(uvicorn.Config(app, host=cfg.host.strip("[]"), port=cfg.http_port,
                                           log_level="warning", lifespan="on"))
        http_task = asyncio.ensure_future(uv.serve())
    if cfg.port_file:
        tmp = Path(cfg.port_file + ".tmp")
        tmp.write_text(f"{running.port}\n")
        tmp.replace(cfg.port_file)
    if ready is not None:
        ready(running)

    async def until_done() -> None:
        await running.engine.done_event.wait()
        if cfg.linger >= 0:
            await asyncio.sleep(cfg.linger)
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
        log.info("[Server] stopping")
        await running.stop()


def configure_logging() -> None:
    """The project's log handler, level from ``RPSAGG_LOG_LEVEL`` (default INFO)."""
    level = os.environ.get("RPSAGG_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")


def dashboard_factory() -> HttpAppFactory | None:
    """The dashboard's ``rpsagg_server.http.create_app``, or None when it cannot be imported."""
    try:
        from rpsagg_server.http import create_app
    except ImportError as exc:
        log.warning("[Server] no dashboard (%s); --http-port is ignored", exc)
        return None
    return create_app


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpsagg-server``."""
    configure_logging()
    try:
        cfg = load_config(argv)
    except (ValueError, OSError) as exc:
        print(f"rpsagg-server: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(cfg, http_app_factory=create_app))
    except ValueError as exc:
        print(f"rpsagg-server: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
