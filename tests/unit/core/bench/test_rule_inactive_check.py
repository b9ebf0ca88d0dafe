"""bench/rule_inactive_check.py: where no queue reaches the rule's depth, GMAX's record is GMAX-at-every-
event's field for field; the comparison names the fields that moved, and finds the sweep's record."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from repo_paths import ROOT, load_script

from slo_core.bench.runner import run_one_timed


@pytest.fixture(scope="module")
def ric() -> ModuleType:
    load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")  # the scripts import them by name
    load_script(ROOT / "bench" / "run_phases.py", "run_phases")
    load_script(ROOT / "bench" / "event_decisions.py", "event_decisions")
    return load_script(ROOT / "bench" / "rule_inactive_check.py", "rule_inactive_check")


def test_moved_names_the_fields_that_differ_and_ignores_name_and_timings(ric: ModuleType) -> None:
    a = {"policy": "gmax", "goodput_token_ratio": 0.9, "completed": 10, "wall_s": 1.0}
    b = {"policy": "gmax-every-event", "goodput_token_ratio": 0.9, "completed": 11, "wall_s": 2.0}
    assert ric.moved(a, b) == ["completed"]
    assert ric.moved(a, {**a, "policy": "x", "wall_s": 9.0}) == []
    assert ric.moved(a, {**a, "extra": 1}) == ["extra"]


def test_a_shallow_run_is_the_same_with_the_rule_on_or_off(ric: ModuleType, tmp_path: Path) -> None:
    task = ric.gmax_sweep.Task("tot", 1, 0, 6.0, "gmax-every-event", ("token",), 20.0, "round-robin")
    off = ric._one(task)
    on, _ = run_one_timed(task.config(), ("gmax", task.router, task.rps))
    assert "goodput_over_time" not in off and off["family"] == "tot"  # as the sweep stores it
    on = ric.gmax_sweep.as_stored(on, task)
    assert on["completed"] > 0 and ric.moved(off, on) == []  # 120 requests: no queue of 512
    (tmp_path / "records-tot-r1-s0-token.json").write_text(json.dumps([on]), encoding="utf-8")
    assert ric.swept(tmp_path, task, "gmax") == on
    with pytest.raises(LookupError):
        ric.swept(tmp_path, task, "fcfs")
