"""A client id that survives the re-creation of its container.

A container's host name is its container id, which changes when compose re-creates it
(``up --build``, a changed image or setting): a client that joined under the old id would
then be a stranger to its server, and with all n slots held by old ids the job could not go
on. Compose names each replica ``<project>-<service>-<index>``, and Docker's embedded DNS
server (127.0.0.11, on every user-defined network, which compose always uses) answers the
reverse (PTR) query for a container's own address with ``<name>.<network>``. That name is
stable across re-creation and readable on the dashboard, so it is the default id of a
client in a compose replica. Everywhere else the default is the host name.

The query is asked with dnspython (``dns.resolver``), straight to that one server.
"""

from __future__ import annotations

import logging
import os
import re
import socket

import dns.exception
import dns.rdtypes.ANY.PTR
import dns.resolver
import dns.reversename

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


def reverse_name(address: str, server: str = DOCKER_DNS, port: int = 53,
                 timeout: float = 1.0) -> str | None:
    """The PTR name of an IP ``address`` from the DNS ``server`` (None: no answer).

    None also when the server does not answer within ``timeout``, answers NXDOMAIN or an
    error, or when ``address`` is not an IP address.

    Parameters
    ----------
    address : str
        Dotted IPv4 (or IPv6) address.
    server : str
        The IP address of the DNS server to ask.
    port : int
        Its UDP port.
    timeout : float
        Seconds to wait for the answer.
    """
    try:
        qname = dns.reversename.from_address(address)
    except (dns.exception.SyntaxError, ValueError):
        return None
    resolver = dns.resolver.Resolver(configure=False)  # this server only, not resolv.conf
    resolver.nameservers = [server]
    resolver.port = port
    resolver.timeout = resolver.lifetime = timeout
    try:
        answer = resolver.resolve(qname, "PTR", search=False)
    except dns.exception.DNSException:  # timeout, NXDOMAIN, no answer, SERVFAIL, bad reply
        return None
    for rdata in answer:
        if isinstance(rdata, dns.rdtypes.ANY.PTR.PTR):
            return rdata.target.to_text(omit_final_dot=True)
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
