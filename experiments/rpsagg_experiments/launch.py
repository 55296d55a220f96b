"""Start an ``rpsagg-server`` and ``rpsagg-client`` processes on this machine, and stop them.

The one launcher of local jobs: the README's main command (``rpsagg-cluster``), the
experiments' ``--via-service``, the service tests and the load and chaos benchmarks.

* :class:`ServerProcess` starts the server with ``--port-file`` and waits, with a bound, for
  the port it bound (``--grpc-port 0`` picks a free one); the server writes that file
  atomically once it serves. A server that exits first raises :class:`ServerExited`.
* :class:`LocalJob` adds client processes and stops everything on leaving its ``with``
  block: the clients, then the server, each asked first (``SIGTERM``, or the server's
  ``stop_signal``) and killed once the grace period is over, then reaped. Nothing outlives
  the block, whether it ends normally, by an exception or by Ctrl-C (``KeyboardInterrupt``).
* Children stay in the caller's process group, so a terminal's Ctrl-C reaches them as it
  reaches the caller. ``own_group=True`` starts a process in a session of its own and
  signals its whole group instead: a server started through a wrapper (``prefix``, e.g.
  ``py-spy record --``) then stops with every process under it.

Examples
--------
>>> from pathlib import Path
>>> job = LocalJob(ServerProcess(["--insecure", "--n", "2"], Path("/tmp/port")))
>>> with job:                                                      # doctest: +SKIP
...     for i in range(2):
...         job.start_client(["--server", job.target, "--client-id", f"c{i}", "--insecure"])
...     job.wait_clients(timeout=600)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

PY = sys.executable
SERVER_MODULE = "rpsagg_server"
CLIENT_MODULE = "rpsagg_client.cli"

Proc = subprocess.Popen[bytes]
Output = int | IO[Any] | None


class ServerExited(RuntimeError):
    """The server process ended before it reported its port.

    Attributes
    ----------
    returncode : int
        The server's exit status.
    """

    def __init__(self, returncode: int) -> None:
        super().__init__(f"rpsagg-server exited with {returncode}")
        self.returncode = returncode


def server_command(args: Sequence[str], prefix: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``rpsagg-server`` with ``args`` (under ``prefix``, if any)."""
    return [*prefix, PY, "-m", SERVER_MODULE, *args]


def client_command(args: Sequence[str], module: str = CLIENT_MODULE) -> list[str]:
    """The argv that runs ``rpsagg-client`` (or another client ``module``) with ``args``."""
    return [PY, "-m", module, *args]


