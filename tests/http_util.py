"""Helpers for the tests of the HTTP API: a loopback port, one request (a JSON GET, or any
request with its status), and an ``rpsagg-server`` subprocess of a standing service with its
dashboard."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from service_util import client_command, kill_all, server_command, wait_port_file

#: the default job of :class:`Service`: clients, floats each, vector length
N, K, D = 3, 16, 128


def free_port() -> int:
    """A loopback port that was free a moment ago (uvicorn needs a fixed --http-port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get_json(url: str, timeout: float = 10) -> Any:
    """GET ``url`` and parse its JSON (an HTTP error status raises)."""
    with urllib.request.urlopen(url, timeout=timeout) as res:
        return json.load(res)


def call(url: str, method: str = "GET", body: Any = None, token: str | None = None,
         raw: bytes | None = None) -> tuple[int, Any]:
    """``(status, decoded JSON or bytes)`` of one HTTP request."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=20) as res:
            payload = res.read()
            status = res.status
    except urllib.error.HTTPError as exc:
        payload, status = exc.read(), exc.code
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload


class Service:
    """An ``rpsagg-server`` subprocess with its dashboard on a loopback port."""

    def __init__(self, tmp: Path, tag: str, *flags: str, grpc_port: int = 0,
                 http_port: int = 0, default: tuple[str, ...] | None = None,
                 prefix: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.http_port = http_port or free_port()
        port_file = tmp / f"port-{tag}"
        job = default if default is not None else (
            "--n", str(N), "--k", str(K), "--d", str(D), "--task", "mean", "--data-r", "2",
            "--rounds", "2", "--round-timeout", "120")
        self.log = tmp / f"server-{tag}.log"
        self.proc = subprocess.Popen(server_command([
            "--host", "127.0.0.1", "--grpc-port", str(grpc_port),
            "--http-port", str(self.http_port), "--db", str(tmp / "jobs.db"),
            "--linger", "-1", "--port-file", str(port_file), *job, *flags,
        ], prefix), stderr=open(self.log, "wb"))  # noqa: SIM115
        self.procs: list[subprocess.Popen[bytes]] = [self.proc]
        self.port = wait_port_file(port_file, self.proc)
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.target = f"127.0.0.1:{self.port}"

    def api(self, path: str, method: str = "GET", body: Any = None,
            token: str | None = None) -> tuple[int, Any]:
        return call(self.url + path, method, body, token)

    def create(self, token: str | None = None, **settings: Any) -> str:
        status, job = self.api("/api/jobs", "POST", settings, token)
        assert status == 201, (status, job)
        return str(job["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        status, job = self.api(f"/api/jobs/{job_id}")
        assert status == 200, (status, job)
        return dict(job)

    def client(self, client_id: str, *flags: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(client_command([
            "--server", self.target, "--client-id", client_id, *flags,
        ]), stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def job_db(self, job_id: str) -> str:
        return str(self.tmp / "jobs.db.d" / f"{job_id}.db")

    def close(self) -> None:
        kill_all(self.procs)
