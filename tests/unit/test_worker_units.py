"""The work units of ``./test.sh``'s pytest-xdist run (tests/worker_units.py): a module's
tests on one worker, the engine group's modules together, and a run that splits a unit
fails. The runs below are real pytest-xdist runs (two workers) of a small generated tree
whose tests write down the worker that ran them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import TESTS
from worker_units import work_unit

pytestmark = pytest.mark.unit

# tests per module: enough that xdist's own `--dist load` hands each module to both workers
PER_MODULE = 12


def test_a_module_is_its_unit_and_the_engine_folder_one_unit() -> None:
    assert work_unit("tests/unit/test_a.py::test_b[1-x]") == "tests/unit/test_a.py"
    assert work_unit("tests/unit/test_a.py::TestC::test_d") == "tests/unit/test_a.py"
    assert work_unit("tests/engine/test_deploy_engine.py::test_x") == "tests/engine"
    assert work_unit("tests/engine/test_deploy_monitoring.py::test_y") == "tests/engine"
    assert work_unit("test_top.py::test_z") == "test_top.py"
    # the tests that start Ray (Flower's simulation engine): one unit, never two at once
    ray = "tests/flower/test_e2e.py::test_simulation_engine_trains_with_compressed_updates"
    assert work_unit(ray) == work_unit("tests/flower/test_quickstart_app.py::test_x") == \
        "tests/flower (Ray simulation)"
    e2e = "tests/flower/test_e2e.py::test_ctrl_c_leaves_no_flower_process"
    assert work_unit(e2e) == e2e


def _tree(root: Path) -> Path:
    """Two modules in tests/unit and two in tests/engine, each test appending
    ``<module> <worker>`` to a file; the plugin is tests/worker_units.py, as in conftest."""
    out = root / "ran.txt"
    (root / "tests").mkdir()
    (root / "tests" / "conftest.py").write_text(
        "from worker_units import (pytest_runtest_logreport, pytest_sessionfinish,\n"
        "                          pytest_xdist_make_scheduler)  # noqa: F401\n")
    for folder, names in (("unit", ("test_u1", "test_u2")), ("engine", ("test_e1", "test_e2"))):
        (root / "tests" / folder).mkdir()
        for name in names:
            (root / "tests" / folder / f"{name}.py").write_text(
                "import os, pytest\n"
                f"@pytest.mark.parametrize('i', range({PER_MODULE}))\n"
                "def test_it(i):\n"
                f"    with open({str(out)!r}, 'a') as f:\n"
                f"        f.write('{folder}/{name} '"
                " + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n")
    return out


def _run(root: Path, dist: str) -> tuple[subprocess.CompletedProcess[str], dict[str, set[str]]]:
    out = _tree(root)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", dist, "--rootdir", str(root), "-c", "/dev/null", "tests"],
        cwd=root, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(TESTS)})
    workers: dict[str, set[str]] = {}
    for line in out.read_text().splitlines():
        module, worker = line.split()
        workers.setdefault(module, set()).add(worker)
    return run, workers


def test_loadfile_runs_each_unit_on_one_worker(tmp_path: Path) -> None:
    run, workers = _run(tmp_path, "loadfile")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{4 * PER_MODULE} passed" in run.stdout, run.stdout[-2000:]
    assert set(workers) == {"unit/test_u1", "unit/test_u2", "engine/test_e1", "engine/test_e2"}
    assert all(len(w) == 1 for w in workers.values()), workers
    assert workers["engine/test_e1"] == workers["engine/test_e2"], workers


def test_a_run_that_splits_a_unit_fails_and_names_it(tmp_path: Path) -> None:
    run, workers = _run(tmp_path, "load")  # xdist's own scheduling, test by test
    split = sorted(m for m, w in workers.items() if len(w) > 1)
    assert split, workers  # the premise: `load` did split a module
    assert run.returncode == 1, run.stdout[-3000:]
    assert f"{4 * PER_MODULE} passed" in run.stdout, run.stdout[-2000:]
    assert "ran on more than one worker" in run.stdout, run.stdout[-2000:]
    for module in split:
        unit = "tests/engine" if module.startswith("engine/") else f"tests/{module}.py"
        assert f"  {unit}: gw0, gw1" in run.stdout, run.stdout[-2000:]
