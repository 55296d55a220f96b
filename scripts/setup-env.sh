#!/usr/bin/env bash
# Create or update the project's virtual environment at .venv and the Debian packages a
# role needs. Idempotent: re-runs only what changed. Prints one short line per step (pip
# and setuptools run quietly; their errors still show).
#   scripts/setup-env.sh run    # what the main command needs
#   scripts/setup-env.sh test   # plus the test and lint tools, and .venv-flower (tests/flower)
set -euo pipefail
role=${1:-run}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

deb_packages=()
case "$role" in
  run) deb_packages+=(dataset-fashion-mnist) ;;  # the main command's data
  test) deb_packages+=(chromium chromium-driver) ;;  # the dashboard's real-browser test
  *) echo "usage: $0 run|test" >&2; exit 2 ;;
esac
# the service tests: Fashion-MNIST data, iproute2 for the network-namespace tests, a real
# Docker engine for the compose tests (docker.io; debootstrap builds the images' base when
# Docker Hub cannot be reached; scripts/engine.sh starts the daemon and adds Compose v2) and
# prometheus (a real Prometheus scrapes a live server; promtool checks the monitoring
# profile's configuration and queries)
if [ "$role" = test ]; then
  deb_packages+=(dataset-fashion-mnist iproute2 docker.io debootstrap prometheus)
fi

missing=()
for pkg in "${deb_packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "[setup] missing Debian packages (run as root to install): ${missing[*]}" >&2
  fi
fi

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null 2>&1 || python=python3
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  # missing, or left half-made by an interrupted run: (re)create it
  echo "[setup] creating .venv with $($python --version)"
  "$python" -m venv --clear .venv
fi

inputs=(VERSION common/pyproject.toml common/setup.py common/rpsagg/_fast.c common/rpsagg/fastc/*.c
        wire/pyproject.toml server/pyproject.toml client/pyproject.toml experiments/pyproject.toml)
[ "$role" = test ] && inputs+=(requirements-dev.txt)
stamp_file=.venv/.setup-stamp-$role
stamp=$(cat "${inputs[@]}" scripts/setup-env.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  echo "[setup] updating pip"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  args=(-e "common[fast,blas]" -e wire -e server -e client -e experiments)
  # the tests also run the PyTorch decode backend (rpsagg[torch]) on the CPU (requirements-dev
  # pins torch to the CPU build) and the Ray decode backend (rpsagg-server[ray])
  [ "$role" = test ] && args=(-e "common[fast,blas,torch]" -e wire -e "server[ray]" -e client
                              -e experiments -r requirements-dev.txt)
  echo "[setup] installing rpsagg, rpsagg-wire, rpsagg-server, rpsagg-client, rpsagg-experiments$([ "$role" = test ] \
    && echo " and the test tools") into .venv (a minute the first time)"
  .venv/bin/python -m pip install -q "${args[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import rpsagg, rpsagg_wire, rpsagg_server, rpsagg_client, rpsagg_experiments"
  echo "$stamp" > "$stamp_file"
  echo "[setup] .venv ready ($role)"
fi

# The Flower integration (flower/, rpsagg-flower) and its tests (tests/flower) run in their
# own environment, .venv-flower: flwr 1.42 pins protobuf < 7 (and fastapi, starlette) where
# the service stack in .venv needs protobuf >= 7.
if [ "$role" = test ]; then
  if ! .venv-flower/bin/python -m pip --version >/dev/null 2>&1; then
    echo "[setup] creating .venv-flower with $($python --version)"
    "$python" -m venv --clear .venv-flower
    echo '*' > .venv-flower/.gitignore  # a virtual environment is never committed
  fi
  fl_inputs=(VERSION common/pyproject.toml common/setup.py common/rpsagg/_fast.c common/rpsagg/fastc/*.c
             flower/pyproject.toml
             flower/requirements-test.txt)
  fl_stamp_file=.venv-flower/.setup-stamp
  fl_stamp=$(cat "${fl_inputs[@]}" scripts/setup-env.sh | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$fl_stamp_file" 2>/dev/null)" != "$fl_stamp" ]; then
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    echo "[setup] installing rpsagg, rpsagg-flower (flwr) and the test tools into .venv-flower"
    .venv-flower/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    # rpsagg is the math alone (numpy, scipy): it installs beside flwr's protobuf pin;
    # flower[simulation] brings Ray for Flower's simulation engine (tests/flower/test_e2e.py)
    .venv-flower/bin/python -m pip install -q -e "common[blas]" -e "flower[simulation]" \
      -r flower/requirements-test.txt 2>&1 | grep -v "^WARNING: Location" || true
    .venv-flower/bin/python -c "import rpsagg, rpsagg_flower, flwr, ray"
    echo "$fl_stamp" > "$fl_stamp_file"
    echo "[setup] .venv-flower ready"
  fi
fi
