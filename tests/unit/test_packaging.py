"""Packaging: quiet builds, and a math library that needs numpy and scipy only.

``scripts/setup-env.sh`` installs ``common``, ``wire``, ``server``, ``client`` and
``experiments`` in editable mode. With
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
from repo_paths import ROOT, requirement_names

pytestmark = pytest.mark.unit


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
@pytest.mark.parametrize("package", ["common", "wire", "server", "client", "experiments"])
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


def test_the_math_library_declares_numpy_and_scipy_only() -> None:
    assert requirement_names("common") == {"numpy", "scipy"}
    # the protocol needs protobuf, never gRPC; gRPC is the client's and the server's
    assert requirement_names("wire") == {"rpsagg", "numpy", "protobuf"}
    for package in ("server", "client"):
        assert {"rpsagg", "rpsagg-wire", "grpcio"} <= requirement_names(package)


IMPORT_ALL = """
import importlib, pkgutil, sys
import rpsagg
names = [m.name for m in pkgutil.walk_packages(rpsagg.__path__, "rpsagg.")]
skipped = {"rpsagg._torch"}  # the torch extra: imports torch at module level
for name in names:
    if name not in skipped:
        importlib.import_module(name)
# and the estimator works there: a joint decode (scipy's solvers) of identical vectors
import numpy as np
est = rpsagg.make_estimator("rand-proj-spatial", n=4, k=64, d=256, transform="max")
x = np.cos(np.arange(256))
estimate = est.decode([est.encode(x, seed=s) for s in range(4)])
assert np.isfinite(estimate).all() and estimate.shape == x.shape
roots = sorted({m.split(".")[0] for m in sys.modules})
print(len(names), "modules;", " ".join(roots))
"""


@pytest.mark.timeout(120)
def test_every_rpsagg_module_imports_with_numpy_and_scipy_alone(tmp_path: Path) -> None:
    """Import every module of rpsagg where only numpy, scipy and rpsagg are importable.

    The interpreter runs isolated (``-I -S``: no site-packages, no user paths); its path is
    the standard library, ``common/`` and a folder with links to numpy and scipy alone. Any
    import of protobuf, gRPC, threadpoolctl, fht-cpu or another distribution fails there.
    """
    import numpy
    import scipy

    only = tmp_path / "site"
    only.mkdir()
    for module in (numpy, scipy):
        pkg = Path(module.__file__).parent
        (only / pkg.name).symlink_to(pkg)
        libs = pkg.parent / f"{pkg.name}.libs"  # the wheels' vendored shared libraries
        if libs.exists():
            (only / libs.name).symlink_to(libs)
    stdlib = [p for p in sys.path if p and "site-packages" not in p and Path(p).exists()]
    code = (f"import sys; sys.path[:] = {stdlib!r} + [{str(ROOT / 'common')!r}, "
            f"{str(only)!r}]\n" + IMPORT_ALL)
    res = subprocess.run([sys.executable, "-I", "-S", "-c", code], text=True,
                         capture_output=True, timeout=110)
    assert res.returncode == 0, res.stderr[-3000:]
    roots = set(res.stdout.split(";", 1)[1].split())
    assert {"rpsagg", "numpy", "scipy"} <= roots
    assert not roots & {"google", "grpc", "threadpoolctl", "fht_cpu", "torch", "rpsagg_wire",
                        "matplotlib", "tqdm"}, roots
