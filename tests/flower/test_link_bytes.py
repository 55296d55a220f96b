"""The counting TCP proxy of examples/flower-fashion-mnist/link_bytes.py, on small cases.

What its measurements rest on: the bytes it forwards arrive unchanged, and its counters
equal exactly what each side sent (an echo server behind it: N bytes up, the same N back
down, over one connection or several at once); its HTTP/1.1 split gives each request and
response its exact bytes (heads and bodies, ``Content-Length`` or ``chunked``, however the
bytes are cut into reads); and the rounds are cut at the pulls that carry a message. No
Flower processes here (``link_bytes.py`` runs those); in-process servers on 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from flwr.proto.fleet_pb2 import PullMessagesResponse
from flwr.proto.message_pb2 import Message as ProtoMessage

pytestmark = [pytest.mark.service, pytest.mark.timeout(30)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-fashion-mnist"
sys.path.insert(0, str(EXAMPLE))

from linkbytes import rounds as link_bytes  # noqa: E402
from linkbytes.httpstream import Exchange, _HttpMessages  # noqa: E402
from linkbytes.proxy import LinkProxy  # noqa: E402
from linkbytes.rounds import PULL, segment  # noqa: E402


def _server(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on a free port of 127.0.0.1 that runs ``handle`` on each connection in
    a thread of its own; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.05)  # accept() wakes to see stop
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=_run, args=(conn,), daemon=True).start()

    def _run(conn: socket.socket) -> None:
        with conn:
            handle(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _echo(conn: socket.socket) -> None:
    while data := conn.recv(4096):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


@pytest.fixture
def echo_port() -> Iterator[int]:
    yield from _server(_echo)


def _exchange(port: int, payload: bytes, piece: int = 7_001) -> bytes:
    """Send ``payload`` in pieces, half-close, read everything back."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        received = bytearray()
        sender = threading.Thread(target=lambda: (
            [sock.sendall(payload[i:i + piece]) for i in range(0, len(payload), piece)],
            sock.shutdown(socket.SHUT_WR)))
        sender.start()
        while data := sock.recv(65536):
            received += data
        sender.join(5)
    return bytes(received)


def test_an_echo_behind_the_proxy_counts_exactly_n_up_and_n_down(echo_port: int) -> None:
    payload = os.urandom(300_001)
    with LinkProxy(("127.0.0.1", echo_port)) as proxy:
        assert proxy.port and proxy.port != echo_port
        assert _exchange(proxy.port, payload) == payload  # forwarded unchanged
        assert proxy.totals() == (len(payload), len(payload))
        assert proxy.connections == 1 and proxy.failed_connections == 0
        assert sum(n for _, _, d, n in proxy.chunks if d == "up") == len(payload)
        snap = proxy.snapshot("after")
        assert (snap["up"], snap["down"]) == (len(payload), len(payload))
        assert proxy.exchanges == []  # http=False: no parsing


