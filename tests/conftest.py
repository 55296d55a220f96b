"""Shared test configuration.

Every test session gets its own beta cache directory (``RPSAGG_CACHE_DIR``), inherited by the
subprocesses tests start, so results never depend on a developer's ~/.cache.

``tests/flower`` needs flwr, which lives in its own environment (``.venv-flower``): test.sh
runs it there as a second pytest run with ``RPSAGG_FLOWER_TESTS=1``; every other run
leaves it out.

Every test module is in exactly one group, a marker of its module-level ``pytestmark``:
``unit``, ``service``, ``engine`` or ``browser`` (registered in pyproject.toml as the markers
whose help starts with "group:"; ``./test.sh -m unit`` runs one group). A collected module
with no group or more than one stops the run.

Each group's modules sit in the folder of that name (``tests/unit``, ``tests/service``,
``tests/engine``, ``tests/browser``; ``tests/flower`` is the Flower environment's, whatever
the group); a module elsewhere stops the run too. The shared helpers stay in ``tests/``
(``repo_paths``, ``http_util``, ``service_util``, ``engine_util``, ``anyd_util``,
``worker_units``):
pyproject.toml's ``pythonpath`` puts ``tests/`` on ``sys.path``, and ``conformance/``, whose
plain-Python reference of the wire format (``wire_reference``) and conformance runner
(``run``) the tests import.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# pytest-xdist's work units: one per module, the engine group's modules one (./test.sh)
from worker_units import (  # noqa: F401  (hooks, found here by name)
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_xdist_make_scheduler,
)

collect_ignore = [] if os.environ.get("RPSAGG_FLOWER_TESTS") == "1" else ["flower"]


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[dict[str, str]]:
    """The real Docker engine (``scripts/engine.sh up``); stopped at the end of the session
    when the session started it (tests/engine_util.py)."""
    import engine_util

    try:
        yield engine_util.engine()
    finally:
        engine_util.engine_down()


@pytest.fixture(scope="session", autouse=True)
def _isolated_beta_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("beta-cache")
    old = os.environ.get("RPSAGG_CACHE_DIR")
    os.environ["RPSAGG_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("RPSAGG_CACHE_DIR", None)
        else:
            os.environ["RPSAGG_CACHE_DIR"] = old


def _groups(config: pytest.Config) -> set[str]:
    """The test groups: the markers pyproject.toml registers with a help starting "group:"."""
    out = set()
    for line in config.getini("markers"):
        name, _, help_text = line.partition(":")
        if help_text.strip().startswith("group:"):
            out.add(name.strip())
    return out


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse the run when a collected test module has no group, or more than one, or sits
    outside its group's folder (``tests/flower`` aside)."""
    groups = _groups(config)
    seen: set[str] = set()
    wrong: list[str] = []
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ in seen:
            continue
        seen.add(module.__name__)
        marks = getattr(module, "pytestmark", [])
        names = [m.name for m in (marks if isinstance(marks, list) else [marks])
                 if m.name in groups]
        folder = item.path.parent.name
        if len(names) != 1:
            wrong.append(f"{item.path}: group {', '.join(names) or 'none'}")
        elif folder != names[0] and folder != "flower":
            wrong.append(f"{item.path}: group {names[0]}, in tests/{folder}/")
    if wrong:
        raise pytest.UsageError(
            f"a test module needs exactly one group ({', '.join(sorted(groups))}) in its "
            "module-level pytestmark, and sits in the folder of that name (tests/flower "
            "aside); these do not:\n  " + "\n  ".join(wrong))
