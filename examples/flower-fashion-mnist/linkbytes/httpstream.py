"""The HTTP/1.1 side of the counting proxy: one request and its response
(:class:`Exchange`), and the splitter that cuts one direction of a byte stream into
messages and counts each one's bytes (:class:`_HttpMessages`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the longest HTTP head (start line and headers) the parser accepts
MAX_HEAD = 1 << 16


@dataclass
class Exchange:
    """One HTTP request on a proxied connection and its response."""

    conn: int
    path: str
    t_request: float  # time.monotonic() of the request's first byte
    up: int = 0  # the request's bytes: start line, headers, body
    down: int = 0  # the response's bytes
    up_head: int = 0  # of which the request's start line and headers (with the blank line)
    down_head: int = 0
    t_response: float | None = None  # its response's last byte; None while unanswered
    status: int = 0
    request_body: bytes | None = None  # kept for the proxy's keep_bodies paths
    response_body: bytes | None = None
    response_headers: dict[str, str] = field(default_factory=dict)


class _HttpMessages:
    """Splits one direction of an HTTP/1.1 byte stream into messages (a request or a
    response each: head, then a body by ``Content-Length`` or ``chunked``), counting each
    one's bytes. Calls ``on_start(start_line, t)`` at a message's first byte and
    ``on_done(start_line, headers, nbytes, head_bytes, body)`` after its last (``body``:
    the decoded body when ``keep(start_line)`` says so, else None). Any stream it cannot parse stops
    the parsing (``broken``), not the forwarding."""

    def __init__(self, on_start: Any, on_done: Any, keep: Any, response: bool) -> None:
        self.on_start, self.on_done, self.keep, self.response = on_start, on_done, keep, response
        self.buf = bytearray()
        self.state = "head"  # head, body, chunk-size, chunk-data, trailer, eof-body
        self.remaining = 0
        self.nbytes = 0  # of the current message so far
        self.head_bytes = 0  # its head's
        self.start = ""
        self.headers: dict[str, str] = {}
        self.body: bytearray | None = None
        self.broken = ""
        self.in_message = False

    def feed(self, data: bytes, t: float) -> None:
        if self.broken or not data:
            return
        try:
            self._feed(data, t)
        except (ValueError, UnicodeDecodeError) as exc:
            self.broken = f"{type(exc).__name__}: {exc}"

    def _feed(self, data: bytes, t: float) -> None:
        view: memoryview | None = memoryview(data)
        while view:
            if not self.in_message:
                self.in_message = True
                self.nbytes = 0
                self.on_start(None, t)
            if self.state == "head":
                view = self._head(view, t)
            elif self.state in ("body", "chunk-data", "eof-body"):
                view = self._body_bytes(view)
            elif self.state == "chunk-crlf":
                take = min(self.remaining, len(view))
                self.nbytes += take
                view = view[take:]
                self.remaining -= take
                if self.remaining == 0:
                    self.state = "chunk-size"
            else:  # chunk-size or trailer: one line at a time
                view = self._line(view)

    def _head(self, view: memoryview, t: float) -> memoryview | None:
        """The head's bytes in ``view``: what follows the head, or None (all consumed, the
        head not complete yet)."""
        self.buf += view
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD:
                raise ValueError("HTTP head too long")
            self.nbytes += len(view)
            return None
        used = len(view) - (len(self.buf) - end - 4)
        self.nbytes += used
        self.head_bytes = self.nbytes
        view = view[used:]
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        self.buf.clear()
        self.start = head[0]
        self.on_start(self.start, t)
        self.headers = {}
        for line in head[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"bad header line {line!r}")
            self.headers[name.strip().lower()] = value.strip()
        self.body = bytearray() if self.keep(self.start) else None
        self._framing()
        return view

    def _framing(self) -> None:
        """After a head: how its body is delimited (the next state)."""
        status = int(self.start.split()[1]) if self.response else 0
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self.state = "chunk-size"
        elif "content-length" in self.headers:
            self.remaining = int(self.headers["content-length"])
            self.state = "body"
        elif self.response and not (100 <= status < 200 or status in (204, 304)):
            self.state = "eof-body"  # delimited by the connection's end
        else:
            self.remaining = 0
            self.state = "body"
        if self.state == "body" and self.remaining == 0:
            self._done()

    def _body_bytes(self, view: memoryview) -> memoryview:
        """A body's or a chunk's bytes in ``view``: what follows them."""
        take = len(view) if self.state == "eof-body" else min(self.remaining, len(view))
        if self.body is not None:
            self.body += view[:take]
        self.nbytes += take
        view = view[take:]
        if self.state == "eof-body":
            return view
        self.remaining -= take
        if self.remaining == 0:
            if self.state == "body":
                self._done()
            else:  # the chunk's CRLF
                self.state = "chunk-crlf"
                self.remaining = 2
        return view

    def _line(self, view: memoryview) -> memoryview | None:
        """A chunk-size or trailer line's bytes in ``view``: what follows the line, or None
        (all consumed, the line not complete yet)."""
        self.buf += view
        end = self.buf.find(b"\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD:
                raise ValueError("HTTP chunk line too long")
            self.nbytes += len(view)
            return None
        used = len(view) - (len(self.buf) - end - 2)
        self.nbytes += used
        view = view[used:]
        line = bytes(self.buf[:end]).decode("latin-1")
        self.buf.clear()
        if self.state == "trailer":
            if line == "":
                self._done()
        elif (size := int(line.split(";")[0].strip(), 16)) == 0:
            self.state = "trailer"
        else:
            self.remaining = size
            self.state = "chunk-data"
        return view

    def _done(self) -> None:
        body = None if self.body is None else bytes(self.body)
        self.on_done(self.start, self.headers, self.nbytes, self.head_bytes, body)
        self.state, self.in_message, self.body, self.start = "head", False, None, ""

    def close(self) -> None:
        """The stream ended: a body delimited by the connection's end is complete."""
        if not self.broken and self.in_message and self.state == "eof-body":
            self._done()
