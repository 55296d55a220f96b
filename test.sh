#!/usr/bin/env bash
# The whole test suite: lint, type check, the docs site, tests. Sets up .venv on first use.
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
echo "[test] pytest"
.venv/bin/python -m pytest "$@"
# the Flower integration in its own environment (flwr's pins; tests/conftest.py keeps
# tests/flower out of the run above); MYPYPATH: rpsagg's source, as .venv's mypy sees it
echo "[test] mypy flower (.venv-flower)"
MYPYPATH=common .venv-flower/bin/mypy flower/rpsagg_flower examples/flower-fashion-mnist
echo "[test] pytest tests/flower (.venv-flower)"
RPSAGG_FLOWER_TESTS=1 .venv-flower/bin/python -m pytest tests/flower
