"""Helpers for the deployment tests: read the Dockerfiles and the compose files as data.

No Docker engine is needed: a Dockerfile is parsed into stages of instructions, and the
compose files are resolved by Debian's ``docker-compose config`` (interpolation of ``.env``,
merging of the TLS override) into the exact commands, environments, mounts and healthchecks
that the tests then run as processes.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TLS = ROOT / "docker-compose.tls.yml"
DOCKERFILES = {"server": ROOT / "docker" / "server.Dockerfile",
               "client": ROOT / "docker" / "client.Dockerfile"}


@dataclass
class Stage:
    """One ``FROM`` stage: its base image, name and ``(INSTRUCTION, arguments)`` list."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        """The arguments of every ``instruction`` of this stage, in order."""
        return [a for i, a in self.instructions if i == instruction]


def parse_dockerfile(path: Path) -> list[Stage]:
    """Stages of a Dockerfile (comments dropped, ``\\``-continued lines joined)."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#") and not pending:
            continue
        if raw.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line:
            lines.append(line)
    stages: list[Stage] = []
    for line in lines:
        instr, _, args = line.partition(" ")
        instr, args = instr.upper(), args.strip()
        if instr == "FROM":
            words = args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        else:
            assert stages, f"{path}: {instr} before FROM"
            stages[-1].instructions.append((instr, args))
    return stages


def run_flags(args: str) -> tuple[list[str], str]:
    """Split ``RUN --mount=... cmd`` into its flags and the shell command."""
    flags = []
    rest = args
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        flags.append(flag)
        rest = rest.lstrip()
    return flags, rest


def env_pairs(args: str) -> list[tuple[str, str]]:
    """``ENV A=1 B="x y"`` -> ``[("A", "1"), ("B", "x y")]`` (``$VAR`` left unexpanded)."""
    out = []
    for word in shlex.split(args, posix=True):
        key, eq, value = word.partition("=")
        assert eq, f"ENV {args!r}: use the KEY=VALUE form"
        out.append((key, value))
    return out


def expand(value: str, env: dict[str, str]) -> str:
    """Expand ``$VAR`` and ``${VAR}`` the way Docker does in ENV/WORKDIR/COPY."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), value)


def json_args(args: str) -> list[str]:
    """The exec (JSON array) form of CMD/ENTRYPOINT/HEALTHCHECK CMD."""
    import json

    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def dockerignore_excludes(rel: str) -> bool:
    """Whether ``.dockerignore`` keeps ``rel`` (relative to the repository) out of the
    build context: the last matching pattern wins, a pattern also matches everything under a
    matching directory."""
    excluded = False
    parts = rel.split("/")
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pat = raw.strip()
        if not pat or pat.startswith("#"):
            continue
        negate = pat.startswith("!")
        pat = pat.lstrip("!").strip("/")
        if pat.startswith("**/"):  # at any depth: any path component
            hit = any(fnmatch(part, pat[3:]) for part in parts)
        else:  # from the context root: the path or one of its parent directories
            hit = any(fnmatch("/".join(parts[:i]), pat) for i in range(1, len(parts) + 1))
        if hit:
            excluded = not negate
    return excluded


def copy_context(src_rel: str, dest: Path) -> None:
    """``COPY src_rel dest`` from the build context (``.dockerignore`` applied)."""
    src = ROOT / src_rel
    if src.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        return
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_dir() or dockerignore_excludes(rel):
            continue
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def resolve_compose(files: list[Path], env_file: Path) -> dict[str, Any]:
    """``docker-compose --env-file ENV -f ... config`` as a dict (what compose would run).

    Skips when Debian's docker-compose is not installed (``./test.sh`` installs it as root).
    """
    yaml = pytest.importorskip("yaml")
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RPSAGG_")}
    args = ["docker-compose", "--env-file", str(env_file)]
    for f in files:
        args += ["-f", str(f)]
    out = subprocess.run([*args, "config"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    assert isinstance(config, dict)
    return config
