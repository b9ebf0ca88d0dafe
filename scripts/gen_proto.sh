#!/usr/bin/env bash
# Regenerate the checked-in gRPC stubs of proto/slofleet.proto for each service that speaks it.
# Services never import each other (STYLE.md), so each owns a copy of the generated code.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
for pkg in engine_sidecar/slo_sidecar router/slo_router; do
  out="$pkg/proto"
  mkdir -p "$out"
  mod=$(basename "$pkg")
  "$PY" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" proto/slofleet.proto
  # protoc writes `import slofleet_pb2`; make it package-relative.
  sed -i "s/^import slofleet_pb2 as/from $mod.proto import slofleet_pb2 as/" "$out/slofleet_pb2_grpc.py"
  [ -f "$out/__init__.py" ] || echo '"""Generated gRPC stubs of proto/slofleet.proto (scripts/gen_proto.sh); do not edit."""' > "$out/__init__.py"
done
