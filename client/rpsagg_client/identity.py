"""A client id that survives the re-creation of its container.

A container's host name is its container id, which changes when compose re-creates it
(``up --build``, a changed image or setting): a client that joined under the old id would
then be a stranger to its server, and with all n slots held by old ids the job could not go
on. Compose names each replica ``<project>-<service>-<index>``, and Docker's embedded DNS
server (127.0.0.11, on every user-defined network, which compose always uses) answers the
reverse (PTR) query for a container's own address with ``<name>.<network>``. That name is
stable across re-creation and readable on the dashboard, so it is the default id of a
client in a compose replica. Everywhere else the default is the host name.

The query is a plain DNS message over UDP (RFC 1035, section 4), standard library only.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import struct

log = logging.getLogger("rpsagg.client")

#: Docker's embedded DNS server inside a container on a user-defined network
DOCKER_DNS = "127.0.0.11"
_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def _uses_docker_dns(resolv_conf: str = "/etc/resolv.conf") -> bool:
    try:
        with open(resolv_conf, encoding="utf-8", errors="replace") as fh:
            return any(line.split()[:2] == ["nameserver", DOCKER_DNS] for line in fh)
    except OSError:
        return False


def _encode_name(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.split(".") if p) + b"\0"


def _read_name(msg: bytes, pos: int) -> tuple[str, int]:
    """A possibly compressed domain name at ``pos``; returns it and the offset after it."""
    labels: list[str] = []
    end = -1
    for _ in range(128):  # bounds a malicious pointer loop
        length = msg[pos]
        if length & 0xC0 == 0xC0:  # a pointer to an earlier name
            if end < 0:
                end = pos + 2
            pos = ((length & 0x3F) << 8) | msg[pos + 1]
            continue
        if length == 0:
            return ".".join(labels), (end if end >= 0 else pos + 1)
        labels.append(msg[pos + 1:pos + 1 + length].decode("ascii", "replace"))
        pos += 1 + length
    raise ValueError("DNS name too long or looping")


def reverse_name(address: str, server: str = DOCKER_DNS, port: int = 53,
                 timeout: float = 1.0) -> str | None:
    """The PTR name of an IPv4 ``address`` from the DNS ``server`` (None: no answer).

    Parameters
    ----------
    address : str
        Dotted IPv4 address.
    server : str
        The DNS server to ask.
    port : int
        Its UDP port.
    timeout : float
        Seconds to wait for the answer.
    """
    qid = secrets.randbits(16)
    qname = ".".join(reversed(address.split("."))) + ".in-addr.arpa"
    query = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + _encode_name(qname)
    query += struct.pack(">HH", 12, 1)  # QTYPE PTR, QCLASS IN
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        try:
            s.sendto(query, (server, port))
            msg = s.recv(4096)
        except OSError:
            return None
    try:
        rid, flags, qd, an = struct.unpack(">HHHH", msg[:8])
        if rid != qid or flags & 0x000F or an == 0:
            return None
        pos = 12
        for _ in range(qd):
            _, pos = _read_name(msg, pos)
            pos += 4
        for _ in range(an):
            _, pos = _read_name(msg, pos)
            rtype, _, _, rdlen = struct.unpack(">HHIH", msg[pos:pos + 10])
            pos += 10
            if rtype == 12:
                return _read_name(msg, pos)[0]
            pos += rdlen
    except (struct.error, IndexError, ValueError):
        return None
    return None


def container_name(resolv_conf: str = "/etc/resolv.conf") -> str | None:
    """This container's name from Docker's embedded DNS (None outside such a container)."""
    if not _uses_docker_dns(resolv_conf):
        return None
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    name = reverse_name(address)
    if not name:
        return None
    first = name.split(".", 1)[0]
    return first if _ID.match(first) else None


def default_client_id() -> str:
    """``$RPSAGG_CLIENT_ID``, else the compose replica's container name, else the host name."""
    explicit = os.environ.get("RPSAGG_CLIENT_ID")
    if explicit:
        return explicit
    name = container_name()
    if name:
        log.debug("[Client] client id %s from Docker's DNS (the container's name)", name)
        return name
    return os.environ.get("HOSTNAME") or socket.gethostname()
