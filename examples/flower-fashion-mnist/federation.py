"""A local Flower federation: one SuperLink and N SuperNodes as processes on 127.0.0.1.

Flower's own deployment tools, nothing simulated: ``flower-superlink``, ``flower-supernode``
(each node runs its ClientApps in subprocesses) and ``flwr run``, with a private
``FLWR_HOME`` whose ``config.toml`` names the SuperLink. Every process runs in its own
process group and the whole group is ended on exit, including the ``flower-superexec`` and
``flwr-clientapp`` / ``flwr-serverapp`` children Flower starts.
"""

from __future__ import annotations

import contextlib
import os
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
    """

    def __init__(self, nodes: int, workdir: Path | None = None,
                 startup_timeout: float = 60.0) -> None:
        self.nodes = nodes
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="flower-fed-"))
        self.home = self.workdir / "flwr-home"
        self.startup_timeout = startup_timeout
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.env = dict(os.environ, FLWR_HOME=str(self.home), FLWR_DISABLE_UPDATE_CHECK="1",
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
        """Start the SuperLink, wait for its health check, then start the SuperNodes."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "local-fed"\n\n[superlink.local-fed]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        link = self._spawn("superlink", [
            _tool("flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(self.port),
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

        Raises ``RuntimeError`` when the run fails and ``TimeoutError`` after ``timeout``
        seconds (the run is then stopped with the rest of the federation on exit).
        """
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise RuntimeError(f"federation process {i} exited with {proc.returncode}; "
                                   f"see the logs in {self.workdir}")
        overrides = " ".join(f"{k}={_toml(v)}" for k, v in run_config.items())
        cmd = [_tool("flwr"), "run", str(app_dir), "local-fed", "--stream",
               "--run-config", overrides]
        try:
            done = subprocess.run(cmd, env=self.env, capture_output=True, timeout=timeout,
                                  start_new_session=True, check=False)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"flwr run did not finish within {timeout} s") from exc
        out = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
        if done.returncode != 0 or "ServerApp raised an exception" in out:
            raise RuntimeError(f"flwr run failed (exit {done.returncode}):\n{out[-4000:]}")
        return out

    def stop(self) -> None:
        """End every process group (TERM, then KILL after 10 s) and remove a temporary dir."""
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            _signal_group(proc, signal.SIGKILL)  # children (superexec, clientapps) too
            proc.wait()
        groups = [p.pid for p in self.procs]
        deadline = time.monotonic() + 10.0
        while any(live_members(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGKILL is delivered asynchronously
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


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _toml(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
