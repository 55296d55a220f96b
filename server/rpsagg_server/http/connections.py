"""The dashboard's connections, bounded: a deadline per request and a cap on their number.

uvicorn alone closes neither a connection whose request never completes (h11's keep-alive
timer starts only after a response) nor refuses connections beyond a number (its
``limit_concurrency`` answers 503 but keeps every socket open). The dashboard shares the
process, and so its file descriptors, with gRPC, so a slow-loris client opening connections
that never finish their headers would otherwise take the descriptors gRPC needs for new
clients. :func:`bounded_protocol` is uvicorn's h11 protocol with both bounds:

* **request deadline**: a request (TLS handshake, headers and body) must be complete
  ``request_timeout`` seconds after its first byte (after the connection opened, for the
  first request); otherwise the connection is closed, with a ``408`` when a request had
  begun and no response has started (a connection that sent nothing is just closed). Idle
  keep-alive connections are closed by uvicorn's own timer (5 s).
* **connection cap**: at most ``max_connections`` connections are open at once, counted
  from ``accept`` (TLS handshakes included) to close. One more is answered ``503`` (plain
  HTTP) or closed (TLS) at once, so it holds a descriptor for an instant only; the listen
  backlog, :data:`ACCEPT_BACKLOG`, bounds how many such instants overlap.
* **health probes**: beyond the cap, :data:`PROBE_RESERVE` more connections are taken, each
  only for a ``GET`` or ``HEAD`` of ``/healthz`` or ``/readyz``: its request line must
  arrive within :data:`PROBE_TIMEOUT` s; any other request is answered ``503`` and closed,
  and when the reserve is full a new connection displaces the oldest that has not yet sent
  its request line. A probe is answered, then its connection closed, so a full cap (or a
  flood that keeps reopening) never starves an orchestrator's probes.
* **write deadline**: a response the peer does not read (the write buffer above its high
  mark) must make progress within ``request_timeout`` s, else the connection is aborted.
* **closed means closed**: a connection being closed (at a deadline, at the keep-alive
  timeout, after ``connection: close``) is aborted once its buffered output is sent, or
  when that output stalls for :data:`CLOSE_GRACE` s; over TLS no connection waits for the
  peer's close_notify.
* **TLS** (``ssl_context``): the handshake runs inside the bounded connection
  (``loop.start_tls``), so it counts against the cap and the deadline.

:func:`connection_cap` derives the cap from the process's descriptor limit
(``RLIMIT_NOFILE``), keeping :data:`GRPC_RESERVE` descriptors for everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import h11
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from uvicorn.protocols.http.h11_impl import H11Protocol

#: connections beyond the cap for health probes (``/healthz``, ``/readyz``) only
PROBE_RESERVE = 16
#: seconds a probe connection has to send its request line (at most the request deadline)
PROBE_TIMEOUT = 2.0
#: a closing connection whose buffered output makes no progress for this long is aborted
CLOSE_GRACE = 1.0
_PROBES = (b"/healthz", b"/readyz")
_503 = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: 20\r\nconnection: close\r\n\r\ntoo many connections")


@dataclass
class ConnectionLimits:
    """The bounds and the live count shared by every connection of one server.

    Attributes
    ----------
    request_timeout : float
        Seconds a request has to be complete.
    max_connections : int
        Connections open at once, at most.
    ssl_context : ssl.SSLContext or None
        Serve HTTPS with it.
    open : int
        Connections open now (from accept to close), health probes' reserve excluded.
    probes : dict
        The reserve's connections now (insertion order: the oldest first), each True once
        its request line is a probe's.
    refused, timed_out, write_timed_out : int
        Connections refused at the cap (the reserve's included) / closed at the request
        deadline / aborted at the write deadline so far.
    """

    request_timeout: float
    max_connections: int
    ssl_context: ssl.SSLContext | None = None
    open: int = 0
    refused: int = 0
    timed_out: int = 0
    write_timed_out: int = 0
    probes: dict[Any, bool] = field(default_factory=dict)


class _BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a request deadline, a connection cap and in-band TLS."""

    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slot = False        # counted in limits.open
        self._serving = False     # H11Protocol.connection_made ran
        self._deadline: asyncio.TimerHandle | None = None
        self._raw: asyncio.BaseTransport | None = None
        self._early: list[bytes] = []  # TLS: request bytes that came before start_tls returned
        self._probe = False       # in the health probes' reserve
        self._line = b""          # a probe's bytes until its request line is complete
        self._write_deadline: asyncio.TimerHandle | None = None
        self._reaper: asyncio.TimerHandle | None = None
        self._lost = False

    # -- the count --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits = self.limits
        self._raw = transport
        if limits.open >= limits.max_connections:
            if not self._take_probe_slot():
                limits.refused += 1
                if limits.ssl_context is None:
                    with contextlib.suppress(Exception):
                        transport.write(_503)  # type: ignore[attr-defined]
                transport.close()
                return
        else:
            limits.open += 1
            self._slot = True
        self._arm()
        if limits.ssl_context is None:
            self._serve(transport)
        else:
            self._handshake(transport, limits.ssl_context)

    def _take_probe_slot(self) -> bool:
        """A place in the probes' reserve, displacing the oldest connection that has not
        sent a probe's request line when it is full (False: every place serves a probe)."""
        probes = self.limits.probes
        if len(probes) >= PROBE_RESERVE:
            oldest = next((p for p, known in probes.items() if not known), None)
            if oldest is None:
                return False
            oldest._refuse()
        probes[self] = False
        self._probe = True
        return True

    def _refuse(self) -> None:
        """Refuse a connection of the probes' reserve: 503 (if it can be written) and abort."""
        self.limits.refused += 1
        self.limits.probes.pop(self, None)
        self._probe = False
        self._disarm()
        transport = self.transport if self._serving else self._raw
        if transport is not None:
            if self._serving or self.limits.ssl_context is None:
                with contextlib.suppress(Exception):
                    transport.write(_503)  # type: ignore[attr-defined]
            self._close(transport)

    def _close(self, transport: asyncio.BaseTransport) -> None:
        """Close, and abort once the buffered output is out (or stalls): never wait for
        the peer (TLS close_notify)."""
        if isinstance(transport, _Closing):
            transport = transport._transport
        transport.close()
        self._reap(transport, -1)

    def _reap(self, transport: asyncio.BaseTransport, last: int) -> None:
        self._reaper = None
        if self._lost:
            return
        raw = self._raw if self._raw is not None else transport
        pending = 0
        for t in (transport, raw):
            with contextlib.suppress(Exception):
                pending += t.get_write_buffer_size()  # type: ignore[attr-defined]
        if pending == 0 or (last >= 0 and pending >= last):
            for t in (raw, transport):
                with contextlib.suppress(Exception):
                    t.abort()  # type: ignore[attr-defined]
            return
        self._reaper = self.loop.call_later(CLOSE_GRACE if last >= 0 else 0.05,
                                            self._reap, transport, pending)

    def _handshake(self, raw: asyncio.BaseTransport, ctx: ssl.SSLContext) -> None:
        # ``loop.start_tls`` puts the TLS layer between the socket and this protocol when it
        # starts; it must start now, before connection_made returns: uvloop starts reading
        # right after, and a ClientHello read by h11 would be lost to the handshake. So the
        # coroutine's first step runs here (an eager task; asyncio.eager_task_factory is
        # Python 3.12+) and the rest when the futures it awaits are done.
        coro = self.loop.start_tls(raw, self, ctx, server_side=True,  # type: ignore[arg-type]
                                   ssl_handshake_timeout=self.limits.request_timeout)

        def step(value: Any = None, exc: BaseException | None = None) -> None:
            try:
                waiting = coro.throw(exc) if exc is not None else coro.send(value)
            except StopIteration as done:
                self._handshaken(raw, done.value)
                return
            except Exception:  # a failed handshake: the connection is closed
                self._handshaken(raw, None)
                return
            waiting._asyncio_future_blocking = False
            waiting.add_done_callback(resume)

        def resume(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled():
                step(exc=asyncio.CancelledError())
            elif fut.exception() is not None:
                step(exc=fut.exception())
            else:
                step()

        step()

    def _handshaken(self, raw: asyncio.BaseTransport, tls: asyncio.BaseTransport | None) -> None:
        if tls is None or raw.is_closing():
            raw.close()
            self._release()
        else:
            self._serve(tls)

    def _serve(self, transport: asyncio.BaseTransport) -> None:
        self._serving = True
        super().connection_made(_Closing(transport, self))  # type: ignore[arg-type]
        if self._early:  # asyncio's TLS layer hands on data before start_tls returns
            early, self._early = b"".join(self._early), []
            self.data_received(early)

    def _release(self) -> None:
        self._disarm()
        if self._slot:
            self._slot = False
            self.limits.open -= 1
        if self._probe:
            self._probe = False
            self.limits.probes.pop(self, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._release()
        for timer in (self._write_deadline, self._reaper):
            if timer is not None:
                timer.cancel()
        self._write_deadline = self._reaper = None
        if self._serving:
            super().connection_lost(exc)

    # -- the deadline -----------------------------------------------------------------
    def _arm(self) -> None:
        if self._deadline is None:
            timeout = self.limits.request_timeout
            if self._probe:
                timeout = min(timeout, PROBE_TIMEOUT)
            self._deadline = self.loop.call_later(timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def data_received(self, data: bytes) -> None:
        if not self._serving:
            self._early.append(data)
            return
        if self._probe and not self.limits.probes.get(self, True):
            self._line += data
            if b"\n" not in self._line and len(self._line) < 256:
                return
            words = self._line.split(b"\r\n", 1)[0].split(b" ")
            if (len(words) < 2 or words[0] not in (b"GET", b"HEAD")
                    or words[1].split(b"?", 1)[0] not in _PROBES):
                self._refuse()
                return
            self.limits.probes[self] = True  # a probe: no longer displaced
            data, self._line = self._line, b""
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self._arm()  # a request (the next one on a kept-alive connection) begins
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the request is complete (or the connection is closing)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._probe:  # the reserve serves one probe per connection
            self._close(self.transport)
            return
        # pipelined requests were handled just now: one still incomplete has its deadline
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and self.conn.trailing_data[0]:
            self._arm()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:  # the peer does not read: the write deadline
            self._write_deadline = self.loop.call_later(self.limits.request_timeout,
                                                        self._write_expire)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_expire(self) -> None:
        self._write_deadline = None
        self.limits.write_timed_out += 1
        for t in (self.transport, self._raw):
            if t is not None:
                with contextlib.suppress(Exception):
                    t.abort()  # type: ignore[attr-defined]

    def _expire(self) -> None:
        self._deadline = None
        if self._probe:  # a probe's reserve place: refused, not a request timed out
            self._refuse()
            return
        self.limits.timed_out += 1
        if not self._serving:  # still in the TLS handshake
            if self._raw is not None:
                self._close(self._raw)
            return
        begun = bool(self.conn.trailing_data[0]) or self.conn.their_state is h11.SEND_BODY
        # no response begun: IDLE (headers incomplete) or SEND_RESPONSE (headers complete,
        # the app waiting for the body)
        if begun and self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            with contextlib.suppress(h11.LocalProtocolError):
                body = b"request not complete in time"
                out = self.conn.send(h11.Response(status_code=408, headers=[
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()), (b"connection", b"close")]))
                out = (out or b"") + (self.conn.send(h11.Data(data=body)) or b"")
                out += self.conn.send(h11.EndOfMessage()) or b""
                self.transport.write(out)
        self._close(self.transport)


class _Closing:
    """A transport whose ``close`` never waits for the peer (:meth:`_BoundedH11._close`):
    uvicorn's own closes (keep-alive timeout, ``connection: close``) go through it."""

    def __init__(self, transport: asyncio.BaseTransport, proto: _BoundedH11) -> None:
        self._transport = transport
        self._proto = proto

    def close(self) -> None:
        self._proto._close(self._transport)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def bounded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class bounded by ``limits`` (pass it as ``Config(http=...)``)."""
    return type("BoundedH11Protocol", (_BoundedH11,), {"limits": limits})


class ConnectionsCollector(Collector):
    """The bounds at work, for ``/metrics`` (read at scrape time).

    ``rpsagg_http_connections_open`` and ``rpsagg_http_connections_max`` (gauges),
    ``rpsagg_http_connections_refused_total`` (at the cap),
    ``rpsagg_http_requests_timed_out_total`` (closed at the deadline) and
    ``rpsagg_http_writes_timed_out_total`` (aborted at the write deadline) (counters).
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits

    def collect(self) -> Iterable[Metric]:
        """The five metrics."""
        lim = self.limits
        yield GaugeMetricFamily("rpsagg_http_connections_open",
                                "HTTP connections open now (TLS handshakes included)",
                                value=lim.open)
        yield GaugeMetricFamily("rpsagg_http_connections_max",
                                "HTTP connections open at once, at most "
                                "(--http-max-connections)", value=lim.max_connections)
        yield CounterMetricFamily("rpsagg_http_connections_refused",
                                  "HTTP connections refused at the cap", value=lim.refused)
        yield CounterMetricFamily("rpsagg_http_requests_timed_out",
                                  "HTTP connections closed because a request was not complete "
                                  "within --http-header-timeout", value=lim.timed_out)
        yield CounterMetricFamily("rpsagg_http_writes_timed_out",
                                  "HTTP connections aborted because the peer read nothing of a "
                                  "response for --http-header-timeout", value=lim.write_timed_out)
