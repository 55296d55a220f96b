"""Start-up checks that turn a user's mistake into one line and exit status 2.

Everything here runs before the server logs or serves anything: the TLS files (readable,
certificate and key belong together), the token files (gRPC's and the dashboard's), the
database file (an SQLite file, and not another application's), and the listening sockets
(the dashboard's here, gRPC's in :func:`grpc_bind_error`). Each failure is a
:class:`StartupError` whose message names the flag, the file or the address and the reason.
"""

from __future__ import annotations

import errno
import os
import socket
import sqlite3
import ssl
import stat
from pathlib import Path
from typing import Any

from rpsagg_server.domain.errors import StartupError
from rpsagg_server.http.auth import HttpTokens
from rpsagg_server.settings.serverconfig import ServerConfig

OUR_TABLES = frozenset({"meta", "clients", "rounds", "submissions"})


def _readable(flag: str, path: str) -> None:
    """``path`` is a regular file this process can read. Anything else (a FIFO, a device,
    a directory, a socket) is refused before it is opened: opening a FIFO would wait for a
    writer, forever."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise StartupError(f"{flag} {path}: not a regular file ({_kind(info.st_mode)})")
        with Path(path).open("rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise StartupError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"  # pragma: no cover - no other kind on Linux


def check_tls(cfg: ServerConfig) -> None:
    """The certificate, key and client CA are readable PEM and the key matches the cert."""
    if cfg.tls_cert is None or cfg.tls_key is None:
        return
    _readable("--tls-cert", cfg.tls_cert)
    _readable("--tls-key", cfg.tls_key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    except ssl.SSLError as exc:
        why = exc.reason or str(exc)
        if "KEY_VALUES_MISMATCH" in str(exc) or why == "KEY_VALUES_MISMATCH":
            raise StartupError(f"--tls-key {cfg.tls_key} does not belong to --tls-cert "
                               f"{cfg.tls_cert} (key values mismatch)") from None
        raise StartupError(f"--tls-cert {cfg.tls_cert} / --tls-key {cfg.tls_key}: not a "
                           f"usable PEM certificate and key ({why})") from None
    if cfg.tls_client_ca:
        _readable("--tls-client-ca", cfg.tls_client_ca)
        try:
            ctx.load_verify_locations(cafile=cfg.tls_client_ca)
        except ssl.SSLError as exc:
            raise StartupError(f"--tls-client-ca {cfg.tls_client_ca}: not a PEM CA bundle "
                               f"({exc.reason or exc})") from None


def check_tokens(cfg: ServerConfig) -> None:
    """The token file is readable (its syntax is checked by ``TokenBook.from_file``)."""
    if cfg.tokens:
        _readable("--tokens", cfg.tokens)


def load_http_tokens(cfg: ServerConfig) -> HttpTokens | None:
    """The dashboard's tokens (``--http-tokens``), or None without the flag."""
    if not cfg.http_tokens:
        return None
    _readable("--http-tokens", cfg.http_tokens)
    try:
        return HttpTokens.from_file(cfg.http_tokens)
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def load_admin_tokens(cfg: ServerConfig) -> HttpTokens | None:
    """The tokens that may create and cancel jobs (``--admin-tokens``), or None."""
    if not cfg.admin_tokens:
        return None
    _readable("--admin-tokens", cfg.admin_tokens)
    try:
        return HttpTokens.from_file(cfg.admin_tokens, "--admin-tokens")
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def check_database(cfg: ServerConfig) -> None:
    """An existing ``--db`` file is an SQLite database that is empty or rpsagg's.

    A corrupt file or another application's database is refused before the store would add
    its tables to it. (A database of an rpsagg job with other settings is refused by the
    round engine, which names the differing settings.)
    """
    path = cfg.db
    if path in ("", ":memory:") or path.startswith("file:"):
        return
    p = Path(path)
    if not p.exists():
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise StartupError(f"--db {path}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise StartupError(f"--db {path}: cannot create it (directory {parent} is not "
                               "writable)")
        return
    if p.is_dir():
        raise StartupError(f"--db {path}: is a directory")
    _readable("--db", path)
    if p.stat().st_size == 0:
        return
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise StartupError(f"--db {path}: not an SQLite database or corrupt ({exc})") from None
    tables = {str(r[0]) for r in rows} - {"sqlite_sequence"}
    foreign = sorted(tables - OUR_TABLES)
    if foreign:
        raise StartupError(f"--db {path}: not an rpsagg database (it has tables "
                           f"{', '.join(foreign)}); use a new file")


def _address_error(what: str, host: str, port: int, exc: OSError) -> StartupError:
    if exc.errno == errno.EADDRINUSE:
        why = "the port is in use"
    elif exc.errno == errno.EADDRNOTAVAIL:
        why = "no such local address"
    elif exc.errno == errno.EACCES:
        why = "permission denied (ports below 1024 need privileges)"
    else:
        why = exc.strerror or str(exc)
    shown = f"[{host}]" if ":" in host else host
    return StartupError(f"{what} {shown}:{port}: cannot listen ({why})")


def _resolve(host: str) -> list[tuple[int, str]]:
    """``(family, address)`` for one ``--http-host`` entry (names resolve via getaddrinfo)."""
    host = host.strip().strip("[]")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"--http-host {host}: cannot resolve it ({exc.strerror})") from None
    out: list[tuple[int, str]] = []
    for family, _, _, _, addr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and (family, addr[0]) not in out:
            out.append((family, str(addr[0])))
    return out


