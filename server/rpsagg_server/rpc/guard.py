"""The gRPC port's connection bounds, and room for fresh clients while a flood holds it.

gRPC's own bounds (``grpc.max_allowed_incoming_connections``, the handshake and idle
deadlines: :func:`grpc_connection_options`, with the cap from :func:`server_budget`) keep a
flood from taking the process's descriptors, but a full cap refuses every new connection
until a deadline frees a place: a Join during a flood of 1,000 silent sockets waited for the
5 s handshake deadline, and for the 10 s idle deadline (17 s with the client's backoff) when
the flood completed the HTTP/2 handshake. gRPC has no displacement, so
:class:`ConnectionGuard` adds it:

* an interceptor records, per peer address, the calls in flight and when the last one began;
* every :data:`SCAN_S` s, when the process holds more descriptors than the cap less the
  headroom (never in ordinary operation), a scan of ``/proc/self/fd`` finds the gRPC port's
  connections; while more than ``cap - headroom`` are open, the excess (down to
  ``cap - 2 * headroom``) is **displaced**: shut down (``shutdown(2)`` on a duplicate of
  gRPC's descriptor; gRPC then closes its own), the connections that never made a call
  first, oldest first, then the ones whose last call began longest ago. A connection with a
  call in flight is never displaced, nor one younger than :data:`MIN_AGE_S` (a fresh client
  in its handshake);
* so a fresh client finds a place at once, and a client whose idle connection was displaced
  reconnects on its next call (a gRPC channel does so by itself).

The headroom is an eighth of the cap (at least :data:`MIN_HEADROOM`). Displaced connections
are counted in ``rpsagg_grpc_connections_displaced_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from rpsagg_server.domain.errors import StartupError
from rpsagg_server.jobs.endedjobs import READERS
from rpsagg_server.rpc.refusals import stream_items
from rpsagg_server.settings.descriptors import DescriptorBudget, descriptor_budget, descriptor_limit
from rpsagg_server.settings.serverconfig import ServerConfig

log = logging.getLogger("rpsagg.server")

#: seconds between the guard's checks of the descriptor count
SCAN_S = 0.1
#: the headroom kept free below the cap: cap // HEADROOM_FRACTION, at least MIN_HEADROOM
HEADROOM_FRACTION = 8
MIN_HEADROOM = 4
#: a connection younger than this (seconds since a scan first saw it) is never displaced
MIN_AGE_S = 0.25
#: a displacement episode is logged once, then at most every this many seconds
LOG_EVERY_S = 10.0

Peer = tuple[str, int]


#: a connection is closed at most this long after --grpc-idle-timeout closes it gracefully
#: (GOAWAY), and calls in flight when it reaches its maximum age get this long to finish
GRPC_AGE_GRACE_S = 30.0
#: a connection is recycled (GOAWAY, the client reconnects) after this long, so none is
#: held forever by a client that keeps a stream open
GRPC_MAX_AGE_S = 3600.0


def grpc_connection_options(cfg: ServerConfig, cap: int) -> list[tuple[str, int]]:
    """gRPC core's own bounds on the port's connections (channel arguments).

    ``grpc.max_allowed_incoming_connections``: one connection beyond ``cap`` is closed
    right after accept; ``grpc.server_handshake_timeout_ms``: the TLS handshake and the
    client's HTTP/2 preface and SETTINGS must arrive within ``--grpc-handshake-timeout``
    (a socket that sends nothing, or only the preface, is closed then);
    ``grpc.max_connection_idle_ms``: a connection with no call in flight is closed after
    ``--grpc-idle-timeout``; ``grpc.max_connection_age_ms``: every connection is recycled
    after :data:`GRPC_MAX_AGE_S` (calls in flight get :data:`GRPC_AGE_GRACE_S`).
    """
    return [
        ("grpc.max_allowed_incoming_connections", cap),
        ("grpc.server_handshake_timeout_ms", int(cfg.grpc_handshake_timeout * 1000)),
        ("grpc.max_connection_idle_ms", int(cfg.grpc_idle_timeout * 1000)),
        ("grpc.max_connection_age_ms", int(GRPC_MAX_AGE_S * 1000)),
        ("grpc.max_connection_age_grace_ms", int(GRPC_AGE_GRACE_S * 1000)),
    ]


def server_budget(cfg: ServerConfig) -> DescriptorBudget:
    """The descriptor budget of ``cfg``'s two ports and of the jobs open at once at most
    (``--max-jobs`` and the ended ones open to be read; :class:`StartupError` if they do
    not fit in the limit)."""
    try:
        return descriptor_budget(cfg.http_max_connections if cfg.http_port else None,
                                 cfg.grpc_max_connections, descriptor_limit(),
                                 (cfg.max_jobs, READERS))
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def parse_peer(peer: str) -> Peer | None:
    """``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``) as (host, port), IPv4
    addresses mapped into IPv6 given as IPv4; None for other kinds (``unix:``)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return _host(host.strip("[]")), int(port)
    except ValueError:
        return None


def _host(host: str) -> str:
    host = host.split("%", 1)[0]
    return host[7:] if host.lower().startswith("::ffff:") and "." in host else host


@dataclass
class _Activity:
    inflight: int = 0
    last_call: float = 0.0


