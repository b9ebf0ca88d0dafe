"""bench/decision_cost.py: a sweep task with decisions charged runs slower and records its charge, the
free one is the sweep's record, and the table reads each charged run against its free twin and
against the base (the first policy listed) charged alike."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest
from repo_paths import ROOT, load_script

from slo_core.bench.runner import run_one_timed
from slo_core.sim.engine_types import DecisionCost


@pytest.fixture(scope="module")
def dc() -> ModuleType:
    load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")  # the scripts import them by name
    load_script(ROOT / "bench" / "run_phases.py", "run_phases")
    load_script(ROOT / "bench" / "event_decisions.py", "event_decisions")
    return load_script(ROOT / "bench" / "decision_cost.py", "decision_cost")


def test_a_charged_run_records_its_cost_and_the_free_one_is_the_sweeps(dc: ModuleType) -> None:
    task = dc.gmax_sweep.Task("tot", 1, 0, 8.0, "gmax", ("token",), 10.0, "round-robin")
    cost = DecisionCost(base_s=0.05, per_request_s=1e-4)  # heavy: the run must lose goodput
    key = (task.policy, task.router, task.rps)
    charged, _ = run_one_timed(task.config(), key, decision_cost=cost)
    free, _ = run_one_timed(task.config(), key)
    assert charged["decision_cost"] == {"base_s": 0.05, "per_request_s": 1e-4}
    assert "decision_cost" not in free
    assert charged["goodput_token_ratio"] < free["goodput_token_ratio"]
    row = dc.one(task, None)
    assert row["goodput"] == free["goodput_token_ratio"] and not row["charged"]


def test_the_table_reads_each_run_against_its_twin_and_gmax(dc: ModuleType) -> None:
    rows = [
        {
            "seed": 0,
            "objective": "token",
            "policy": p,
            "charged": c,
            "goodput": g,
            "cpu_s": 1.0,
        }
        for p, c, g in (
            ("gmax", False, 0.95),
            ("gmax", True, 0.90),
            ("gmax-deep-10", False, 0.93),
            ("gmax-deep-10", True, 0.92),
        )
    ]
    args = argparse.Namespace(
        family="tot", replicas=4, rps=26.0, duration=300.0, policies="gmax,gmax-deep-10"
    )
    text = dc.table(rows, args, DecisionCost(0.0027, 1.86e-6))
    assert "| 0 | token | gmax | 0.9500 | 0.9000 | -5.00 |  |" in text
    assert "| 0 | token | gmax-deep-10 | 0.9300 | 0.9200 | -1.00 | +2.00 |" in text
    assert "2.70 ms + 1.86 µs" in text and "against `gmax`" in text
