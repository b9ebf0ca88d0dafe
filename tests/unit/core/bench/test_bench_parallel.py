"""`slofleet bench` over several processes gives the records of a serial run, and resumes a sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slo_core.bench.runner import BenchConfig, record_key, run_bench
from slo_core.cli import main
from slo_core.perf import load_profile
from slo_core.workloads import WorkloadSpec


def _cfg() -> BenchConfig:
    return BenchConfig(
        workload=WorkloadSpec(duration_s=8.0, mix=(1, 1, 1), seed=2),
        rps=(6.0, 14.0),
        policies=("fcfs", "edf", "tempo"),
        routers=("round-robin", "min-load"),
        profiles=(load_profile("h100-llama3-8b-tp1"),),
        replicas=2,
        analyzer="none",
    )


def _strip(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in records]


@pytest.mark.slow
def test_parallel_sweep_equals_serial_sweep() -> None:
    cfg = _cfg()
    serial = run_bench(cfg, workers=1)
    parallel = run_bench(cfg, workers=3)
    assert [record_key(r) for r in parallel.records] == [record_key(r) for r in serial.records]
    assert len(serial.records) == 12 and not any("error" in r for r in serial.records)
    assert _strip(parallel.records) == _strip(serial.records)
    assert parallel.samples == serial.samples


@pytest.mark.slow
def test_resume_runs_only_what_is_missing(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ["bench", "--duration", "6", "--rps", "4", "--replicas", "1", "--analyzer", "none"]
    argv += ["--policies", "fcfs,edf", "--json", str(out), "--no-progress", "--workers", "2"]
    assert main(argv) == 0
    first = json.loads(out.read_text())
    # as if the sweep had been interrupted after its first run
    out.write_text(json.dumps(first[:1]))
    assert main([*argv, "--resume"]) == 0
    resumed = json.loads(out.read_text())
    assert resumed[0] == first[0]  # kept as it was (same wall_s: not rerun)
    assert _strip(resumed) == _strip(first)
    # a different setup does not reuse them
    assert main([*argv, "--resume", "--seed", "9"]) == 0
    other = json.loads(out.read_text())
    assert {r["seed"] for r in other} == {9}


def test_resume_needs_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--resume", "--no-progress"]) == 2
    assert "--resume needs --json" in capsys.readouterr().err
