"""Container health check of the rpsagg images (standard library only).

    rpsagg-healthcheck http   # server: GET /readyz on 127.0.0.1:$RPSAGG_HTTP_PORT (default 8000)
    rpsagg-healthcheck tcp    # client: the server at $RPSAGG_SERVER accepts TCP connections
    rpsagg-healthcheck ray    # Ray worker: its raylet runs, and the head at $RAY_ADDRESS
                              # (host:port of the GCS) accepts TCP connections

Exit status 0 when healthy, 1 otherwise (what Docker's HEALTHCHECK expects).
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request


def check_http() -> str:
    """The server's readiness probe: the database answers and gRPC is serving."""
    port = int(os.environ.get("RPSAGG_HTTP_PORT", "8000"))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=4) as resp:
        return f"HTTP {resp.status}"


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
