"""Deployment acceptance 3: the Dockerfiles without a Docker engine.

A hadolint-style static check of ``docker/*.Dockerfile`` (pinned slim base, non-root
``USER`` before ``CMD``, ``HEALTHCHECK``, no remote ``ADD``, no secrets in ``ENV``/``ARG``,
no FastAPI in the client image), and the build stage replayed in a temporary directory:
its ``COPY`` steps (with ``.dockerignore``) and every ``RUN`` line, verbatim, with
``/opt/venv`` a fresh virtual environment; then the role's entry point must run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_util import (
    DOCKERFILES,
    copy_context,
    env_pairs,
    expand,
    json_args,
    parse_dockerfile,
    run_flags,
)

PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")
PIP_CACHE = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
SECRET_NAME = re.compile(r"TOKEN|KEY|PASSWORD|SECRET|PASSWD|CREDENTIAL", re.IGNORECASE)


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_dockerfile_lint(role: str) -> None:
    stages = parse_dockerfile(DOCKERFILES[role])
    assert len(stages) >= 2, "a build stage and a runtime stage"
    for st in stages:
        assert PINNED_BASE.match(st.base), f"base image not pinned to a slim tag: {st.base}"
        for instr, args in st.instructions:
            if instr == "ADD":
                assert not re.search(r"https?://|git@", args), f"ADD of a remote URL: {args}"
            if instr in ("ENV", "ARG"):
                for key, value in env_pairs(args) if instr == "ENV" else [
                        (a.partition("=")[0], a.partition("=")[2]) for a in args.split()]:
                    assert not (SECRET_NAME.search(key) and value), f"secret in {instr}: {key}"
            if instr == "RUN":
                _, cmd = run_flags(args)
                if "apt-get install" in cmd:
                    assert "--no-install-recommends" in cmd
                    assert "rm -rf /var/lib/apt/lists/*" in cmd
                    pkgs = [w for w in cmd.split("apt-get install", 1)[1].split("&&")[0].split()
                            if not w.startswith("-")]
                    assert all("=" in p for p in pkgs), f"unpinned apt package in {pkgs}"
                assert "curl" not in cmd and "wget" not in cmd, "nothing fetched by hand"
    final = stages[-1]
    order = [i for i, _ in final.instructions]
    assert "USER" in order and "CMD" in order and "HEALTHCHECK" in order
    users = final.args("USER")
    assert order.index("USER") < order.index("CMD")
    assert users[-1].split(":")[0] not in ("root", "0"), "must not run as root"
    assert "sudo" not in " ".join(final.args("RUN"))
    health = final.args("HEALTHCHECK")[-1]
    assert " CMD " in f" {health} " and "NONE" not in health
    assert json_args(final.args("CMD")[-1])[0] == f"rpsagg-{role}"
    # only the build stage installs Python packages; the runtime stage copies its venv
    assert not any("pip " in a for a in final.args("RUN"))
    assert any(a.startswith("--from=") for a in final.args("COPY"))
    text = " ".join(a for st in stages for _, a in st.instructions).lower()
    if role == "client":
        assert "dataset-fashion-mnist" in " ".join(final.args("RUN"))
        assert "./server" not in text and "fastapi" not in text and "uvicorn" not in text


def _replay_build_stage(role: str, root: Path) -> Path:
    """Run the build stage's COPY and RUN steps under ``root``; returns the venv's path."""
    build = parse_dockerfile(DOCKERFILES[role])[0]
    root.mkdir(parents=True)
    venv = root / "opt-venv"
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "HOME": str(root), "LANG": "C.UTF-8"}
    for key in ("PIP_FIND_LINKS", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "RPSAGG_CACHE_DIR",
                "SSL_CERT_FILE", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"):
        if key in os.environ:
            env[key] = os.environ[key]
    workdir = root
    ran = 0
    for instr, args in build.instructions:
        if instr == "ENV":
            for key, value in env_pairs(args):
                env[key] = expand(value, env).replace("/opt/venv", str(venv))
        elif instr == "ARG":  # the build argument's default (compose may pass another)
            name, _, default = args.partition("=")
            env.setdefault(name.strip(), default.strip().strip('"'))
        elif instr == "WORKDIR":
            workdir = root / expand(args, env).lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif instr == "COPY":
            src, dest = args.split()
            assert not src.startswith("--"), args
            copy_context(src, workdir / dest)
            stale = [q for q in (workdir / dest).rglob("*")
                     if q.name.endswith((".egg-info", ".so")) or q.name == "__pycache__"]
            assert not stale, f".dockerignore let build leftovers into the context: {stale}"
        elif instr == "RUN":
            flags, cmd = run_flags(args)
            run_env = dict(env)
            if any(f.startswith("--mount=type=cache") and "/.cache/pip" in f for f in flags):
                # BuildKit's persistent pip cache: here the host's (downloads, built wheels)
                run_env["PIP_CACHE_DIR"] = PIP_CACHE
            out = subprocess.run(["sh", "-ec", cmd], cwd=workdir, env=run_env, capture_output=True,
                                 text=True, timeout=240)
            assert out.returncode == 0, f"RUN {cmd}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
            ran += 1
    assert ran >= 2 and (venv / "bin" / "python").exists()
    return venv


@pytest.mark.timeout(300)
def test_build_stages_install_each_role_in_a_fresh_venv(tmp_path: Path) -> None:
    """Both roles at once (two processes) to halve the wall time of two pip installs."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        futures = {role: pool.submit(_replay_build_stage, role, tmp_path / role)
                   for role in sorted(DOCKERFILES)}
        venvs = {role: f.result() for role, f in futures.items()}
    for role, venv in venvs.items():
        out = subprocess.run([str(venv / "bin" / f"rpsagg-{role}"), "--help"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and f"usage: rpsagg-{role}" in out.stdout, out.stderr
        probe = ("import importlib.util as u; "
                 "print(*(bool(u.find_spec(m)) for m in ('fastapi', 'uvicorn', 'rpsagg_server', "
                 "'rpsagg_client', 'fht_cpu')))")
        found = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True,
                               text=True, timeout=60, cwd=tmp_path).stdout.split()
        has = dict(zip(("fastapi", "uvicorn", "rpsagg_server", "rpsagg_client", "fht_cpu"),
                       (f == "True" for f in found), strict=True))
        assert has["fht_cpu"]
        if role == "client":
            assert has["rpsagg_client"]
            assert not has["fastapi"] and not has["uvicorn"] and not has["rpsagg_server"], has
        else:
            assert has["rpsagg_server"] and has["fastapi"] and has["uvicorn"], has
