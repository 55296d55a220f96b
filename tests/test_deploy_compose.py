"""Deployment acceptance 1 and 2: docker-compose.yml without a Docker engine.

1. ``docker-compose config -q`` (Debian's docker-compose) accepts the compose file alone and
   with the TLS override.
2. A compose smoke test: the services that ``docker-compose config`` resolves (with a
   ``.env`` that picks a fast job, as a user would) run as processes, one network namespace
   per container, each with its own ``/etc/hosts`` in which ``server`` is the server
   namespace's address, as on compose's network. Each process gets the container's
   environment (the Dockerfile's ``ENV`` of the final stage, then the service's
   ``environment``; ``HOSTNAME`` a container id) and runs the service's exact ``command``;
   container paths (the venv, ``COPY`` targets, the named volume, ``/run/secrets/*``) map to
   this machine's files. The server starts first and the clients once its compose
   healthcheck passes (``depends_on: service_healthy``); ``deploy.replicas`` clients then
   run 3 rounds, and a probe namespace reads the dashboard API at ``http://server:8000``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from deploy_util import (
    COMPOSE,
    COMPOSE_TLS,
    DOCKERFILES,
    ROOT,
    env_pairs,
    expand,
    parse_dockerfile,
    resolve_compose,
)
from service_util import kill_all, veth_star

# the fast job of the smoke test, given the way a user would: a .env file
SMOKE_ENV = {"RPSAGG_N": "3", "RPSAGG_K": "8", "RPSAGG_D": "64", "RPSAGG_TASK": "mean",
             "RPSAGG_DATA": "synthetic", "RPSAGG_DATA_R": "1", "RPSAGG_ROUNDS": "3",
             "RPSAGG_EVAL": "true", "RPSAGG_ROUND_TIMEOUT": "60"}


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, COMPOSE_TLS]], ids=["plain", "tls"])
def test_compose_config_is_valid(files: list[Path], tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("")
    resolve_compose(files, env_file)  # skips without docker-compose
    args = ["docker-compose", "--env-file", str(env_file)]
    for f in files:
        args += ["-f", str(f)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RPSAGG_")}
    out = subprocess.run([*args, "config", "-q"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "", out.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(COMPOSE.read_text().replace("    healthcheck:\n", "    healthcheks:\n", 1))
    out = subprocess.run(["docker-compose", "--env-file", str(env_file), "-f", str(broken),
                          "config", "-q"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0, "config -q must reject a misspelt key"


def test_compose_defaults_are_the_demo(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("")
    cfg = resolve_compose([COMPOSE], env_file)
    env = cfg["services"]["server"]["environment"]
    assert {k: env[k] for k in ("RPSAGG_N", "RPSAGG_K", "RPSAGG_D", "RPSAGG_ESTIMATOR",
                                "RPSAGG_TRANSFORM", "RPSAGG_TASK", "RPSAGG_DATA",
                                "RPSAGG_EVAL")} == {
        "RPSAGG_N": "10", "RPSAGG_K": "102", "RPSAGG_D": "1024",
        "RPSAGG_ESTIMATOR": "rand-proj-spatial", "RPSAGG_TRANSFORM": "avg",
        "RPSAGG_TASK": "power-iteration", "RPSAGG_DATA": "fashion-mnist", "RPSAGG_EVAL": "true"}
    assert cfg["services"]["client"]["deploy"]["replicas"] == 10
    # the unauthenticated dashboard listens on every address inside the container (the
    # server's default is loopback only) and is published on the host's loopback only
    assert env["RPSAGG_HTTP_HOST"] == "0.0.0.0"
    ports = [str(p) for p in cfg["services"]["server"]["ports"]]  # HOST_IP:PORT:TARGET/tcp
    assert [p for p in ports if p.split("/")[0].endswith(":8000")] == [
        "127.0.0.1:8000:8000/tcp"], ports
    assert any(str(v).endswith(":/data:rw") or ":/data" in str(v)
               for v in cfg["services"]["server"]["volumes"])
    assert "rpsagg-data" in cfg["volumes"]
    # every variable the compose file reads is documented in .env.example
    example = {line.split("=", 1)[0] for line in (ROOT / ".env.example").read_text().splitlines()
               if line and not line.startswith("#")}
    used = set()
    for f in (COMPOSE, COMPOSE_TLS):
        import re

        used |= set(re.findall(r"\$\{([A-Z_]+)", f.read_text()))
    assert used <= example, used - example


class Container:
    """How one service's container maps onto this machine: environment and paths."""

    def __init__(self, service: dict[str, Any], role: str, cfg: dict[str, Any],
                 root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        final = parse_dockerfile(DOCKERFILES[role])[-1]
        self.paths: dict[str, str] = {"/opt/venv": sys.prefix}
        for args in final.args("COPY"):
            words = args.split()
            if not words[0].startswith("--from"):
                self.paths[words[-1]] = str(ROOT / words[0])
        for vol in service.get("volumes", []):
            name, target = str(vol).split(":")[:2]
            host = root / f"volume-{name}"
            host.mkdir(parents=True, exist_ok=True)
            self.paths[target] = str(host)
        for s in service.get("secrets", []):
            name = s["source"] if isinstance(s, dict) else s
            self.paths[f"/run/secrets/{name}"] = cfg["secrets"][name]["file"]
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(root)}
        for args in final.args("ENV"):
            for key, value in env_pairs(args):
                env[key] = expand(value, env)
        env.update({k: str(v) for k, v in (service.get("environment") or {}).items()})
        self.env = {k: self.map(v) for k, v in env.items()}
        self.env["PATH"] = f"{sys.prefix}/bin:{os.environ['PATH']}"
        if "RPSAGG_CACHE_DIR" in os.environ:  # the session's beta cache (tests/conftest.py)
            self.env["RPSAGG_CACHE_DIR"] = os.environ["RPSAGG_CACHE_DIR"]

    def map(self, value: str) -> str:
        """A container path (or a value containing one) as this machine's path."""
        for src in sorted(self.paths, key=len, reverse=True):
            value = value.replace(src, self.paths[src])
        return value

    def argv(self, command: list[str]) -> list[str]:
        """A command with its container paths mapped."""
        return [self.map(str(a)) for a in command]


