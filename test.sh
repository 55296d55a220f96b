#!/usr/bin/env bash
# The whole test suite: lint, type check, tests. Sets up .venv on first use.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$root"
scripts/setup-env.sh test
echo "[test] ruff"
.venv/bin/ruff check .
echo "[test] mypy"
.venv/bin/mypy
echo "[test] pytest"
.venv/bin/python -m pytest "$@"
