"""Which pytest-xdist worker runs which tests (``./test.sh`` runs ``-n 2 --dist loadfile``).

A work unit is a test module: its tests run on one worker, in their order, and its
module-scoped fixtures are set up once. A few modules of long, independent tests give
each test a unit (:data:`PER_TEST`); the tests that start a Ray cluster share one
(:data:`RAY_UNIT`). The engine group's modules form one unit
(:data:`SHARED_UNITS`): they share the session's Docker engine, which the worker that
started it stops at its end, and the images they build under the same tags (a build by one
test re-tags ``rpsagg-server:latest`` under another's running project, and compose then
re-creates that project's containers).

:func:`pytest_xdist_make_scheduler` gives ``--dist loadfile`` these units. It reads them
from the node ids alone, with no xdist_group marks: those reach xdist's scheduler only as
a suffix it writes into each node id, a write pytest 9.2's structured node ids ignore
(pytest-dev/pytest-xdist#1386), so grouping by marks stopped without a word. Lest a
change like that go unseen again, :func:`pytest_sessionfinish` fails a run in which a
unit's tests ran on more than one worker.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

#: test folders whose modules make one work unit, by folder name
SHARED_UNITS = {"engine": "tests/engine"}
#: modules of long tests that share nothing (no module fixtures; each starts its own
#: processes on free ports): each test is a unit of its own, so both workers take them
PER_TEST = frozenset({"tests/flower/test_benchmark.py", "tests/flower/test_e2e.py"})
#: the tests that start Flower's simulation engine, a local Ray cluster each, make one
#: unit: two Ray clusters starting at once on one machine race for Ray's session directory
#: and ports, and the loser's run fails without a word in its log
RAY_UNIT = "tests/flower (Ray simulation)"
RAY_TESTS = ("tests/flower/test_quickstart_app.py",
             "tests/flower/test_e2e.py::test_simulation_engine_trains_with_compressed_updates")

_ran_on: defaultdict[str, set[str]] = defaultdict(set)


def work_unit(nodeid: str) -> str:
    """The work unit of a test: its module's path, its folder's shared unit, or for a
    module of :data:`PER_TEST` the test itself.

    Parameters
    ----------
    nodeid : str
        A pytest node id, ``tests/unit/test_x.py::test_y[1]``.

    Returns
    -------
    str
        ``tests/unit/test_x.py``, or ``tests/engine`` for a module in ``tests/engine``, or
        :data:`RAY_UNIT` for a test of :data:`RAY_TESTS`.
    """
    path = nodeid.split("::", 1)[0]
    if path in RAY_TESTS or nodeid.split("[", 1)[0] in RAY_TESTS:
        return RAY_UNIT
    if path in PER_TEST:
        return nodeid
    parts = path.split("/")
    folder = parts[-2] if len(parts) > 1 else ""
    return SHARED_UNITS.get(folder, path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with :func:`work_unit` as its scope (other modes: xdist's)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return UnitScheduling(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On xdist's controller, where each report names its worker: note the unit's worker."""
    node = getattr(report, "node", None)
    if node is not None:
        _ran_on[work_unit(report.nodeid)].add(str(node.gateway.id))


def split_units() -> dict[str, list[str]]:
    """The work units whose tests ran on more than one worker, with those workers."""
    return {unit: sorted(workers) for unit, workers in _ran_on.items() if len(workers) > 1}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run when a work unit was split across workers."""
    split = split_units()
    if not split:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"  {unit}: {', '.join(workers)}" for unit, workers in sorted(split.items())]
    message = ("a test module (or the engine group) ran on more than one worker, so its "
               "module fixtures and order did not hold (tests/worker_units.py):\n"
               + "\n".join(lines))
    if reporter is not None:
        reporter.write_line(message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
