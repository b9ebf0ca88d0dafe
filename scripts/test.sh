#!/usr/bin/env bash
# Set up (idempotently) a virtual environment with every test dependency, then run all checks:
# lint, formatting, strict types for slo_core, import contracts, and the test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k gain`).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import slo_core, slo_router, slo_sidecar, slo_operator" \
  || { echo "setup failed: the slofleet packages do not import (see pip output above)"; exit 1; }

echo "== ruff"; .venv/bin/ruff check .
echo "== ruff format"; .venv/bin/ruff format --check .
echo "== mypy (strict, slo_core)"; .venv/bin/mypy
echo "== import contracts"; .venv/bin/lint-imports
echo "== pytest"
set +e
.venv/bin/pytest "$@"
rc=$?
set -e
# pytest exits 5 when a selection matched no test: that is a failure of this script's purpose too.
exit $rc
