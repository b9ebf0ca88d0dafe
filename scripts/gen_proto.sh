#!/usr/bin/env bash
# Regenerate the checked-in gRPC stubs of proto/slofleet.proto into the one package every side imports
# (proto/slo_proto: router, sidecar, vLLM plugin and lab).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
out=proto/slo_proto
"$PY" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" proto/slofleet.proto
# protoc writes `import slofleet_pb2`; make it package-relative.
sed -i "s/^import slofleet_pb2 as/from slo_proto import slofleet_pb2 as/" "$out/slofleet_pb2_grpc.py"
