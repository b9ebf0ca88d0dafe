"""bench/compare/run.py: runs spread over worker processes give the records of a serial run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from repo_paths import ROOT, load_script

from slo_core.workloads import WorkloadSpec

COMPARE = ROOT / "bench" / "compare"


def _runner() -> ModuleType:
    sys.path.insert(0, str(COMPARE))
    return load_script(COMPARE / "run.py", "compare_run")


def _strip(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    drop = {"task_wall_s", "wall_s"}
    rows = [{k: v for k, v in r.items() if k not in drop} for r in records]
    return sorted(rows, key=lambda r: (r["policy"], r["rps"]))


@pytest.mark.slow
def test_pool_of_workers_equals_serial_execution(tmp_path: Path) -> None:
    run = _runner()
    run.ANALYZER["mode"] = "none"
    from scenarios import Run

    tasks = [
        Run("conv", WorkloadSpec(duration_s=6.0, rps=rps, mix=(1, 1, 1), seed=1), policy)
        for rps in (4.0, 10.0)
        for policy in ("fcfs", "edf")
    ]
    serial = [run.execute(t) for t in tasks]
    records: list[dict[str, Any]] = []
    path = tmp_path / "records.json"
    run._run_pool(list(tasks), 2, records, path)
    assert not any("error" in r for r in serial)
    assert _strip(records) == _strip(serial)
    assert _strip(json.loads(path.read_text())) == _strip(serial)  # saved as they came in
