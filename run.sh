#!/usr/bin/env bash
# The main job. Sets up .venv on first use, then runs it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$root/scripts/setup-env.sh" run
exec "$root/.venv/bin/python" -m rpsagg.simulate "$@"
