"""bench/predictor_shift/goodput.py: the policy's parameters reach the simulated engines (both bounds),
so a GMAX variant runs through the same scenarios as the default."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pydantic
import pytest
from repo_paths import ROOT, load_script


def _goodput() -> ModuleType:
    return load_script(ROOT / "bench" / "predictor_shift" / "goodput.py", "predictor_shift_goodput")


def _setup(gp: ModuleType, tmp_path: Path) -> tuple[object, object]:
    rows = [gp.LengthRow(f"r{i}", "", 20 + 7 * i, 30 + 11 * (i % 9), "deadline") for i in range(60)]
    est = gp.train_estimator(rows, n_trees=2, min_samples_leaf=4)
    trace = gp._trace(rows, tmp_path / "trace.jsonl")
    spec = gp.WorkloadSpec(trace=trace, arrival="poisson", rps=4.0, duration_s=3.0, seed=0)
    return est, spec


def test_policy_params_reach_the_policy(tmp_path: Path) -> None:
    gp = _goodput()
    est, spec = _setup(gp, tmp_path)
    out = gp.run_one(est, spec, "gmax", None, "h100-llama3-8b-tp1", policy_params={"length_source": "oracle"})
    assert out["jobs"] > 0
    with pytest.raises(pydantic.ValidationError, match="no_such_knob"):
        gp.run_one(est, spec, "gmax", None, "h100-llama3-8b-tp1", policy_params={"no_such_knob": 1})
