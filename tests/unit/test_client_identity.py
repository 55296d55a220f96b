"""The client's default id (rpsagg_client.identity): its compose container name from Docker's
embedded DNS, read from a real DNS answer.

A DNS responder on loopback (UDP, a free port; its answers built byte by byte here, not with
dnspython, which asks the query) answers the PTR query the way Docker's does
(``<name>.<network>``, with a compression pointer to the question); a resolv.conf naming
127.0.0.11 marks a container on a user-defined network. On the real engine
tests/engine/test_deploy_engine.py checks that the replicas join as ``<project>-client-N``.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rpsagg_client import identity

pytestmark = pytest.mark.unit


def _answer(query: bytes, name: str | int | None) -> bytes:
    """The answer to ``query``: a PTR record for a ``name``, none for None, an int: that RCODE."""
    qid = query[:2]
    end = 12
    while query[end]:  # the question's name (uncompressed in a query), then QTYPE and QCLASS
        end += 1 + query[end]
    question = query[12:end + 5]
    if name is None or isinstance(name, int):
        return qid + struct.pack(">HHHHH", 0x8180 | (name or 0), 1, 0, 0, 0) + question
    rdata = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    answer = b"\xc0\x0c" + struct.pack(">HHIH", 12, 1, 600, len(rdata)) + rdata
    return qid + struct.pack(">HHHHH", 0x8180, 1, 1, 0, 0) + question + answer


#: the responder's port, the answers it is to give (``_answer``'s ``name``) and the queries seen
Responder = tuple[int, list[str | int | None], list[bytes]]


@pytest.fixture
def dns() -> Iterator[Responder]:
    """A one-thread DNS responder: answers each query with the next of ``names``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    names: list[str | int | None] = []
    seen: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                query, peer = sock.recvfrom(512)
            except TimeoutError:
                continue
            seen.append(query)
            if names:
                sock.sendto(_answer(query, names.pop(0)), peer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield sock.getsockname()[1], names, seen
    finally:
        stop.set()
        t.join(5)
        sock.close()


def test_reverse_name_parses_a_ptr_answer(dns: Responder) -> None:
    port, names, seen = dns
    names.append("myproj-client-3.myproj_default")
    got = identity.reverse_name("172.18.0.7", server="127.0.0.1", port=port)
    assert got == "myproj-client-3.myproj_default"
    # the question asked: 7.0.18.172.in-addr.arpa, type PTR, class IN
    q = seen[0]
    assert b"\x017\x010\x0218\x03172\x07in-addr\x04arpa\x00\x00\x0c\x00\x01" in q


def test_no_answer_or_no_server_is_none(dns: Responder) -> None:
    port, names, _ = dns
    names.append(None)  # NOERROR with no answer record
    assert identity.reverse_name("10.0.0.1", server="127.0.0.1", port=port) is None
    names.extend([3, 2])  # NXDOMAIN, SERVFAIL
    assert identity.reverse_name("10.0.0.2", server="127.0.0.1", port=port) is None
    assert identity.reverse_name("10.0.0.3", server="127.0.0.1", port=port) is None
    assert not names  # each was asked once and answered
    # nothing answers: None after the timeout
    t0 = time.monotonic()
    assert identity.reverse_name("10.0.0.1", server="127.0.0.1", port=port,
                                 timeout=0.2) is None
    assert time.monotonic() - t0 < 2.0
    assert identity.reverse_name("not an address", server="127.0.0.1", port=port) is None


def test_container_name_only_behind_dockers_dns(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "resolv-plain.conf"
    plain.write_text("nameserver 10.255.255.53\n")
    docker = tmp_path / "resolv-docker.conf"
    docker.write_text("search example.org\nnameserver 127.0.0.11\noptions ndots:0\n")
    asked: list[str] = []

    def fake_reverse(address: str, **_: object) -> str | None:
        asked.append(address)
        return "proj-client-2.proj_default"

    monkeypatch.setattr(identity, "reverse_name", fake_reverse)
    assert identity.container_name(str(plain)) is None and not asked
    assert identity.container_name(str(docker)) == "proj-client-2"
    assert asked == [socket.gethostbyname(socket.gethostname())]
    monkeypatch.setattr(identity, "reverse_name", lambda *a, **k: "bad name!.net")
    assert identity.container_name(str(docker)) is None


def test_default_client_id_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RPSAGG_CLIENT_ID", "alice")
    monkeypatch.setattr(identity, "container_name", lambda: "proj-client-1")
    assert identity.default_client_id() == "alice"
    monkeypatch.delenv("RPSAGG_CLIENT_ID")
    assert identity.default_client_id() == "proj-client-1"
    monkeypatch.setattr(identity, "container_name", lambda: None)
    monkeypatch.setenv("HOSTNAME", "host-a")
    assert identity.default_client_id() == "host-a"
