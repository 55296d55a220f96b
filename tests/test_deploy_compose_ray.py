"""The compose file's ``ray`` profile, without a Docker engine (``pytest -k ray`` selects it).

As ``test_deploy_compose.py`` does for the plain and TLS variants: ``docker-compose config``
resolves the file with the profile (from a ``.env`` a user would write), and the services run
as processes, one network namespace per container, with the container's environment and the
service's exact ``command``:

- ``ray-head`` (no CPUs of its own: ``--num-cpus 0``) and ``server`` share the hub namespace
  (``veth_star`` links spokes to the hub only, so services that must reach each other other
  than through the hub live there); the hub's ``/etc/hosts`` names ``ray-head``;
- one ``ray-worker`` replica in a spoke, started once the head passes its compose healthcheck
  (``depends_on: service_healthy``);
- the clients in other spokes.

Since the head has no CPUs, every decode task of the job runs on the worker in the other
namespace: rounds that complete prove the server decoded through the Ray cluster across
"machines". Their estimates must equal the in-process decode of the stored messages.
Ray's temporary files go to a private short directory (``TMPDIR``), its process groups are
stopped at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from deploy_util import COMPOSE, resolve_compose
from service_util import check_rounds_against_inprocess, ip, kill_all, veth_star
from test_deploy_compose import SMOKE_ENV, Container, _healthcheck, _netns

from rpsagg_server.launch import stop_processes

pytest.importorskip("ray", reason="scripts/setup-env.sh test installs rpsagg-server[ray]")

START_TIMEOUT = 180.0


def _wait_healthy(ns: str, box: Container, service: dict[str, Any],
                  proc: subprocess.Popen[bytes], what: str) -> None:
    end = time.monotonic() + START_TIMEOUT
    while True:
        hc = subprocess.run(_netns(ns, box.argv(_healthcheck(service))), env=box.env,
                            capture_output=True, text=True, timeout=60)
        if hc.returncode == 0:
            return
        assert proc.poll() is None, f"{what} exited: {hc.stderr[-2000:]}"
        assert time.monotonic() < end, f"{what} never healthy: {hc.stderr[-2000:]}"
        time.sleep(0.5)


def _tails(logs: dict[str, Any]) -> str:
    """The last lines of each service's log, for a failure message."""
    out = []
    for name, f in logs.items():
        f.flush()
        out.append(f"--- {name}\n" + Path(f.name).read_bytes().decode(errors="replace")[-2500:])
    return "\n".join(out)


def test_compose_ray_profile_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("RPSAGG_SERVER_EXTRAS=[ray]\nRPSAGG_DECODE_BACKEND=ray\n"
                        "RPSAGG_RAY_TOKEN=abc\nRPSAGG_RAY_WORKERS=3\n")
    monkeypatch.setenv("COMPOSE_PROFILES", "ray")
    cfg = resolve_compose([COMPOSE], env_file)
    head, worker, server = (cfg["services"][s] for s in ("ray-head", "ray-worker", "server"))
    assert head["profiles"] == worker["profiles"] == ["ray"]
    assert worker["deploy"]["replicas"] == 3  # scalable: --scale ray-worker=N
    assert worker["depends_on"]["ray-head"]["condition"] == "service_healthy"
    # one image with Ray for the head and the workers; the server built with the same extra
    assert head["build"]["args"]["SERVER_EXTRAS"] == worker["build"]["args"]["SERVER_EXTRAS"]
    assert server["build"]["args"]["SERVER_EXTRAS"] == "[ray]"
    assert server["environment"]["RPSAGG_DECODE_BACKEND"] == "ray"
    assert server["environment"]["RAY_ADDRESS"] == "ray-head:6379"
    for svc in (head, worker, server):  # one cluster token, from .env
        assert svc["environment"]["RAY_AUTH_TOKEN"] == "abc"
        assert svc["environment"]["RAY_AUTH_MODE"] == "token"
    # without the profile (compose starts no service of an inactive profile) the server
    # decodes locally
    monkeypatch.delenv("COMPOSE_PROFILES")
    plain = tmp_path / "plain.env"
    plain.write_text("")
    cfg = resolve_compose([COMPOSE], plain)
    assert cfg["services"]["server"]["environment"]["RPSAGG_DECODE_BACKEND"] == "local"


