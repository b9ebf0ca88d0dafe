"""bench/time_in_run.py times named functions inside one run without changing what the run computes,
and puts them back afterwards (a method a class inherits as well as one it defines)."""

from __future__ import annotations

from types import ModuleType

import pytest
from repo_paths import ROOT, load_script

from slo_core.policies.gmax import GMAX, GMAXOracle
from slo_core.policies.gmax_snapshot import SnapshotTable


@pytest.fixture(scope="module")
def tir() -> ModuleType:
    load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")  # the script imports it by name
    load_script(ROOT / "bench" / "sim_speed.py", "sim_speed")
    load_script(ROOT / "bench" / "run_phases.py", "run_phases")
    return load_script(ROOT / "bench" / "time_in_run.py", "time_in_run")


def test_targets_are_timed_and_restored_and_the_run_is_unchanged(tir: ModuleType) -> None:
    task = tir.gmax_sweep.Task("tot", 2, 0, 10.0, "gmax-oracle", ("token",), 6.0, "round-robin")
    plain_cpu, plain_digest = tir.task_run(task)
    columns, decide = SnapshotTable.columns, GMAXOracle.decide
    targets = [
        "slo_core.policies.gmax_snapshot:SnapshotTable.columns",
        "slo_core.policies.gmax:GMAXOracle.decide",  # inherited from GMAX
    ]
    out = tir.timed_run(targets, lambda: tir.task_run(task))
    assert out["digest"] == plain_digest
    assert plain_cpu > 0 and out["cpu_s"] > 0
    decide_s, decide_calls = out["targets"]["slo_core.policies.gmax:GMAXOracle.decide"]
    columns_s, columns_calls = out["targets"]["slo_core.policies.gmax_snapshot:SnapshotTable.columns"]
    assert decide_calls > 20 and 0 < decide_s < out["cpu_s"]
    assert 0 < columns_calls <= decide_calls and columns_s <= decide_s
    assert SnapshotTable.columns is columns
    assert GMAXOracle.decide is decide is GMAX.decide
    assert "decide" not in vars(GMAXOracle)
