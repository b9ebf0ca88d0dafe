#!/usr/bin/env bash
# Set up (idempotently) a virtual environment with slofleet and run the demo: a local SLO-aware fleet
# and a stock FCFS/round-robin fleet on simulated GPUs, the same real trace replayed through both.
# Extra arguments go to `slofleet demo` (e.g. `bash scripts/demo.sh --duration 30`).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[all]" 2>&1 | grep -v '^WARNING: Location' || true
exec .venv/bin/slofleet demo "$@"