@dataclass
class ConnectionGuard:
    """Displaces the gRPC port's least active connections when its cap is nearly full.

    Parameters
    ----------
    port : int
        The gRPC port (its accepted connections have it as their local port).
    cap : int
        gRPC's connection cap (``grpc.max_allowed_incoming_connections``).
    """

    port: int
    cap: int
    displaced: int = 0
    activity: dict[Peer, _Activity] = field(default_factory=dict)
    first_seen: dict[Peer, float] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _logged: float = -LOG_EVERY_S

    @property
    def headroom(self) -> int:
        """Places kept free below the cap."""
        return max(MIN_HEADROOM, self.cap // HEADROOM_FRACTION)

    # -- the calls ------------------------------------------------------------------------
    def interceptor(self) -> grpc.aio.ServerInterceptor:
        """The interceptor that records each peer's calls (put it first)."""
        return _ActivityInterceptor(self)

    def call_started(self, peer: Peer | None) -> None:
        """A call from ``peer`` began."""
        if peer is not None:
            a = self.activity.setdefault(peer, _Activity())
            a.inflight += 1
            a.last_call = time.monotonic()

    def call_ended(self, peer: Peer | None) -> None:
        """A call from ``peer`` ended."""
        a = None if peer is None else self.activity.get(peer)
        if a is not None:
            a.inflight = max(0, a.inflight - 1)

    # -- the scans ------------------------------------------------------------------------
    def start(self) -> None:
        """Start checking (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop checking."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SCAN_S)
            try:
                if len(os.listdir("/proc/self/fd")) <= self.cap - self.headroom:
                    continue
                conns = await asyncio.to_thread(self.connections)
                victims = self.choose(conns, time.monotonic())
                if victims:
                    done = await asyncio.to_thread(self.displace, victims)
                    self.displaced += done
                    now = time.monotonic()
                    if now - self._logged >= LOG_EVERY_S:
                        self._logged = now
                        log.warning("[Server] gRPC connections near the cap (%d open, cap "
                                    "%d): displaced %d without a call in flight (%d so far)",
                                    len(conns), self.cap, done, self.displaced)
            except asyncio.CancelledError:
                raise
            except Exception:  # a scan must never end the server
                log.exception("[Server] gRPC connection guard")

    def connections(self) -> dict[int, Peer]:
        """The gRPC port's open connections: descriptor -> peer address."""
        out: dict[int, Peer] = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                fd = int(name)
                if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    continue
                peer = _peer_of(fd, self.port)
            except (OSError, ValueError):
                continue
            if peer is not None:
                out[fd] = peer
        return out

    def choose(self, conns: dict[int, Peer], now: float) -> list[tuple[int, Peer]]:
        """Which connections to displace (and forget what is gone)."""
        live = set(conns.values())
        for peer in list(self.first_seen):
            if peer not in live:
                del self.first_seen[peer]
        for peer in list(self.activity):
            if peer not in live and self.activity[peer].inflight == 0:
                del self.activity[peer]
        for peer in live:
            self.first_seen.setdefault(peer, now)
        if len(conns) <= self.cap - self.headroom:
            return []
        excess = len(conns) - (self.cap - 2 * self.headroom)
        idle = []
        for fd, peer in conns.items():
            a = self.activity.get(peer)
            if (a is not None and a.inflight) or now - self.first_seen[peer] < MIN_AGE_S:
                continue
            # never called first (oldest first), then the longest since a call began
            key = (0, self.first_seen[peer]) if a is None else (1, a.last_call)
            idle.append((key, fd, peer))
        idle.sort()
        return [(fd, peer) for _, fd, peer in idle[:excess]]

    def displace(self, victims: Iterable[tuple[int, Peer]]) -> int:
        """Shut the connections down (each checked again to be the same peer: a
        descriptor number may have been reused since the scan); returns how many."""
        done = 0
        for fd, peer in victims:
            try:
                dup = os.dup(fd)
            except OSError:
                continue
            try:
                s = socket.socket(fileno=dup)
            except OSError:
                os.close(dup)
                continue
            with s:
                try:
                    if _addr(s.getsockname())[1] != self.port or _addr(s.getpeername()) != peer:
                        continue
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    continue
            self.first_seen.pop(peer, None)
            done += 1
        return done


def _addr(a: Any) -> Peer:
    if not isinstance(a, tuple):
        raise OSError("not an internet socket")
    return _host(str(a[0])), int(a[1])


def _peer_of(fd: int, port: int) -> Peer | None:
    """The peer of a connected TCP socket whose local port is ``port`` (None otherwise)."""
    dup = os.dup(fd)
    try:
        s = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    with s:
        if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
            return None
        try:
            if _addr(s.getsockname())[1] != port:
                return None
            return _addr(s.getpeername())
        except OSError:  # the listener, or not connected
            return None


class _ActivityInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails],
                                     Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        guard = self.guard
        if handler.unary_unary is not None:
            behavior = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                peer = parse_peer(context.peer())
                guard.call_started(peer)
                try:
                    res = behavior(request, context)
                    return await res if inspect.isawaitable(res) else res
                finally:
                    guard.call_ended(peer)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            stream_behavior = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[Any]:
                peer = parse_peer(context.peer())
                guard.call_started(peer)
                try:
                    async for item in stream_items(stream_behavior(request, context)):
                        yield item
                finally:
                    guard.call_ended(peer)

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler  # client streams: not used by these services


class GuardCollector(Collector):
    """``rpsagg_grpc_connections_displaced_total`` for ``/metrics``."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def describe(self) -> Iterable[Metric]:
        """The families (their names make a registry refuse a second copy)."""
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        """Yield ``rpsagg_grpc_connections_displaced_total`` (counter)."""
        yield CounterMetricFamily(
            "rpsagg_grpc_connections_displaced",
            "gRPC connections without a call in flight shut down to make room near the cap",
            value=self.guard.displaced)