def _healthcheck(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", test
    return list(test[1:])


def _netns(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("variant", ["plain", "tls"])
def test_compose_services_as_processes_in_namespaces(variant: str, tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    lines = [f"{k}={v}" for k, v in SMOKE_ENV.items()]
    files = [COMPOSE]
    if variant == "tls":
        files.append(COMPOSE_TLS)
        certs = tmp_path / "certs"
        subprocess.run([str(ROOT / "scripts" / "make-test-ca.sh"), "-o", str(certs)],
                       check=True, capture_output=True, timeout=60)
        lines.append(f"RPSAGG_CERTS={certs}")
    env_file.write_text("\n".join(lines) + "\n")
    cfg = resolve_compose(files, env_file)
    server, client = cfg["services"]["server"], cfg["services"]["client"]
    replicas = int(client["deploy"]["replicas"])
    assert replicas == 3
    prefix = f"rpsc-{os.getpid()}-{variant[0]}-"
    tag = f"{os.getpid() % 100000}{variant[0]}"
    procs: list[subprocess.Popen[bytes]] = []
    with veth_star(prefix, replicas + 1, tag) as (hub, spokes):
        # compose's network: every container resolves the service name "server"
        for ns, server_addr in [(hub, "127.0.0.1"), *((s.ns, s.hub_addr) for s in spokes)]:
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{server_addr} server\n")
        try:
            srv = Container(server, "server", cfg, tmp_path / "server")
            srv_proc = subprocess.Popen(_netns(hub, srv.argv(server["command"])), env=srv.env,
                                        cwd=tmp_path, stderr=subprocess.PIPE)
            procs.append(srv_proc)
            end = time.monotonic() + 90  # depends_on: condition: service_healthy
            while True:
                hc = subprocess.run(_netns(hub, srv.argv(_healthcheck(server))), env=srv.env,
                                    capture_output=True, text=True, timeout=30)
                if hc.returncode == 0:
                    break
                assert srv_proc.poll() is None, srv_proc.communicate()[1].decode()[-3000:]
                assert time.monotonic() < end, f"server never healthy: {hc.stderr}"
                time.sleep(0.5)
            ids = []
            clients = []
            for i in range(replicas):
                box = Container(client, "client", cfg, tmp_path / f"client-{i}")
                box.env["HOSTNAME"] = secrets.token_hex(6)  # what Docker sets: the container id
                ids.append(box.env["HOSTNAME"])
                clients.append(box)
                procs.append(subprocess.Popen(_netns(spokes[i].ns, box.argv(client["command"])),
                                              env=box.env, cwd=tmp_path,
                                              stderr=subprocess.PIPE))
            hc = subprocess.run(_netns(spokes[0].ns, clients[0].argv(_healthcheck(client))),
                                env=clients[0].env, capture_output=True, text=True, timeout=30)
            assert hc.returncode == 0, hc.stderr
            for p in procs[1:]:
                _, err = p.communicate(timeout=120)
                assert p.returncode == 0, err.decode()[-3000:]
            # the dashboard API, read from another namespace through the name "server"
            probe = spokes[replicas].ns
            get = ("import json, sys, urllib.request as u; print(json.dumps([json.load("
                   "u.urlopen('http://server:8000' + p, timeout=10)) for p in sys.argv[1:]]))")
            out = subprocess.run(_netns(probe, [sys.executable, "-c", get, "/api/status",
                                                "/api/rounds?limit=10"]),
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            status, page = json.loads(out.stdout)
            assert srv_proc.poll() is None, "RPSAGG_LINGER=-1 keeps the server up"
            srv_proc.send_signal(signal.SIGTERM)
            _, err = srv_proc.communicate(timeout=30)
            assert srv_proc.returncode == 0, err.decode()[-3000:]
        finally:
            kill_all(procs)
    conf = status["config"]
    assert (conf["n"], conf["k"], conf["d"], conf["task"], conf["rounds"]) == (3, 8, 64, "mean",
                                                                               3)
    assert conf["scheme"] == "rand-proj-spatial" and conf["evaluation"] is True
    assert conf["settings"]["insecure"] is (variant == "plain")
    assert sorted(c["client_id"] for c in status["clients"]) == sorted(ids)
    assert sorted(c["index"] for c in status["clients"]) == [0, 1, 2]
    assert status["job"]["done"] and status["job"]["steps_done"] == 3
    rounds = page["rounds"]
    assert [r["state"] for r in rounds] == ["done"] * 3
    for r in rounds:
        assert sorted(r["clients"]["arrived"]) == sorted(ids)
        assert r["squared_error"]["estimate"] >= 0.0
    assert (tmp_path / "server" / "volume-rpsagg-data" / "rpsagg.db").exists()
