"""Read the Dockerfiles as data (a Dockerfile parsed into stages of instructions) for the
static checks of tests/test_deploy_docker.py. The images themselves are built and run on a
real engine by tests/test_deploy_engine.py (tests/engine_util.py)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

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
    global_args: dict[str, str] = {}  # ARGs before the first FROM (usable in FROM lines)
    for line in lines:
        instr, _, args = line.partition(" ")
        instr, args = instr.upper(), args.strip()
        if instr == "ARG" and not stages:
            name, _, default = args.partition("=")
            global_args[name.strip()] = default.strip().strip('"')
            continue
        if instr == "FROM":
            for name, value in global_args.items():
                args = args.replace("${" + name + "}", value).replace("$" + name, value)
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


def json_args(args: str) -> list[str]:
    """The exec (JSON array) form of CMD/ENTRYPOINT/HEALTHCHECK CMD."""
    import json

    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value
