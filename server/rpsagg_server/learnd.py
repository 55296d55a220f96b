"""The job's d from the first join: ``rpsagg-server --d 0`` (with ``--data external``).

A server that is not told d cannot build its job (the estimator, the wire profile, the
request size limit and beta all depend on it), so it starts in two steps:

1. It serves a small stand-in of the Aggregation service on the job's gRPC address, with
   the same TLS and tokens: GetRound describes the job with ``d = 0`` and no round; the
   first Join that says its d (``JoinRequest.d``, which ``rpsagg-client --vectors`` sends)
   fixes d: it is committed to the database (meta ``learned_d``) and that join, like every
   call from then on, is answered UNAVAILABLE ("the job starts with d = ..."), which
   clients retry. A join without d, with d below k or with d above ``--max-d`` (the
   largest d the server may allocate for) is refused and fixes nothing; the other calls
   are UNAVAILABLE while the job waits for its d. With ``--tokens`` only an authenticated
   join reaches this (the stand-in has the job's token interceptor).
2. The stand-in stops and the job's own server (:func:`~rpsagg_server.server.create_server`)
   starts on the same port with that d; the retried calls reach it. From then on the job
   is a job like any other, d fixed: a join whose d differs is INVALID_ARGUMENT.

A restart on the same database reads ``learned_d`` back and starts the job at once. The
dashboard starts with the job (step 2).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, NoReturn

import grpc

from rpsagg.tasks import make_task
from rpsagg_server.auth import TokenBook, TokenInterceptor, authorize
from rpsagg_server.config import BYTES_PER_COORDINATE, ServerConfig, memory_limit
from rpsagg_server.errors import InvalidRequest, NotReady, PreconditionFailed
from rpsagg_server.grpcerrors import RefusalInterceptor
from rpsagg_server.grpcguard import ConnectionGuard, grpc_connection_options, server_budget
from rpsagg_server.jobs import job_id
from rpsagg_server.live import check_client_id
from rpsagg_server.results import announced_k
from rpsagg_server.startup import (
    StartupError,
    bind_grpc,
    check_database,
    check_tls,
    check_tokens,
    probe_grpc_address,
)
from rpsagg_server.store import Store
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.messages import RoundState
from rpsagg_wire.v1.serde import RoundInfo

log = logging.getLogger("rpsagg.server")
LEARNED_KEY = "learned_d"


class _FirstJoin:
    """The stand-in service: GetRound with d = 0; the first Join with a d fixes it."""

    def __init__(self, cfg: ServerConfig, store: Store) -> None:
        self.cfg = cfg
        self.store = store
        self.learned: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._taking = False
        self.m = make_task(cfg.task, 1, cfg.params).m
        self.max_d = cfg.d_limit
        self.job_id = job_id(store)

    def _starting(self) -> NotReady:
        if self.learned.done():
            return NotReady(f"the job starts with d = {self.learned.result()}; retry")
        return NotReady("the job has not started: it takes d from the first client's join")

    async def Join(self, raw: bytes, context: Any) -> NoReturn:
        """The first join that says its d fixes it; every join is then refused (retried)."""
        try:
            req = serde.parse_request("Join", raw)
        except serde.WireError as exc:
            raise InvalidRequest(str(exc)) from None
        check_client_id(req.client_id)
        authorize(req.client_id)
        if self._taking or self.learned.done():
            raise self._starting()
        if req.d == 0:
            raise PreconditionFailed("this job takes d from the first client's join, and this "
                                     "join says none (JoinRequest.d; rpsagg-client --vectors "
                                     "sends it)")
        if req.d < announced_k(self.cfg, self.cfg.k):
            raise InvalidRequest(f"d = {req.d} (client {req.client_id!r}) "
                                 f"is below the job's k = {self.cfg.k}")
        if req.d > self.max_d:
            raise InvalidRequest(f"d = {req.d} (client {req.client_id!r}) "
                                 f"is above the server's --max-d {self.max_d}")
        self._taking = True
        try:  # durable before anyone is told: a restart keeps this d
            await asyncio.to_thread(self.store.put_meta, LEARNED_KEY, str(req.d))
        finally:
            self._taking = False
        log.info("[Server] d = %d from client %s's join", req.d, req.client_id)
        self.learned.set_result(req.d)
        raise self._starting()

    async def GetRound(self, raw: bytes, context: Any) -> RoundInfo:
        c = self.cfg
        return RoundInfo(round_id=0, nonce=0, scheme=c.estimator, n=c.n,
                         k=announced_k(c, c.k), d=0,
                         transform="", task=c.task, m=self.m, global_state=None,
                         state=RoundState.UNSPECIFIED, deadline_unix_ms=0, eval=c.eval,
                         job_done=False, task_step=0, total_rounds=c.rounds,
                         value_bits=c.fixed_value_bits, bits=c.bits, job_id=self.job_id)

    async def unavailable(self, raw: bytes, context: Any) -> NoReturn:
        """Any other call: the job is not ready yet."""
        raise self._starting()

    async def unavailable_stream(self, raw: bytes, context: Any) -> AsyncIterator[Any]:
        """WatchRounds: the job is not ready yet."""
        raise self._starting()
        yield  # pragma: no cover - makes this a stream's generator

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(name: str, fn: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=None, response_serializer=serde.reply_serializer(name))

        return grpc.method_handlers_generic_handler(serde.SERVICE, {
            "Join": unary("Join", self.Join),
            "GetRound": unary("GetRound", self.GetRound),
            "Submit": unary("Submit", self.unavailable),
            "GetResult": unary("GetResult", self.unavailable),
            "WatchRounds": grpc.unary_stream_rpc_method_handler(
                self.unavailable_stream, request_deserializer=None,
                response_serializer=serde.reply_serializer("WatchRounds")),
        })


async def _released(host: str, port: int, timeout: float = 10.0) -> None:
    """Wait (at most ``timeout`` seconds) until the stopped stand-in's port can be bound
    again: gRPC closes its listener after ``stop`` returns. Still busy after that, the job's
    server reports the port in use."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while probe_grpc_address(host, port) is not None and loop.time() < end:
        await asyncio.sleep(0.05)


