#!/usr/bin/env bash
# The main job: a local cluster (server + n client processes over gRPC on loopback) running
# distributed power iteration on Fashion-MNIST with Rand-Proj-Spatial(avg) in evaluation mode.
# Sets up .venv on first use. Options: ./run.sh --help (e.g. --n 5 --rounds 3 --data synthetic).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for arg in "$@"; do  # --help and --version answer at once: no set-up first
  case $arg in
    -h|--help|--version)
      if [ -x "$root/.venv/bin/python" ]; then
        exec "$root/.venv/bin/python" -m rpsagg_experiments.cluster "$arg"
      fi
      echo "usage: ./run.sh [rpsagg-cluster options: --n, --rounds, --data, ...]"
      echo "The first run sets up .venv (a few minutes); ./run.sh --help then lists every option."
      exit 0 ;;
  esac
done
"$root/scripts/setup-env.sh" run
exec "$root/.venv/bin/python" -m rpsagg_experiments.cluster "$@"