def host_port(host: str, port: int) -> str:
    """A gRPC target ``host:port``; an IPv6 address goes in brackets (``[::1]:port``)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def wait_port_file(path: Path, proc: Proc, timeout: float = 60.0) -> int:
    """The port a server subprocess wrote to ``path``, once it wrote it.

    Parameters
    ----------
    path : Path
        The server's ``--port-file``.
    proc : subprocess.Popen
        The server process.
    timeout : float
        Seconds to wait at most.

    Returns
    -------
    int

    Raises
    ------
    ServerExited
        If the process ended first.
    TimeoutError
        If no port came within ``timeout`` seconds.
    """
    end = time.monotonic() + timeout
    while True:
        if path.exists():
            return int(path.read_text())
        if proc.poll() is not None:
            raise ServerExited(proc.returncode)
        if time.monotonic() > end:
            raise TimeoutError(f"rpsagg-server did not write {path} within {timeout:g} s")
        time.sleep(0.05)


def _signal(proc: Proc, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        elif proc.poll() is None:
            os.kill(proc.pid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group ``pgid`` (Linux ``/proc``)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(stat.parent.name))
    return out


def stop_processes(procs: Sequence[Proc], sig: int = signal.SIGTERM, grace: float = 5.0,
                   group: bool = False) -> None:
    """Stop every process: ``sig`` now, ``SIGKILL`` after ``grace`` seconds, then reap.

    Each process gets ``SIGCONT`` first (a stopped process cannot act on ``sig``). One
    deadline covers all of them. ``group`` signals each process's group instead (processes
    started with ``own_group``) and waits for every member of the group, not only its
    leader.
    """
    running = [p for p in procs if p.poll() is None or (group and group_members(p.pid))]
    for p in running:
        _signal(p, signal.SIGCONT, group)
        _signal(p, sig, group)
    end = time.monotonic() + grace
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, end - time.monotonic()))
        while group and group_members(p.pid) and time.monotonic() < end:
            time.sleep(0.05)
        if p.poll() is None or (group and group_members(p.pid)):
            _signal(p, signal.SIGKILL, group)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)
        end = time.monotonic() + 10
        while group and group_members(p.pid) and time.monotonic() < end:
            time.sleep(0.05)


def kill_processes(procs: Sequence[Proc], group: bool = False) -> None:
    """``SIGKILL`` every process still running and reap it."""
    stop_processes(procs, signal.SIGKILL, 0.0, group)


class ServerProcess:
    """An ``rpsagg-server`` subprocess and the port it serves on.

    Parameters
    ----------
    args : sequence of str
        Server flags, without ``--port-file`` (added here).
    port_file : Path
        Where the server writes its port; must not exist yet.
    host : str
        The address clients reach it at (for :attr:`target`).
    env, stdout, stderr
        As for :class:`subprocess.Popen` (default: inherited).
    prefix : sequence of str
        A wrapper command to run the server under.
    start_timeout : float
        Seconds :meth:`start` waits for the port.
    stop_signal : int
        What :meth:`stop` sends first.
    stop_grace : float
        Seconds :meth:`stop` waits before ``SIGKILL``.
    own_group : bool
        Start the server in its own session and signal its whole process group.
    """

    def __init__(self, args: Sequence[str], port_file: Path, *, host: str = "127.0.0.1",
                 env: Mapping[str, str] | None = None, stdout: Output = None,
                 stderr: Output = None, prefix: Sequence[str] = (),
                 start_timeout: float = 60.0, stop_signal: int = signal.SIGTERM,
                 stop_grace: float = 30.0, own_group: bool = False) -> None:
        self.args, self.port_file, self.host = list(args), Path(port_file), host
        self.env, self.stdout, self.stderr, self.prefix = env, stdout, stderr, list(prefix)
        self.start_timeout, self.stop_signal = start_timeout, stop_signal
        self.stop_grace, self.own_group = stop_grace, own_group
        self.proc: Proc | None = None
        self.port = 0

    @property
    def command(self) -> list[str]:
        """The server's argv."""
        return server_command([*self.args, "--port-file", str(self.port_file)], self.prefix)

    @property
    def target(self) -> str:
        """``host:port`` for the clients' ``--server``."""
        return host_port(self.host, self.port)

    def start(self) -> ServerProcess:
        """Start the server and wait for its port; on any failure the process is killed.

        Raises
        ------
        ServerExited, TimeoutError
            As :func:`wait_port_file`.
        """
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=self.stdout,
                                     stderr=self.stderr, start_new_session=self.own_group)
        try:
            self.port = wait_port_file(self.port_file, self.proc, self.start_timeout)
        except BaseException:
            kill_processes([self.proc], self.own_group)
            raise
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop the server (``stop_signal``, then ``SIGKILL`` after the grace period)."""
        if self.proc is not None:
            stop_processes([self.proc], self.stop_signal,
                           self.stop_grace if grace is None else grace, self.own_group)

    def kill(self) -> None:
        """``SIGKILL`` the server and reap it."""
        if self.proc is not None:
            kill_processes([self.proc], self.own_group)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class LocalJob:
    """A server and the client processes that talk to it, stopped together.

    Entering the ``with`` block starts the server (unless it runs already); leaving it stops
    the clients (``SIGTERM``, ``SIGKILL`` after ``client_grace`` seconds) and then the server
    (:meth:`ServerProcess.stop`).

    Parameters
    ----------
    server : ServerProcess
    client_env : mapping, optional
        Environment of the client processes (default: inherited).
    client_grace : float
        Seconds a client has to exit after ``SIGTERM`` when the job stops.
    """

    def __init__(self, server: ServerProcess, *, client_env: Mapping[str, str] | None = None,
                 client_grace: float = 5.0) -> None:
        self.server = server
        self.client_env = client_env
        self.client_grace = client_grace
        self.clients: list[Proc] = []

    @property
    def target(self) -> str:
        """The server's ``host:port``."""
        return self.server.target

    @property
    def processes(self) -> list[Proc]:
        """The server's process (once started) and every client's."""
        return ([self.server.proc] if self.server.proc is not None else []) + self.clients

    def start_client(self, args: Sequence[str], *, module: str = CLIENT_MODULE,
                     stdout: Output = None, stderr: Output = None,
                     env: Mapping[str, str] | None = None) -> Proc:
        """Start a client process (``python -m module args``) and return it."""
        proc = subprocess.Popen(client_command(args, module), stdout=stdout, stderr=stderr,
                                env=self.client_env if env is None else env)
        self.clients.append(proc)
        return proc

    def wait_clients(self, timeout: float) -> list[int]:
        """Exit statuses of the clients, once every one exited.

        Raises
        ------
        subprocess.TimeoutExpired
            If some client still runs after ``timeout`` seconds (one deadline for all).
        """
        end = time.monotonic() + timeout
        return [p.wait(max(0.0, end - time.monotonic())) for p in self.clients]

    def stop(self) -> None:
        """Stop the clients, then the server; every process is reaped on return."""
        try:
            stop_processes(self.clients, signal.SIGTERM, self.client_grace)
        finally:
            self.server.stop()

    def kill(self) -> None:
        """``SIGKILL`` every process of the job and reap it."""
        try:
            kill_processes(self.clients)
        finally:
            self.server.kill()

    def __enter__(self) -> LocalJob:
        if self.server.proc is None:
            self.server.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
