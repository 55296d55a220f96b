#!/usr/bin/env bash
# Regenerate the committed protobuf code from proto/ (the only way to produce it).
#   proto/rpsagg/v1/aggregation.proto -> wire/rpsagg_wire/v1/aggregation_pb2.py{,i}
# The proto package stays rpsagg.v1 (the service is /rpsagg.v1.Aggregation/...); the Python
# module lives in the rpsagg-wire distribution, so protoc sees the file under the virtual path
# rpsagg_wire/v1/ (-I VIRTUAL=DISK). No *_pb2_grpc.py: client and server register raw method
# handlers through rpsagg_wire.v1.serde.
# Usage: scripts/gen-proto.sh [OUT_DIR]   (OUT_DIR defaults to wire/; tests pass a tmp dir)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/wire}
python=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out"
cd "$root"
"$python" -m grpc_tools.protoc -I "rpsagg_wire/v1=proto/rpsagg/v1" \
  --python_out="$out" --pyi_out="$out" \
  rpsagg_wire/v1/aggregation.proto
