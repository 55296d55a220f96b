"""The counting TCP proxy (:class:`LinkProxy`): forwards every byte between a SuperNode
and the SuperLink, counts them each way, and splits them into HTTP/1.1 exchanges."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Collection
from typing import Any

from linkbytes.httpstream import Exchange, _HttpMessages

#: bytes one read moves (and the most one chunk record holds)
READ_SIZE = 1 << 16


class LinkProxy:
    """A TCP proxy from a free port of 127.0.0.1 to ``target``, counting the bytes it
    forwards: ``up`` (client -> target) and ``down`` (target -> client).

    It runs an asyncio loop in a thread of its own: ``start()`` returns once it listens
    (``port``), ``stop()`` closes every connection and the listener. Each direction's bytes
    are counted before they are written on, so a client that has received n bytes back
    finds ``down >= n``. With ``http=True`` each connection's streams are also split into
    HTTP/1.1 requests and responses (:attr:`exchanges`; bodies kept for the request paths
    in ``keep_bodies``); ``chunks`` records every forwarded read as ``(time, connection,
    "up" or "down", bytes)``.

    Parameters
    ----------
    target : tuple of str and int
        Host and port to forward to.
    http : bool
        Parse HTTP/1.1 exchanges too.
    keep_bodies : collection of str
        Request paths whose request and response bodies are kept (decoded from
        ``chunked``; a compressed body as it came).
    """

    def __init__(self, target: tuple[str, int], http: bool = False,
                 keep_bodies: Collection[str] = ()) -> None:
        self.target = target
        self.http = http
        self.keep_bodies = frozenset(keep_bodies)
        self.port = 0
        self.up = 0
        self.down = 0
        self.connections = 0
        self.failed_connections = 0  # the target refused or dropped
        self.chunks: list[tuple[float, int, str, int]] = []
        self.exchanges: list[Exchange] = []
        self.parse_errors: list[str] = []
        #: per request path, the first request's header names and their values' lengths
        self.sample_heads: dict[str, dict[str, int]] = {}
        self.snapshots: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # counters, read from any thread
    def totals(self) -> tuple[int, int]:
        """``(up, down)`` at one instant."""
        with self._lock:
            return self.up, self.down

    def snapshot(self, label: str) -> dict[str, Any]:
        """Record (and return) the counters now under ``label``."""
        with self._lock:
            snap = {"label": label, "t": time.monotonic(), "up": self.up, "down": self.down,
                    "connections": self.connections}
            self.snapshots.append(snap)
        return snap

    def start(self, timeout: float = 10.0) -> LinkProxy:
        self._thread = threading.Thread(target=self._run, name=f"link-proxy-{id(self):x}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            self.stop()
            raise RuntimeError(f"the proxy did not start: {self._error!r}")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = int(self._server.sockets[0].getsockname()[1])
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._shutdown())
            loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    def stop(self) -> None:
        """Close the listener and every connection; wait for the proxy's thread."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                loop.call_soon_threadsafe(loop.stop)
            thread.join(10.0)
        self._thread = None

    def __enter__(self) -> LinkProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _handle(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(client_w)
        with self._lock:
            self.connections += 1
            conn = self.connections
        try:
            try:
                target_r, target_w = await asyncio.open_connection(*self.target)
            except OSError:
                with self._lock:
                    self.failed_connections += 1
                return
            self._writers.add(target_w)
            up_parser = down_parser = None
            if self.http:
                pending: list[Exchange] = []
                up_parser, down_parser = self._parsers(conn, pending)
            try:
                await asyncio.gather(
                    self._pipe(client_r, target_w, conn, "up", up_parser),
                    self._pipe(target_r, client_w, conn, "down", down_parser))
            finally:
                target_w.close()
                self._writers.discard(target_w)
        finally:
            client_w.close()
            self._writers.discard(client_w)
            self._tasks.discard(task)

    def _parsers(self, conn: int, pending: list[Exchange]
                 ) -> tuple[_HttpMessages, _HttpMessages]:
        """The request and response parsers of one connection: a request opens an
        :class:`Exchange` (in :attr:`exchanges` from its first byte), the next response
        completes the oldest open one."""
        state: dict[str, float] = {}

        def req_start(start: str | None, t: float) -> None:
            if start is None:
                state["t"] = t

        def req_done(start: str, headers: dict[str, str], nbytes: int, head: int,
                     body: bytes | None) -> None:
            parts = start.split()
            path = parts[1] if len(parts) > 1 else start
            ex = Exchange(conn, path, state["t"], up=nbytes, up_head=head, request_body=body)
            if path not in self.sample_heads:  # what one request's head carries
                self.sample_heads[path] = {name: len(value) for name, value in headers.items()}
            with self._lock:
                self.exchanges.append(ex)
            pending.append(ex)

        def resp_start(start: str | None, t: float) -> None:
            pass

        def resp_done(start: str, headers: dict[str, str], nbytes: int, head: int,
                      body: bytes | None) -> None:
            ex = pending.pop(0) if pending else None
            if ex is None:
                self.parse_errors.append(f"connection {conn}: a response without a request")
                return
            with self._lock:
                ex.down, ex.down_head, ex.t_response = nbytes, head, time.monotonic()
                ex.status = int(start.split()[1])
                ex.response_body, ex.response_headers = body, headers

        def keep_request(start: str) -> bool:
            parts = start.split()
            return len(parts) > 1 and parts[1] in self.keep_bodies

        def keep_response(start: str) -> bool:
            return bool(pending) and pending[0].path in self.keep_bodies

        return (_HttpMessages(req_start, req_done, keep_request, response=False),
                _HttpMessages(resp_start, resp_done, keep_response, response=True))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    conn: int, direction: str, parser: _HttpMessages | None) -> None:
        try:
            while data := await reader.read(READ_SIZE):
                t = time.monotonic()
                with self._lock:
                    if direction == "up":
                        self.up += len(data)
                    else:
                        self.down += len(data)
                    self.chunks.append((t, conn, direction, len(data)))
                if parser is not None:
                    parser.feed(data, t)
                writer.write(data)
                await writer.drain()
            if parser is not None:
                parser.close()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()
        finally:
            if parser is not None and parser.broken:
                self.parse_errors.append(f"connection {conn} {direction}: {parser.broken}")
