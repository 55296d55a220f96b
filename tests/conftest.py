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

``conformance/`` is put on ``sys.path`` here: the tests import the plain-Python reference of
the wire format (``wire_reference``) and the conformance runner (``run``) from there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))

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
    """Refuse the run when a collected test module has no group, or more than one."""
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
        if len(names) != 1:
            wrong.append(f"{item.path}: {', '.join(names) or 'none'}")
    if wrong:
        raise pytest.UsageError(
            f"a test module needs exactly one group ({', '.join(sorted(groups))}) in its "
            "module-level pytestmark; these have none or several:\n  " + "\n  ".join(wrong))
