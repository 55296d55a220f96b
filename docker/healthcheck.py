"""Container health check of the rpsagg images (standard library only).

    rpsagg-healthcheck http   # server: GET /readyz on 127.0.0.1:$RPSAGG_HTTP_PORT (default 8000),
                              # over HTTPS when the dashboard serves it (--http-tls)
    rpsagg-healthcheck tcp    # client: the server at $RPSAGG_SERVER accepts TCP connections
    rpsagg-healthcheck ray    # Ray worker: its raylet runs, and the head at $RAY_ADDRESS
                              # (host:port of the GCS) accepts TCP connections

Exit status 0 when healthy, 1 otherwise (what Docker's HEALTHCHECK expects).
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import sys
import urllib.request

_ON = ("1", "true", "yes", "on")


def _tls_context() -> ssl.SSLContext:
    """TLS to the server's own dashboard on 127.0.0.1: the name in its certificate is the
    server's public one, and the CA is not in the container, so no chain or name check;
    the certificate presented must be the server's own (``RPSAGG_SERVER_TLS_CERT``, or its
    older name ``RPSAGG_TLS_CERT``), where that file is readable here."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _own_certificate() -> bytes | None:
    """The DER bytes of the first certificate of the server's own certificate file (None:
    not readable)."""
    path = os.environ.get("RPSAGG_SERVER_TLS_CERT") or os.environ.get("RPSAGG_TLS_CERT")
    if not path:
        return None
    try:
        with open(path, encoding="ascii") as fh:
            pem = fh.read()
        end = pem.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")
        return ssl.PEM_cert_to_DER_cert(pem[pem.index("-----BEGIN CERTIFICATE-----"):end])
    except (OSError, ValueError):
        return None


def _readyz(scheme: str, port: int) -> str:
    """GET /readyz over ``scheme``; an HTTP error status raises ``urllib.error.HTTPError``."""
    if scheme == "http":
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=4) as resp:
            return f"HTTP {resp.status}"
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=4, context=_tls_context())
    try:
        conn.connect()
        own = _own_certificate()
        sock = conn.sock
        if not isinstance(sock, ssl.SSLSocket):  # pragma: no cover - connect() made it
            raise OSError("no TLS connection")
        if own is not None and sock.getpeercert(binary_form=True) != own:
            raise OSError("the dashboard's certificate is not the server's own "
                          "(RPSAGG_SERVER_TLS_CERT)")
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise OSError(f"HTTPS {resp.status} from /readyz")
        return f"HTTPS {resp.status}"
    finally:
        conn.close()


def check_http() -> str:
    """The server's readiness probe: the database answers and gRPC is serving.

    HTTPS when ``RPSAGG_HTTP_TLS`` is on (what ``--http-tls`` reads from the environment),
    else plain HTTP; a dashboard that answers the first with no HTTP response at all (a
    TLS server given plain text closes the connection; a plain one given a TLS hello
    answers 400 or closes) is tried with the other, so a ``--http-tls`` from the command
    line or a config file is found too."""
    port = int(os.environ.get("RPSAGG_HTTP_PORT", "8000"))
    tls = os.environ.get("RPSAGG_HTTP_TLS", "").strip().lower() in _ON
    first, second = ("https", "http") if tls else ("http", "https")
    try:
        return _readyz(first, port)
    except (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError,
            ssl.SSLError):
        return _readyz(second, port)


def check_tcp() -> str:
    """The client's view: its server (``HOST:PORT``) accepts connections."""
    target = os.environ.get("RPSAGG_SERVER", "127.0.0.1:50051")
    host, _, port = target.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=4):
        return f"{target} reachable"


def _raylet_running() -> bool:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv0 = fh.read().split(b"\0", 1)[0]
        except OSError:
            continue  # the process ended while we looked
        if os.path.basename(argv0) == b"raylet":
            return True
    return False


def check_ray() -> str:
    """A Ray worker node's view: its raylet runs and the cluster's head answers."""
    if not _raylet_running():
        raise OSError("no raylet process in this container")
    target = os.environ.get("RAY_ADDRESS", "ray-head:6379")
    host, _, port = target.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=4):
        return f"raylet running; head {target} reachable"


def main(argv: list[str]) -> int:
    """Run the check named by ``argv[0]``."""
    checks = {"http": check_http, "tcp": check_tcp, "ray": check_ray}
    if len(argv) != 1 or argv[0] not in checks:
        print(f"usage: rpsagg-healthcheck {'|'.join(checks)}", file=sys.stderr)
        return 2
    try:
        print(checks[argv[0]]())
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
