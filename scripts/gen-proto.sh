#!/usr/bin/env bash
# Regenerate the committed protobuf/gRPC code from proto/ (the only way to produce it).
#   proto/rpsagg/v1/aggregation.proto -> common/rpsagg/v1/aggregation_pb2{,_grpc}.py{,i}
# Usage: scripts/gen-proto.sh [OUT_DIR]   (OUT_DIR defaults to common/; tests pass a tmp dir)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/common}
python=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out"
cd "$root/proto"
"$python" -m grpc_tools.protoc -I . \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  rpsagg/v1/aggregation.proto
