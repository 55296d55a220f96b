"""One version for every distribution: the repository's ``VERSION`` file, what each
``pyproject.toml`` builds with, what the installed metadata, ``rpsagg.__version__``, every
command's ``--version``, ``/metrics`` and the changelog say."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest
from repo_paths import ROOT

import rpsagg
from rpsagg_wire.v1 import serde

pytestmark = pytest.mark.unit

VERSION = (ROOT / "VERSION").read_text().strip()
#: each distribution's folder and name
DISTRIBUTIONS = {"common": "rpsagg", "wire": "rpsagg-wire", "server": "rpsagg-server",
                 "client": "rpsagg-client", "experiments": "rpsagg-experiments",
                 "flower": "rpsagg-flower"}
#: every command and whether it speaks gRPC (its --version names the protocol)
COMMANDS = {"rpsagg_server": ("rpsagg-server", True),
            "rpsagg_client.cli": ("rpsagg-client", True),
            "rpsagg_client.jobs_cli": ("rpsagg-jobs", False),
            "rpsagg.simulate": ("rpsagg-simulate", False),
            "rpsagg_experiments.cli": ("rpsagg-experiments", False),
            "rpsagg_experiments.cluster": ("rpsagg-cluster", True)}


def test_the_version_is_one_release_number() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION
    assert rpsagg.__version__ == VERSION


@pytest.mark.parametrize("folder", sorted(DISTRIBUTIONS))
def test_every_distribution_builds_with_the_repositorys_version(folder: str) -> None:
    project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())
    assert project["project"]["name"] == DISTRIBUTIONS[folder]
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"file": "VERSION"}
    for name in ("VERSION", "LICENSE"):  # the repository's own files, in the sdist too
        assert (ROOT / folder / name).resolve() == ROOT / name
    assert project["project"]["license-files"] == ["LICENSE"]
    assert "include VERSION" in (ROOT / folder / "MANIFEST.in").read_text().splitlines()


@pytest.mark.parametrize("dist", [d for d in DISTRIBUTIONS.values() if d != "rpsagg-flower"])
def test_the_installed_distributions_carry_it(dist: str) -> None:
    assert metadata.version(dist) == VERSION


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_every_command_says_its_version(module: str) -> None:
    prog, grpc = COMMANDS[module]
    out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                         text=True, timeout=120)
    assert (out.returncode, out.stderr) == (0, "")
    specs = f"seed spec {rpsagg.SPEC_VERSION}" + (f", protocol {serde.PROTOCOL}" if grpc else "")
    assert out.stdout == f"{prog} {VERSION} ({specs})\n"


def test_the_changelog_has_this_release_with_the_specs_it_speaks() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"(?m)^## \[([^\]]+)\]", text)
    assert releases[:2] == ["Unreleased", VERSION], releases
    this = text.split(f"## [{VERSION}]", 1)[1].split("\n## ", 1)[0]
    assert f"`{rpsagg.SPEC_VERSION}`" in this and f"`{serde.PROTOCOL}`" in this
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