def test_concurrent_connections_add_up(echo_port: int) -> None:
    sizes = [1, 10_000, 123_457, 65_536]
    payloads = [os.urandom(n) for n in sizes]
    back: list[bytes] = [b""] * len(sizes)
    with LinkProxy(("127.0.0.1", echo_port)) as proxy:
        threads = [threading.Thread(target=lambda i=i: back.__setitem__(
            i, _exchange(proxy.port, payloads[i], piece=1 + i * 3_000)))
            for i in range(len(sizes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert back == payloads
        assert proxy.totals() == (sum(sizes), sum(sizes))
        assert proxy.connections == len(sizes)
        per_conn = {c: 0 for c in range(1, len(sizes) + 1)}
        for _, conn, direction, n in proxy.chunks:
            if direction == "down":
                per_conn[conn] += n
        assert sorted(per_conn.values()) == sorted(sizes)


def test_a_refused_target_closes_the_client_and_counts_nothing() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # nothing listens there once closed
    with LinkProxy(("127.0.0.1", closed_port)) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            sock.settimeout(5)
            assert sock.recv(10) == b""  # closed by the proxy
        assert proxy.failed_connections == 1 and proxy.totals() == (0, 0)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", proxy.port), timeout=2):
        pass  # stopped: the listener is gone


def _request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/protobuf\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _chunked(body: bytes, size: int) -> bytes:
    parts = [f"{len(body[i:i + size]):x}\r\n".encode() + body[i:i + size] + b"\r\n"
             for i in range(0, len(body), size)]
    return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(parts)
            + b"0\r\n\r\n")


def _plain(body: bytes) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def test_http_messages_split_exactly_whatever_the_reads() -> None:
    a, b = _request("/a", b"x" * 1000), _request("/b", b"")
    r1, r2 = _chunked(bytes(range(256)) * 4, 100), _plain(b"yz")
    for step in (1, 3, 64, 10_000):
        done: list[tuple[str, int, int, bytes | None]] = []

        def on_done(s: str, h: dict[str, str], n: int, head: int, body: bytes | None,
                    done: list[tuple[str, int, int, bytes | None]] = done) -> None:
            done.append((s, n, head, body))

        requests = _HttpMessages(lambda s, t: None, on_done, lambda s: "/a" in s,
                                 response=False)
        responses = _HttpMessages(lambda s, t: None, on_done, lambda s: True, response=True)
        for stream, parser in ((a + b, requests), (r1 + r2, responses)):
            for i in range(0, len(stream), step):
                parser.feed(stream[i:i + step], 0.0)
        assert not requests.broken and not responses.broken
        assert [(s.split()[1], n) for s, n, _, _ in done] == [
            ("/a", len(a)), ("/b", len(b)), ("200", len(r1)), ("200", len(r2))]
        assert done[0][2] == len(a) - 1000 and done[0][3] == b"x" * 1000
        assert done[1][3] is None  # not kept
        assert done[2][3] == bytes(range(256)) * 4  # de-chunked
        assert done[3][3] == b"yz"


@pytest.fixture
def http_port() -> Iterator[int]:
    """A keep-alive HTTP/1.1 server: the body of a request to /chunked comes back
    chunked, any other's with a Content-Length."""

    def handle(conn: socket.socket) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = conn.recv(4096)
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.decode().split("\r\n")
            length = next(int(v) for k, _, v in (x.partition(": ") for x in lines[1:])
                          if k.lower() == "content-length")
            while len(buf) < length:
                buf += conn.recv(4096)
            body, buf = buf[:length], buf[length:]
            conn.sendall(_chunked(body, 500) if lines[0].split()[1] == "/chunked"
                         else _plain(body))

    yield from _server(handle)


def _read_response(sock: socket.socket, expected: int) -> bytes:
    data = b""
    while len(data) < expected:
        data += sock.recv(65536)
    return data


def test_http_exchanges_add_up_to_the_tcp_counts(http_port: int) -> None:
    bodies = [os.urandom(5_000), b"", os.urandom(70_000)]
    paths = ["/chunked", PULL, "/plain"]
    with LinkProxy(("127.0.0.1", http_port), http=True, keep_bodies=[PULL, "/chunked"]
                   ) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sent = received = 0
        for path, body in zip(paths, bodies, strict=True):
            req = _request(path, body)
            resp = _chunked(body, 500) if path == "/chunked" else _plain(body)
            sock.sendall(req)
            assert _read_response(sock, len(resp)) == resp
            sent, received = sent + len(req), received + len(resp)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""
        assert proxy.totals() == (sent, received)
        ex = proxy.exchanges
        assert [e.path for e in ex] == paths and all(e.status == 200 for e in ex)
        assert [e.up for e in ex] == [len(_request(p, b))
                                      for p, b in zip(paths, bodies, strict=True)]
        assert ex[0].down == len(_chunked(bodies[0], 500)) and ex[0].response_body == bodies[0]
        assert ex[2].response_body is None and ex[2].down == len(_plain(bodies[2]))
        assert sum(e.up for e in ex) == sent and sum(e.down for e in ex) == received
        assert all(e.t_response is not None and e.t_response >= e.t_request for e in ex)
        assert proxy.parse_errors == [] and set(proxy.sample_heads) == set(paths)


def _pull(t: float, messages: int) -> Exchange:
    resp = PullMessagesResponse(messages_list=[ProtoMessage() for _ in range(messages)])
    return Exchange(1, PULL, t, up=800, down=100 + messages, t_response=t + 0.1,
                    status=200, response_body=resp.SerializeToString())


def test_rounds_start_at_the_pulls_that_carry_a_message() -> None:
    proxy = LinkProxy(("127.0.0.1", 1))
    proxy.exchanges = [
        Exchange(1, "/v1/fleet/register-node", 0.0, up=1000, down=100, t_response=0.1),
        _pull(1.0, 0),  # before the run
        _pull(10.0, 1),  # round 1
        Exchange(1, "/v1/fleet/get-fab", 10.5, up=900, down=50_000, t_response=10.6),
        Exchange(1, "/v1/fleet/push-object", 11.0, up=5_000, down=130, t_response=11.1),
        _pull(12.0, 0),  # polling in round 1
        _pull(20.0, 1),  # round 2
        Exchange(1, "/v1/fleet/push-messages", 21.0, up=3_000, down=200, t_response=21.1),
        _pull(31.0, 0),  # after the run
    ]
    segs = segment(proxy, t_run=5.0, t_end=30.0, rounds=2)
    assert segs["before"]["up"] == 1800
    assert segs["before"]["by-category"]["node-setup"]["up"] == 1000
    one = segs["1"]
    assert one["up"] == 800 + 900 + 5_000 + 800 and one["seconds"] == 10.0
    assert one["by-category"]["reply"]["up"] == 5_000
    assert one["by-category"]["poll"]["requests"] == 1
    assert one["by-category"]["run-setup"]["down"] == 50_000
    assert one["by-path"][PULL + " (with a message)"]["down"] == 101
    assert segs["2"]["by-category"]["reply"]["up"] == 3_000 and segs["2"]["seconds"] == 10.0
    assert segs["after"]["requests"] == 1
    with pytest.raises(RuntimeError, match="pulled 2 messages in a run of 3 rounds"):
        segment(proxy, t_run=5.0, t_end=30.0, rounds=3)
    assert link_bytes.category(_pull(0.0, 0)) == "poll"
