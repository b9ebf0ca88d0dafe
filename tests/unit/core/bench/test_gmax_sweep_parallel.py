"""bench/gmax_sweep.py: runs spread over processes give a serial run's records, and a sweep resumes."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from repo_paths import ROOT


def _sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gmax_sweep", ROOT / "bench" / "gmax_sweep.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gmax_sweep"] = mod
    spec.loader.exec_module(mod)
    return mod


def _args(out: Path, workers: int) -> argparse.Namespace:
    return argparse.Namespace(
        out=str(out),
        families="conv",
        replicas="1",
        rps="6,14",
        seeds="0",
        duration=5.0,
        policies="fcfs,tempo",
        router="round-robin",
        objective="token,request",
        workers=workers,
        no_progress=True,
    )


def _records(out: Path) -> dict[str, list[dict[str, Any]]]:
    files = {}
    for path in sorted(out.glob("records-*.json")):
        rows = json.loads(path.read_text(encoding="utf-8"))
        files[path.name] = [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
    return files


def _runs(out: Path) -> list[dict[str, Any]]:
    lines = (out / "timing.jsonl").read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "run"]


@pytest.mark.slow
def test_parallel_sweep_equals_serial_and_resumes(tmp_path: Path) -> None:
    sweep = _sweep()
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    assert sweep.run(_args(serial, 1)) == 0
    assert sweep.run(_args(parallel, 2)) == 0
    got = _records(parallel)
    assert got == _records(serial)
    assert sorted(got) == ["records-conv-r1-s0-request.json", "records-conv-r1-s0-token.json"]
    # fcfs does not read the objective: one run serves both files; tempo runs once per objective
    assert len(_runs(serial)) == 2 * (1 + 2)
    # each invocation says which host made its records (they differ between hosts at overload)
    starts = [json.loads(ln) for ln in (serial / "timing.jsonl").read_text(encoding="utf-8").splitlines()]
    host = next(e["host"] for e in starts if e["event"] == "start")
    assert host["numpy"] == np.__version__ and host["cpus"] == os.cpu_count() and host["python"]
    for name, objective in (("token", "token"), ("request", "request")):
        rows = got[f"records-conv-r1-s0-{name}.json"]
        assert sorted((r["policy"], r["rps"]) for r in rows) == [
            ("fcfs", 6.0),
            ("fcfs", 14.0),
            ("tempo", 6.0),
            ("tempo", 14.0),
        ]
        assert all(r["objective"] == objective and "error" not in r for r in rows)
    # drop one record: a second invocation runs only that one and ends with the same records
    path = parallel / "records-conv-r1-s0-request.json"
    rows = json.loads(path.read_text(encoding="utf-8"))
    kept = [r for r in rows if r["policy"] != "tempo" or r["rps"] != 14.0]
    path.write_text(json.dumps(kept), encoding="utf-8")
    before = len(_runs(parallel))
    assert sweep.run(_args(parallel, 2)) == 0
    again = _runs(parallel)[before:]
    assert [(e["policy"], e["rps"], e["objectives"]) for e in again] == [("tempo", 14.0, ["request"])]
    assert _records(parallel) == _records(serial)


def test_objectives_that_set_the_same_parameters_share_a_run() -> None:
    sweep = _sweep()
    both = ("token", "request")
    assert sweep.objective_groups("fcfs", both) == [both]
    assert sweep.objective_groups("slide-batching", both) == [both]  # TDG weights 1/1 under either
    assert sweep.objective_groups("gmax", both) == [("token",), ("request",)]
    assert sweep.objective_groups("tempo", both) == [("token",), ("request",)]


@pytest.mark.slow
def test_a_shared_run_is_what_each_objective_alone_would_have_recorded() -> None:
    """The premise of sharing: every registered policy that the sweep runs once for token and request
    goodput schedules exactly alike under each (a short overloaded run, compared record for record)."""
    from slo_core.bench.runner import run_one_timed
    from slo_core.policies.registry import engine_policy_names

    sweep = _sweep()
    shared = [p for p in engine_policy_names() if len(sweep.objective_groups(p, ("token", "request"))) == 1]
    assert "slide-batching" in shared and "fcfs" in shared
    for policy in shared:
        records = []
        for objective in ("token", "request"):
            task = sweep.Task("conv", 1, 0, 9.0, policy, (objective,), 8.0, "round-robin")
            record, _ = run_one_timed(task.config(), (policy, "round-robin", 9.0))
            assert "error" not in record, record
            records.append(
                {k: v for k, v in record.items() if k not in ("objective", "sweep_fingerprint", "wall_s")}
            )
        assert records[0] == records[1], policy


def test_tables_join_folders_and_count_each_run_once(tmp_path: Path) -> None:
    """``tables --also``: runs from several folders, a run recorded twice taken from the first folder."""
    mod = _sweep()

    def rec(policy: str, seed: int, value: float) -> dict[str, Any]:
        return {
            "family": "conv",
            "replicas": 4,
            "rps": 20.5,
            "objective": "token",
            "policy": policy,
            "seed": seed,
            "goodput_token_ratio": value,
        }

    newer, older = tmp_path / "newer", tmp_path / "older"
    newer.mkdir()
    older.mkdir()
    (newer / "records-conv-r4-s2-token.json").write_text(json.dumps([rec("gmax", 2, 0.9)]))
    (newer / "records-conv-r4-s0-token.json").write_text(json.dumps([rec("gmax", 0, 0.7)]))
    (older / "records-conv-r4-s0-token.json").write_text(
        json.dumps([rec("gmax", 0, 0.1), rec("fcfs", 0, 0.3), {**rec("tempo", 0, 0.2), "error": "boom"}])
    )
    got = mod.table_records([newer, older])
    assert sorted((r["policy"], r["seed"], r["goodput_token_ratio"]) for r in got) == [
        ("fcfs", 0, 0.3),
        ("gmax", 0, 0.7),  # the first folder's record of the run, not the older one's
        ("gmax", 2, 0.9),
    ]
    assert [r["policy"] for r in mod.table_records([older, newer]) if r["seed"] == 0] == ["gmax", "fcfs"]
    assert [r["goodput_token_ratio"] for r in mod.table_records([older, newer]) if r["policy"] == "gmax"] == [
        0.1,
        0.9,
    ]
