#!/usr/bin/env bash
# The whole test suite: lint, type check, the docs site, tests. Sets up .venv on first use.
# The tests run on RPSAGG_TEST_WORKERS pytest workers (default 2: the machine's cores; 0 runs
# them in this process, as a plain pytest): every module's tests on one worker, the engine
# group's together (tests/conftest.py).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$root"
scripts/setup-env.sh test
echo "[test] ruff"
.venv/bin/ruff check .
echo "[test] mypy"
.venv/bin/mypy
echo "[test] docs site (mkdocs build --strict -> build/site)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
workers=(-n "${RPSAGG_TEST_WORKERS:-2}" --dist loadgroup)
echo "[test] pytest (${RPSAGG_TEST_WORKERS:-2} workers)"
.venv/bin/python -m pytest "${workers[@]}" "$@"
# the Flower integration in its own environment (flwr's pins; tests/conftest.py keeps
# tests/flower out of the run above); MYPYPATH: rpsagg's source, as .venv's mypy sees it
echo "[test] mypy flower (.venv-flower)"
MYPYPATH=common .venv-flower/bin/mypy flower/rpsagg_flower examples/flower-fashion-mnist
echo "[test] pytest tests/flower (.venv-flower)"
RPSAGG_FLOWER_TESTS=1 .venv-flower/bin/python -m pytest "${workers[@]}" tests/flower
