"""The release as a user installs it: ``scripts/build-wheels.sh`` builds every
distribution's wheel and sdist; a fresh virtual environment installs the wheels (their
dependencies from the package index pip is configured with), and from a folder outside the
repository, with nothing of the source tree on ``sys.path``, the installed library runs the
README's quick start with its compiled kernels, and the installed commands run a job of 3
clients to its end. The Flower wheel installs beside Flower (``.venv-flower``'s) and its mod
and strategy import.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from http_util import free_port
from repo_paths import ROOT
from service_util import kill_all, wait_port_file

pytestmark = pytest.mark.service

VERSION = (ROOT / "VERSION").read_text().strip()
#: the README's library quick start and its output, as written
QUICK_START = re.search(r"## Library quick start\n\n```python\n(.*?)```\n\n```text\n(.*?)```",
                        (ROOT / "README.md").read_text(), re.S)
#: docs/install.md's block that makes a venv and installs the wheels from dist/
INSTALL = re.search(r"```bash\n(python3.11 -m venv venv\n.*?)```",
                    (ROOT / "docs" / "install.md").read_text(), re.S)


def _env() -> dict[str, str]:
    """This process's environment without anything that points into the repository."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("RPSAGG_")}


def _run(*cmd: str | Path, cwd: Path, timeout: float = 300) -> str:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-2000:])
    return out.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run(ROOT / "scripts" / "build-wheels.sh", out, cwd=ROOT)
    return out


@pytest.mark.timeout(600)
def test_the_wheels_install_and_run_a_job_from_the_installed_commands(
        dist: Path, tmp_path: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert names == sorted([
        f"rpsagg-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl", f"rpsagg-{VERSION}.tar.gz",
        *(f"rpsagg_{d}-{VERSION}{ext}" for d in ("wire", "client", "server", "flower",
                                                 "experiments")
          for ext in ("-py3-none-any.whl", ".tar.gz"))]), names
    # docs/install.md's commands, as written, beside a dist/ of the built wheels
    assert INSTALL is not None
    (tmp_path / "dist").symlink_to(dist)
    _run("bash", "-ec", INSTALL.group(1).replace("pip install", "pip install --quiet"),
         cwd=tmp_path)
    venv = tmp_path / "venv"
    bin_ = venv / "bin"
    where = _run(bin_ / "python", "-c", "import rpsagg, rpsagg.projections as p, rpsagg_server;"
                 "print(rpsagg.__file__, rpsagg_server.__file__, p.product_path(),"
                 " rpsagg.__version__)", cwd=tmp_path).split()
    assert all(w.startswith(str(venv)) for w in where[:2]), where  # not the source tree
    assert where[2:] == ["tiles", VERSION]
    assert QUICK_START is not None
    (tmp_path / "quick.py").write_text(QUICK_START.group(1))
    assert _run(bin_ / "python", "quick.py", cwd=tmp_path) == QUICK_START.group(2)

    http = free_port()
    server = subprocess.Popen(
        [bin_ / "rpsagg-server", "--insecure", "--no-default-job", "--host", "127.0.0.1",
         "--grpc-port", "0", "--http-port", str(http), "--db", tmp_path / "jobs.db",
         "--port-file", tmp_path / "port"], cwd=tmp_path, env=_env(), stderr=subprocess.PIPE)
    procs: list[subprocess.Popen[bytes]] = [server]
    try:
        port = wait_port_file(tmp_path / "port", server)
        url = f"http://127.0.0.1:{http}"
        job = _run(bin_ / "rpsagg-jobs", "--url", url, "create", "n=3", "k=8", "d=64",
                   "rounds=2", "task=mean", cwd=tmp_path).strip()
        for i in range(3):
            procs.append(subprocess.Popen(
                [bin_ / "rpsagg-client", "--server", f"127.0.0.1:{port}", "--insecure",
                 "--job", job, "--client-id", f"c{i}", "--quiet"], cwd=tmp_path, env=_env()))
        _run(bin_ / "rpsagg-jobs", "--url", url, "wait", job, "--timeout", "120",
             cwd=tmp_path)
        assert all(p.wait(60) == 0 for p in procs[1:])
    finally:
        kill_all(procs)


@pytest.mark.timeout(300)
def test_the_flower_wheel_installs_beside_flower(dist: Path, tmp_path: Path) -> None:
    flower_py = ROOT / ".venv-flower" / "bin" / "python"
    if not flower_py.exists():
        pytest.skip("no .venv-flower (scripts/setup-env.sh flower)")
    target = tmp_path / "site"
    _run(flower_py, "-m", "pip", "install", "--quiet", "--no-deps", "--target", target,
         *dist.glob("rpsagg_flower-*.whl"), cwd=tmp_path)
    env_path = f"import sys; sys.path.insert(0, {str(target)!r}); "
    out = _run(flower_py, "-c", env_path + "import flwr, rpsagg_flower as f; "
               "from rpsagg_flower import rpsagg_mod, RandProjSpatialFedAvg; "
               "print(f.__file__, f.__version__)", cwd=tmp_path).split()
    assert out == [str(target / "rpsagg_flower" / "__init__.py"), VERSION]
