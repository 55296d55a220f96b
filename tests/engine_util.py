"""The real Docker engine for the deployment tests: ``scripts/engine.sh`` and compose projects.

:func:`engine` runs ``scripts/engine.sh up`` once per test session (it finds a running engine
or starts Debian's dockerd, makes Compose v2 available and builds the base image when it
cannot be pulled) and ``scripts/engine.sh down`` at the end when this session started the
daemon. There is no skip: where no engine can be had, the tests fail and say why.

:class:`Project` is one compose project of a test: its own name (so tests never share
containers, networks or volumes), its own ``.env`` (never the developer's), ports published
on 127.0.0.1 at free ports that compose picks, every wait bounded, and ``down -v`` at the end.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import http_util
import pytest
from repo_paths import ROOT

ENGINE = ROOT / "scripts" / "engine.sh"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TLS = ROOT / "docker-compose.tls.yml"
T = TypeVar("T")

_env: dict[str, str] | None = None
_started_here = False
_built: set[str] = set()


def engine() -> dict[str, str]:
    """The environment for ``docker`` (DOCKER_HOST, DOCKER_CONFIG, ...), the engine up."""
    global _env, _started_here
    if _env is None:
        status = subprocess.run([str(ENGINE), "status"], capture_output=True, text=True,
                                timeout=60)
        t0 = time.monotonic()
        out = subprocess.run([str(ENGINE), "up"], capture_output=True, text=True, timeout=1200)
        if out.returncode != 0:
            pytest.fail(f"scripts/engine.sh up failed ({out.returncode}):\n{out.stderr[-3000:]}")
        _started_here = not status.stdout.startswith(("ours", "an engine"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RPSAGG_", "DOCKER_"))}
        for line in out.stdout.splitlines():
            name, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), f"not NAME=value: {line!r}"
            env[name] = value
        print(f"[engine] up in {time.monotonic() - t0:.1f} s", flush=True)
        _env = env
    return dict(_env)


def engine_down() -> None:
    """``scripts/engine.sh down`` when this session started the daemon."""
    if _env is not None and _started_here:
        subprocess.run([str(ENGINE), "down"], capture_output=True, text=True, timeout=120)


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    """``docker ARGS`` against the engine; its stdout."""
    out = subprocess.run(["docker", *args], env=engine(), capture_output=True, text=True,
                         timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({out.returncode}):\n"
                             f"{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return out.stdout


def build_images(*services: str, profile: str | None = None, env: dict[str, str] | None = None,
                 project: str | None = None, timeout: float = 1500) -> None:
    """``docker compose build SERVICES`` once per session per service (the build cache makes a
    build of unchanged sources take seconds; this saves even those). With ``project``, built
    again under that compose project: compose labels an image with the project that built
    it, so the tags then name new image ids (as another checkout's build would make them)."""
    todo = [s for s in services if project is not None or s not in _built]
    if not todo:
        return
    args = ["compose", "--project-directory", str(ROOT), "-f", str(COMPOSE), "-p",
            project or "rpsagg-build"]
    if profile:
        args += ["--profile", profile]
    full = engine()
    full.update(env or {})
    t0 = time.monotonic()
    out = subprocess.run(["docker", *args, "build", *todo], env=full, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"build of {todo} failed:\n{out.stderr[-4000:]}"
    print(f"[engine] built {todo} in {time.monotonic() - t0:.1f} s", flush=True)
    _built.update(todo)


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, every: float = 0.5) -> T:
    """Poll ``fn`` until it returns something other than None/False; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = fn()
            if value is not None and value is not False:
                return value
        except (OSError, ValueError, AssertionError, http.client.HTTPException) as exc:
            # a published port whose server is not up yet: docker-proxy accepts, then drops
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                                 + (f" (last error: {last})" if last else ""))
        time.sleep(every)


def get_json(url: str, timeout: float = 5) -> Any:
    """GET ``url`` and parse its JSON (http_util's, with a shorter default timeout: the
    engine's ports are polled)."""
    return http_util.get_json(url, timeout)


def get_text(url: str, timeout: float = 5) -> str:
    """GET ``url`` as text."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


@dataclass
class Project:
    """A compose project of one test (``docker compose -p NAME``) on the real engine."""

    name: str
    env_file: Path
    settings: dict[str, str] = field(default_factory=dict)
    files: list[Path] = field(default_factory=lambda: [COMPOSE])
    profiles: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.configure()

    def configure(self, **settings: str) -> None:
        """Write the project's ``.env``: loopback ports picked by compose, then the test's
        settings (and ``settings``, which win)."""
        self.settings.update(settings)
        base = {"RPSAGG_GRPC_PUBLISH": "127.0.0.1:", "RPSAGG_HTTP_PUBLISH": "127.0.0.1:",
                "RPSAGG_LOG_LEVEL": "INFO"}
        base.update(self.settings)
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in base.items()))

    def compose_run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``docker compose ... ARGS`` of this project, whatever its exit status."""
        cmd = ["docker", "compose", "--project-directory", str(ROOT), "-p", self.name,
               "--env-file", str(self.env_file)]
        for f in self.files:
            cmd += ["-f", str(f)]
        for p in self.profiles:
            cmd += ["--profile", p]
        return subprocess.run([*cmd, *args], env=engine(), capture_output=True, text=True,
                              timeout=timeout)

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        """``docker compose ... ARGS`` of this project; its stdout."""
        out = self.compose_run(*args, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} failed ({out.returncode}):"
                                 f"\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        return out.stdout

    def containers(self) -> list[dict[str, Any]]:
        """``docker compose ps -a`` as dicts (Name, Service, State, Health, ExitCode, ...)."""
        out = self.compose("ps", "-a", "--format", "json", timeout=60).strip()
        if not out:
            return []
        if out.startswith("["):
            return list(json.loads(out))
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def url(self, service: str = "server", port: int = 8000) -> str:
        """``http://127.0.0.1:PORT`` where compose published ``service``'s ``port``."""
        hostport = self.compose("port", service, str(port), timeout=30).strip()
        host, _, p = hostport.rpartition(":")
        assert host == "127.0.0.1", f"published on {host}, not loopback"
        return f"http://127.0.0.1:{p}"

    def logs(self, *services: str) -> str:
        """The services' logs, no colours, no prefixes."""
        return self.compose("logs", "--no-color", "--no-log-prefix", *services, timeout=60)

    def status(self) -> dict[str, Any]:
        """The server's ``/api/status``."""
        return dict(get_json(self.url() + "/api/status"))

    def wait_job_over(self, timeout: float) -> dict[str, Any]:
        """Wait until the server's job is done or failed; returns ``/api/status``'s job."""
        def over() -> dict[str, Any] | None:
            job = self.status().get("job") or {}
            return job if job.get("state") in ("done", "failed") else None
        return wait_for(f"the job of {self.name} to end", over, timeout)

    def wait_healthy(self, service: str, timeout: float) -> None:
        """Wait until every container of ``service`` reports healthy."""
        def healthy() -> bool:
            mine = [c for c in self.containers() if c["Service"] == service]
            return bool(mine) and all(c.get("Health") == "healthy" for c in mine)
        wait_for(f"{service} of {self.name} to be healthy", healthy, timeout)

    def wait_exited(self, service: str, timeout: float) -> list[dict[str, Any]]:
        """Wait until every container of ``service`` has exited; returns them."""
        def exited() -> list[dict[str, Any]] | None:
            mine = [c for c in self.containers() if c["Service"] == service]
            return mine if mine and all(c["State"] == "exited" for c in mine) else None
        return wait_for(f"every {service} of {self.name} to exit", exited, timeout)

    def down(self) -> None:
        """``down -v``: containers, networks and volumes of the project removed."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout=180,
                     check=False)


def resolve_compose(files: list[Path], env_file: Path) -> dict[str, Any]:
    """``docker compose --env-file ENV -f ... config`` as a dict (what compose would run),
    resolved by Compose v2 without the developer's RPSAGG_* variables."""
    env = engine()
    args = ["docker", "compose", "--project-directory", str(ROOT), "--env-file", str(env_file)]
    for f in files:
        args += ["-f", str(f)]
    out = subprocess.run([*args, "config", "--format", "json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)
    assert isinstance(config, dict)
    return config


def project(request: pytest.FixtureRequest, tmp_path: Path, **settings: str) -> Iterator[Project]:
    """A :class:`Project` named after the test, torn down (``down -v``) afterwards. Before
    that, its containers' states and logs are printed: pytest shows them with a failure
    (captured output of the teardown) and drops them otherwise."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:30]
    p = Project(f"rpsagg-t{os.getpid()}-{slug}", tmp_path / "test.env", settings)
    try:
        yield p
    finally:
        try:  # shown, not checked: the test's own result stands
            print(p.compose("ps", "-a", timeout=60, check=False))
            print(p.compose("logs", "--no-color", "--timestamps", timeout=60, check=False))
        finally:
            p.down()