@pytest.mark.timeout(400)
def test_compose_ray_profile_as_processes_in_namespaces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 2
    env = {**SMOKE_ENV, "RPSAGG_N": str(n), "RPSAGG_ROUNDS": "2", "RPSAGG_TASK": "kmeans",
           "RPSAGG_SERVER_EXTRAS": "[ray]", "RPSAGG_DECODE_BACKEND": "ray",
           "RPSAGG_RAY_TOKEN": secrets.token_hex(32), "RPSAGG_RAY_WORKERS": "1"}
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    monkeypatch.setenv("COMPOSE_PROFILES", "ray")
    cfg = resolve_compose([COMPOSE], env_file)
    svc = cfg["services"]
    assert int(svc["ray-worker"]["deploy"]["replicas"]) == 1
    assert int(svc["client"]["deploy"]["replicas"]) == n
    ray_tmp = tempfile.mkdtemp(prefix="rcr", dir="/tmp")  # short: Ray's unix socket paths
    logs = {name: (tmp_path / f"{name}.log").open("wb")
            for name in ("ray-head", "ray-worker", "server")}
    prefix = f"rpr-{os.getpid()}-"
    tag = f"{os.getpid() % 100000}r"
    groups: list[subprocess.Popen[bytes]] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with veth_star(prefix, n + 1, tag) as (hub, spokes):
            worker_ns, client_spokes = spokes[0], spokes[1:]
            # the head finds its node address through the default route (as in a container)
            ip("-n", hub, "route", "add", "default", "via", worker_ns.addr)
            hosts = {hub: {"server": "127.0.0.1", "ray-head": worker_ns.hub_addr},
                     worker_ns.ns: {"ray-head": worker_ns.hub_addr}}
            for s in client_spokes:
                hosts[s.ns] = {"server": s.hub_addr}
            for ns, names in hosts.items():
                etc = Path("/etc/netns") / ns
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
                    f"{addr} {name}\n" for name, addr in names.items()))

            def box(name: str, role: str, where: Path) -> Container:
                c = Container(svc[name], role, cfg, where)
                c.env["TMPDIR"] = ray_tmp
                return c

            head = box("ray-head", "server", tmp_path / "ray-head")
            groups.append(subprocess.Popen(
                _netns(hub, head.argv(svc["ray-head"]["command"])), env=head.env,
                cwd=tmp_path, start_new_session=True, stdout=logs["ray-head"],
                stderr=subprocess.STDOUT))
            _wait_healthy(hub, head, svc["ray-head"], groups[0], "ray-head")
            worker = box("ray-worker", "server", tmp_path / "ray-worker")
            groups.append(subprocess.Popen(
                _netns(worker_ns.ns, worker.argv(svc["ray-worker"]["command"])),
                env=worker.env, cwd=tmp_path, start_new_session=True,
                stdout=logs["ray-worker"], stderr=subprocess.STDOUT))

            srv = box("server", "server", tmp_path / "server")
            # Compose's network answers service names by DNS; the namespaces have only
            # /etc/hosts, which the c-ares resolver of Ray's C++ gRPC client does not read
            # (the driver then never reaches "ray-head:6379"): the system resolver here
            srv.env["GRPC_DNS_RESOLVER"] = "native"
            srv_proc = subprocess.Popen(_netns(hub, srv.argv(svc["server"]["command"])),
                                        env=srv.env, cwd=tmp_path, stderr=logs["server"])
            procs.append(srv_proc)
            _wait_healthy(hub, srv, svc["server"], srv_proc, "server")
            clients = []
            for i, spoke in enumerate(client_spokes):
                c = Container(svc["client"], "client", cfg, tmp_path / f"client-{i}")
                c.env["HOSTNAME"] = secrets.token_hex(6)
                clients.append(subprocess.Popen(
                    _netns(spoke.ns, c.argv(svc["client"]["command"])), env=c.env,
                    cwd=tmp_path, stderr=subprocess.PIPE))
            procs.extend(clients)
            for p in clients:
                try:
                    _, err = p.communicate(timeout=240)
                except subprocess.TimeoutExpired:
                    pytest.fail("the job did not finish in 240 s\n" + _tails(logs))
                assert p.returncode == 0, err.decode()[-3000:] + _tails(logs)
            get = ("import json, urllib.request as u; print(json.dumps(json.load("
                   "u.urlopen('http://127.0.0.1:8000/api/status', timeout=10))))")
            out = subprocess.run(_netns(hub, [sys.executable, "-c", get]),
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            status = json.loads(out.stdout)
            srv_proc.send_signal(signal.SIGTERM)
            srv_proc.wait(timeout=60)
            assert srv_proc.returncode == 0, _tails(logs)
            # the server's own SIGTERM handler stopped it, not the crash handler that Ray's
            # C++ core installs in a driver (abseil's "*** SIGTERM received at time=...")
            assert b"SIGTERM received" not in (tmp_path / "server.log").read_bytes(), \
                _tails(logs)
            assert all(g.poll() is None for g in groups), "a Ray node exited during the job"
    finally:
        kill_all(procs)
        # `ray start --block` stops what it started on SIGTERM; its group is killed after 15 s
        stop_processes(list(reversed(groups)), grace=15.0, group=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        for f in logs.values():
            f.close()
    assert status["job"]["done"] and status["job"]["steps_done"] == 2
    assert status["config"]["settings"]["decode_backend"] == "ray"
    db = tmp_path / "server" / "volume-rpsagg-data" / "rpsagg.db"
    # k-means rounds carry m vectors: the server fanned out one Ray task per vector, all on
    # the worker (the head has no CPUs); the estimates are the in-process decode's
    assert check_rounds_against_inprocess(str(db), n, int(env["RPSAGG_K"]),
                                          int(env["RPSAGG_D"]), "rand-proj-spatial") == 2
