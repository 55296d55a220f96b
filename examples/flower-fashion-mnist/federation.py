"""A local Flower federation on 127.0.0.1: Flower's deployment or simulation engine.

Flower's own tools, nothing emulated: ``flower-superlink`` and ``flwr run`` with a private
``FLWR_HOME`` whose ``config.toml`` names the SuperLink, and either

* the **deployment engine**: N ``flower-supernode`` processes (each runs its ClientApps in
  subprocesses), or
* the **simulation engine**: the SuperLink started with ``--simulation``; ``flwr run``
  passes ``--federation-config num-supernodes=N`` and Flower runs the N virtual
  SuperNodes' ClientApps on Ray (``flwr[simulation]``).

Flower's runtime dependency installation (``uv sync`` of the app's dependencies from the
package index before a run) is turned off (``--disable-runtime-dependency-installation``
and ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``): the app runs in the environment
that runs the federation, where rpsagg-flower is installed from the repository.

Every process runs in its own process group. On exit every process the federation started
is ended, with all its descendants, including those Flower starts in sessions of their own
(``flower-superexec``, ``flwr-serverapp``, ``flwr-clientapp``, Ray's workers).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (Flower's processes cannot be
    given port 0 and report the port back; a taken port makes start() fail loudly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


class LocalFederation:
    """``with LocalFederation(10) as fed: fed.run(app_dir, {...})``.

    Parameters
    ----------
    nodes : int
        SuperNodes; node ``i`` gets ``partition-id=i num-partitions=nodes``.
    workdir : Path, optional
        Where ``FLWR_HOME`` and the logs go (default: a temporary folder, removed on exit).
    startup_timeout : float
        Seconds for the SuperLink to answer its health check.
    simulation : bool
        Flower's simulation engine (virtual SuperNodes on Ray) instead of N SuperNode
        processes.
    """

    def __init__(self, nodes: int, workdir: Path | None = None,
                 startup_timeout: float = 60.0, simulation: bool = False) -> None:
        self.nodes = nodes
        self.simulation = simulation
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="flower-fed-"))
        self.home = self.workdir / "flwr-home"
        self.startup_timeout = startup_timeout
        self.procs: list[subprocess.Popen[bytes]] = []
        self.groups_ended: list[int] = []  # the process groups stop() ended
        self.port = 0
        self.env = dict(os.environ, FLWR_HOME=str(self.home), FLWR_DISABLE_UPDATE_CHECK="1",
                        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")

    def _spawn(self, name: str, args: list[str], home: Path | None = None
               ) -> subprocess.Popen[bytes]:
        env = self.env if home is None else dict(self.env, FLWR_HOME=str(home))
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> LocalFederation:
        """Start the SuperLink, wait for its health check, then start the SuperNodes
        (deployment engine)."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "local-fed"\n\n[superlink.local-fed]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        link = self._spawn("superlink", [
            _tool("flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(self.port),
            *(["--simulation"] if self.simulation else []),
        ])
        deadline = time.monotonic() + self.startup_timeout
        while not self._healthy():
            if link.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {link.returncode}; see "
                                   f"{self.workdir / 'superlink.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the SuperLink did not answer within "
                                   f"{self.startup_timeout} s; see {self.workdir}")
            time.sleep(0.2)
        if self.simulation:
            return self
        for i in range(self.nodes):
            self._spawn(f"supernode-{i}", [
                _tool("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                "--port", str(free_port()),
                "--node-config", f"partition-id={i} num-partitions={self.nodes}",
            ], home=self.home / f"node-{i}")  # each node installs the app into its own home
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def run(self, app_dir: Path, run_config: dict[str, object], timeout: float) -> str:
        """``flwr run app_dir`` on this federation with ``--stream``; returns its output.

        Raises ``RuntimeError`` when the run fails (``flwr run --stream`` exits 0 for a run
        that failed in the ServerApp, the simulation or the app's install: the run's status
        is asked of the SuperLink, :meth:`run_status`, and must be ``finished:completed``)
        and ``TimeoutError`` after ``timeout`` seconds (the run is then stopped with the
        rest of the federation on exit).
        """
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise RuntimeError(f"federation process {i} exited with {proc.returncode}; "
                                   f"see the logs in {self.workdir}")
        overrides = " ".join(f"{k}={_toml(v)}" for k, v in run_config.items())
        cmd = [_tool("flwr"), "run", str(app_dir), "local-fed", "--stream",
               "--run-config", overrides]
        if self.simulation:
            cmd += ["--federation-config", f"num-supernodes={self.nodes}"]
        log = self.workdir / "flwr-run.log"
        with open(log, "wb") as sink:
            proc = subprocess.Popen(cmd, env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            self.procs.append(proc)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                raise TimeoutError(f"flwr run did not finish within {timeout} s; see "
                                   f"{log}") from exc
            finally:  # Ctrl-C or a timeout: stop() ends it with the rest
                if proc.poll() is not None:
                    self.procs.remove(proc)
        out = log.read_text(errors="replace")
        started = re.search(r"Successfully started run (\d+)", out)
        if proc.returncode != 0 or started is None:
            raise RuntimeError(f"flwr run failed (exit {proc.returncode}):\n{out[-4000:]}")
        status = self.final_status(int(started[1]))
        if status != "finished:completed":
            raise RuntimeError(f"flwr run {started[1]} ended {status}:\n{out[-4000:]}")
        return out

    def final_status(self, run_id: int, timeout: float = 60.0) -> str:
        """The run's status once the SuperLink has recorded its end (``finished:...``): the
        stream of ``flwr run`` can close a moment before the SuperLink writes it."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.run_status(run_id)
            if status.startswith("finished") or time.monotonic() > deadline:
                return status
            time.sleep(0.5)

    def run_status(self, run_id: int) -> str:
        """The run's status as the SuperLink records it (``flwr list --run-id``), e.g.
        ``finished:completed`` or ``finished:failed``."""
        listed = subprocess.run(
            [_tool("flwr"), "list", "local-fed", "--run-id", str(run_id), "--format", "json"],
            env=self.env, capture_output=True, text=True, timeout=60)
        if listed.returncode != 0 or "{" not in listed.stdout:
            raise RuntimeError(f"flwr list --run-id {run_id} failed: "
                               f"{listed.stdout[-2000:]}{listed.stderr[-2000:]}")
        runs = json.loads(listed.stdout[listed.stdout.index("{"):])["runs"]
        return str(runs[0]["status"])

    def stop(self) -> None:
        """End every process the federation started and all their descendants (TERM, then
        KILL after 10 s), and remove a temporary dir.

        Flower starts ``flower-superexec`` in a session of its own, so ending the
        SuperLink's process group is not enough: the descendants are collected from
        ``/proc`` (before any is signalled, while the tree is intact) and each one's
        process group is ended too."""
        tree = descendants([p.pid for p in self.procs])
        groups = sorted({p.pid for p in self.procs} | {_pgid(pid) for pid in tree} - {0})
        groups = [g for g in groups if g != os.getpgid(0)]  # never our own group
        for g in groups:
            _killpg(g, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        tree |= descendants([p.pid for p in self.procs])  # started while we waited
        groups = sorted(set(groups) | {_pgid(pid) for pid in tree} - {0, os.getpgid(0)})
        for g in groups:
            _killpg(g, signal.SIGKILL)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        deadline = time.monotonic() + 10.0
        while any(live_members(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGKILL is delivered asynchronously
        self.groups_ended = groups
        self.procs.clear()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def live_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are still running (zombies, which are dead and only
    wait to be reaped, do not count). Linux ``/proc``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _stat(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...


def process_state(pid: int) -> str | None:
    """A process's state letter (``R``, ``S``, ``Z``...), or None once it is gone (Linux
    ``/proc``)."""
    fields = _stat(pid)
    return fields[0] if fields else None


def _pgid(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[2]) if fields else 0


def descendants(pids: list[int]) -> set[int]:
    """Every live process below ``pids`` in the process tree (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _toml(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
