#!/usr/bin/env bash
# The whole test suite: lint, type check, the docs site, tests. Sets up .venv on first use.
#
# The type checks and the site build run at once; the tests on RPSAGG_TEST_WORKERS
# pytest-xdist workers (default 3, one more than the development machine's 2 cores: many
# tests wait on processes, sockets and containers; 0 runs them in this process, as a plain
# pytest), every module's tests on one worker, the engine group's together
# (tests/worker_units.py); then the Flower tests in .venv-flower, the same way.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$root"
scripts/setup-env.sh test
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# a run in the background ignores Ctrl-C (no job control here): stopped with this script
trap 'kill "${pids[@]}" 2>/dev/null; exit 130' INT TERM

# run NAME COMMAND...: in the background, its output in a file of $logs; waited by finish
declare -A pids=()
log_of() { echo "$logs/$(printf '%s' "$1" | tr -c 'A-Za-z0-9' _)"; }
run() {
  local name=$1
  shift
  "$@" > "$(log_of "$name")" 2>&1 &
  pids[$name]=$!
}
# finish NAME: wait for it, print its output, return its status
finish() {
  local status=0
  wait "${pids[$1]}" || status=$?
  echo "[test] $1$([ $status = 0 ] || echo ": FAILED (exit $status)")"
  cat "$(log_of "$1")"
  return $status
}

echo "[test] ruff"
.venv/bin/ruff check .
echo "[test] mypy, mypy of the Flower integration (.venv-flower) and the docs site, at once"
run mypy .venv/bin/mypy
# MYPYPATH: rpsagg's source, as .venv's mypy sees it; its own cache (two mypys at once)
run "mypy flower" env MYPYPATH=common .venv-flower/bin/mypy --cache-dir .mypy_cache/flower \
  flower/rpsagg_flower examples/flower-fashion-mnist examples/flower-quickstart
run "docs site (mkdocs build --strict -> build/site)" \
  env NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
failed=0
for name in mypy "mypy flower" "docs site (mkdocs build --strict -> build/site)"; do
  finish "$name" || failed=1
done
[ $failed = 0 ] || exit 1

workers=(-n "${RPSAGG_TEST_WORKERS:-3}" --dist loadfile)
echo "[test] pytest (${RPSAGG_TEST_WORKERS:-3} workers)"
.venv/bin/python -m pytest "${workers[@]}" "$@"
# the Flower integration in its own environment (flwr's pins; tests/conftest.py keeps
# tests/flower out of the run above)
echo "[test] pytest tests/flower (.venv-flower)"
RPSAGG_FLOWER_TESTS=1 .venv-flower/bin/python -m pytest "${workers[@]}" tests/flower
