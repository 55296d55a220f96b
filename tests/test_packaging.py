"""The set-up is quiet: building the three packages raises no setuptools warning.

``scripts/setup-env.sh`` installs ``common``, ``server`` and ``client`` in editable mode. With
the experimental ``[tool.setuptools.ext-modules]`` table, or with setuptools' import-hook
editable strategy, every install printed a wall of ``BuildBackendWarning`` text. Each test
builds one package's editable wheel (what ``pip install -e`` asks the backend for) from a
copy of its sources and fails on any setuptools warning.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BUILD = """
import sys, warnings
from setuptools import build_meta
from setuptools.warnings import SetuptoolsWarning
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    name = build_meta.build_editable(sys.argv[1])
bad = [f"{w.category.__name__}: {w.message}" for w in caught
       if issubclass(w.category, SetuptoolsWarning)]
print(name)
print("\\n".join(bad) or "no setuptools warnings")
sys.exit(1 if bad else 0)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("package", ["common", "server", "client"])
def test_editable_build_raises_no_setuptools_warning(package: str, tmp_path: Path) -> None:
    src = tmp_path / package
    shutil.copytree(ROOT / package, src, ignore=shutil.ignore_patterns(
        "*.egg-info", "__pycache__", "build", "*.so"))
    out = tmp_path / "wheel"
    out.mkdir()
    res = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=src, text=True,
                         capture_output=True, timeout=110)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "no setuptools warnings" in res.stdout
    assert list(out.glob("*.whl")), res.stdout[-2000:]
