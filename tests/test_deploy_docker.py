"""A hadolint-style static check of ``docker/*.Dockerfile``: a pinned slim base by default
(``BASE_IMAGE``, which ``scripts/engine.sh`` builds locally when it cannot be pulled), no
``# syntax=`` line (it makes BuildKit fetch a frontend image from Docker Hub), non-root
``USER`` before ``CMD`` with the uid and gid of the named ``rpsagg`` user and group,
``HEALTHCHECK``, no remote ``ADD``, no secrets in ``ENV``/``ARG``, no FastAPI in the client
image, a C compiler in the build stage only (the build fails without ``rpsagg._fast``). The
images are built and run on a real engine by tests/test_deploy_engine.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from deploy_util import (
    DOCKERFILES,
    env_pairs,
    json_args,
    parse_dockerfile,
    run_flags,
)

PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")
PIP_CACHE = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
SECRET_NAME = re.compile(r"TOKEN|KEY|PASSWORD|SECRET|PASSWD|CREDENTIAL", re.IGNORECASE)


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_dockerfile_lint(role: str) -> None:
    text = DOCKERFILES[role].read_text()
    assert "# syntax=" not in text, "the syntax line needs Docker Hub"
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
                    assert "rm -rf /var/lib/apt/lists/*" in cmd
                    for part in cmd.split("apt-get install")[1:]:  # every install of the RUN
                        words = re.split(r"&&|\|\||;|[{}()]", part)[0].split()
                        assert "--no-install-recommends" in words
                        pkgs = [w for w in words if not w.startswith("-")]
                        assert all("=" in p for p in pkgs), f"unpinned apt package in {pkgs}"
                assert "curl" not in cmd and "wget" not in cmd, "nothing fetched by hand"
    final = stages[-1]
    order = [i for i, _ in final.instructions]
    assert "USER" in order and "CMD" in order and "HEALTHCHECK" in order
    users = final.args("USER")
    assert order.index("USER") < order.index("CMD")
    assert users[-1].split(":")[0] not in ("root", "0"), "must not run as root"
    uid, _, gid = users[-1].partition(":")
    setup = " ".join(final.args("RUN"))
    assert f"groupadd --system --gid {gid} rpsagg" in setup, "USER's gid has no name"
    assert f"useradd --system --uid {uid} --gid rpsagg" in setup
    assert "sudo" not in " ".join(final.args("RUN"))
    health = final.args("HEALTHCHECK")[-1]
    assert " CMD " in f" {health} " and "NONE" not in health
    assert json_args(final.args("CMD")[-1])[0] == f"rpsagg-{role}"
    # only the build stage installs Python packages; the runtime stage copies its venv
    assert not any("pip " in a for a in final.args("RUN"))
    assert any(a.startswith("--from=") for a in final.args("COPY"))
    # the compiled kernels (rpsagg._fast): the build stage has a compiler, fails when the
    # module does not build or load, and the runtime stage has no compiler
    build = " ".join(a for st in stages[:-1] for a in st.args("RUN"))
    assert "gcc=" in build and "libc6-dev=" in build and "libpython3.11-dev=" in build
    assert "RPSAGG_NATIVE_REQUIRED=1 pip install" in re.sub(r"\s+", " ", build)
    assert "product_path() == 'tiles'" in build
    assert not re.search(r"\b(gcc|g\+\+|clang|build-essential|libc6-dev)\b",
                         " ".join(final.args("RUN"))), "a compiler in the runtime stage"
    text = " ".join(a for st in stages for _, a in st.instructions).lower()
    if role == "client":
        assert "dataset-fashion-mnist" in " ".join(final.args("RUN"))
        assert "./server" not in text and "fastapi" not in text and "uvicorn" not in text