def bind_http_sockets(hosts: str, port: int) -> list[socket.socket]:
    """Listening sockets for the dashboard on every address of ``hosts`` (comma-separated).

    ``::`` is dual-stack (IPv4 too, like gRPC's ``[::]``); ``::1`` is skipped without an
    error when the machine has no IPv6 loopback and another address was bound. With
    ``port`` 0 the first socket picks a free port and the others use the same one.
    """
    wanted: list[tuple[int, str]] = []
    for entry in hosts.split(","):
        if entry.strip():
            wanted.extend(x for x in _resolve(entry) if x not in wanted)
    if not wanted:
        raise StartupError(f"--http-host {hosts!r}: no address to listen on")
    for _ in range(20):
        try:
            return _bind_all(wanted, port)
        except _LaterPortTaken:
            continue  # port 0: the port the first socket got is taken on another address
    raise StartupError(f"--http-host {hosts!r}: found no free port on every address")


class _LaterPortTaken(Exception):
    pass


def _bind_all(wanted: list[tuple[int, str]], port: int) -> list[socket.socket]:
    any_port = port == 0
    socks: list[socket.socket] = []
    try:
        for family, addr in wanted:
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if addr == "::" else 1)
                s.bind((addr, port))
                s.listen(128)
                s.setblocking(False)
            except OSError as exc:
                s.close()
                if addr == "::1" and exc.errno == errno.EADDRNOTAVAIL and len(wanted) > 1:
                    continue  # no IPv6 on this machine: 127.0.0.1 alone is loopback
                if any_port and socks and exc.errno == errno.EADDRINUSE:
                    raise _LaterPortTaken from None
                raise _address_error("--http-host/--http-port", addr, port, exc) from None
            socks.append(s)
            port = s.getsockname()[1]
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def probe_grpc_address(host: str, port: int) -> StartupError | None:
    """Why gRPC cannot listen on ``host:port``, found by binding a plain socket there first.

    (gRPC's own failure says only "Failed to bind" and logs to stderr.) None when the
    address is free, the port is 0 (any free port), or the host is a name, not an address.
    """
    if port == 0:
        return None
    addr = host.strip().strip("[]")
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICHOST | socket.AI_PASSIVE)
    except socket.gaierror:
        return None
    family, _, _, _, sockaddr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # like gRPC: a restart is not refused for connections of the last run (TIME_WAIT)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if addr == "::" else 1)
            s.bind(sockaddr)
    except OSError as exc:
        return _address_error("--host/--grpc-port", addr, port, exc)
    return None


def grpc_bind_error(host: str, port: int) -> StartupError:
    """The error for an address gRPC refused (after :func:`probe_grpc_address` passed)."""
    return probe_grpc_address(host, port) or StartupError(
        f"--host/--grpc-port {host}:{port}: gRPC could not listen there")


def bind_grpc(server: Any, host: str, port: int, creds: Any) -> int:
    """Add the listening port to a ``grpc.aio`` ``server`` (TLS with ``creds``, else plain
    text); returns the bound port. A :class:`StartupError` naming the address and the reason
    when it cannot listen there (probed first: gRPC's own failure says only "Failed to
    bind")."""
    busy = probe_grpc_address(host, port)
    if busy is not None:
        raise busy
    address = f"{host}:{port}"
    try:
        bound = (server.add_secure_port(address, creds) if creds is not None
                 else server.add_insecure_port(address))
    except RuntimeError:
        bound = 0
    if not bound:
        raise grpc_bind_error(host, port)
    return int(bound)