async def learn_d(cfg: ServerConfig,
                  credentials: Callable[[], grpc.ServerCredentials | None],
                  serving: Callable[[int], None]) -> ServerConfig | None:
    """``cfg`` with the job's d: as given, as stored by an earlier start, or from the first
    join (step 1 of the module docstring); None when a signal stopped the wait.

    ``credentials()`` gives the TLS credentials (called after the start-up checks of the TLS
    files); ``serving(port)`` is called once the stand-in serves (the server writes its port
    file).
    The returned configuration has the port the stand-in bound (``--grpc-port 0``: the one
    it picked), for the job's server to bind again.
    """
    if cfg.d:
        return cfg
    check_tls(cfg)
    check_tokens(cfg)
    check_database(cfg)
    store = Store(cfg.db)
    try:
        saved = store.get_meta(LEARNED_KEY)
        if saved is not None:
            if int(saved) > cfg.d_limit:
                raise StartupError(f"--db {cfg.db}: its job's d = {saved} (from its first "
                                   f"join) is above --max-d {cfg.d_limit}")
            log.info("[Server] d = %s, learned from the first join of this job", saved)
            return replace(cfg, d=int(saved))
        tokens = TokenBook.from_file(cfg.tokens) if cfg.tokens else None
        # the job's own connection bounds and displacement (a flood before the first join
        # must not keep the first client out either)
        budget = server_budget(cfg)
        guard = ConnectionGuard(0, budget.grpc)
        interceptors: list[grpc.aio.ServerInterceptor] = [guard.interceptor(),
                                                          RefusalInterceptor()]
        if tokens is not None:
            interceptors.append(TokenInterceptor(tokens))
        server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.so_reuseport", 0), *grpc_connection_options(cfg, budget.grpc)])
        first = _FirstJoin(cfg, store)
        server.add_generic_rpc_handlers((first.handler(),))
        port = guard.port = bind_grpc(server, cfg.host, cfg.grpc_port, credentials())
        await server.start()
        guard.start()
        log.info("[Server] listening on %s:%d; the job takes d from the first client's join "
                 "(at most --max-d %d%s)", cfg.host, port, first.max_d,
                 "" if cfg.max_d else f", automatic: {BYTES_PER_COORDINATE} bytes per "
                 f"coordinate within a quarter of {memory_limit() / 2**30:.1f} GiB")
        serving(port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stopped = asyncio.ensure_future(stop.wait())
        try:
            waiting: set[asyncio.Future[Any]] = {first.learned, stopped}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            await guard.stop()
            await server.stop(0.5)
            await _released(cfg.host, port)
        if not first.learned.done():
            first.learned.cancel()
            return None
        return replace(cfg, d=first.learned.result(), grpc_port=port)
    finally:
        store.close()
