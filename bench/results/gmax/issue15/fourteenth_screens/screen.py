"""Screen (not shipped): GMAX at one sweep point with one mechanism switched, to find what moved.

    PYTHONPATH=core:lab .venv/bin/python bench/results/gmax/issue15/fourteenth_screens/screen.py \\
        calibrate-kinds=deadline,compound conv 2 0 10.25 token
    ... screen.py demand-floor=on tot 2 0 8.66 request

``calibrate-kinds=K1,K2``: the learned bound reading (and so the calibration) kept only for these
request kinds; the others are read at the static z with their raw bound, as without learning.
``demand-floor=on``: the demand floor of gmax_budget also under the request goodput (off by design).
``calm-guard=DELTA,WINDOW_S``: GMAXParams' calm guard on (``calm_delta_per_frame`` DELTA,
``calm_window_s`` WINDOW_S): the starvation guard's δ is DELTA while the engine has dropped no waiting
request past its deadline for WINDOW_S seconds, the shipped δ otherwise. (The first screen of it,
``starvation_guard.jsonl``'s ``calm-guard`` lines, swapped GMAX's params per decision from outside with
the same rule; this form reproduces those records.)
``none``: the shipped GMAX (reproduces the committed sweep record).
Same Task config, workload and analyzer as ``bench/gmax_sweep.py run`` (300 s, round-robin); one JSON
line per run: both objective ratios, rejections, per-tier ratios under the run's objective, CPU s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # bench/

import gmax_sweep

from slo_core.bench.runner import run_one_timed
from slo_core.policies import gmax, gmax_bound, gmax_budget
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_snapshot import KIND_CODES
from slo_core.slo import RequestKind


def _keep_learning_for(kinds: set[int]) -> None:
    learn = gmax_bound.BoundReading.learn

    def patched(self: gmax_bound.BoundReading, finished: Any) -> None:
        learn(self, finished)
        for code in range(gmax_bound.N_KINDS):
            if code not in kinds:
                self._z[code] = self.static_z
        self._z_rows = np.array(self._z)
        self._scale_rows = np.exp(-(self._z_rows - self.static_z) * self.sigma)
        self._scale = self._scale_rows.tolist()

    gmax_bound.BoundReading.learn = patched  # type: ignore[method-assign]


def _demand_floor_always(p: GMAXParams) -> bool:
    return p.demand_floor


def _calm_guard(delta: float, window_s: float) -> None:
    """Make GMAXParams' calm guard (calm_delta_per_frame, calm_window_s) the default for this run."""
    fields = GMAXParams.model_fields
    fields["calm_delta_per_frame"].default = delta
    fields["calm_window_s"].default = window_s
    GMAXParams.model_rebuild(force=True)
    p = GMAXParams()
    if (p.calm_delta_per_frame, p.calm_window_s) != (delta, window_s):
        raise SystemExit("override not taken")


def main() -> int:
    switch = sys.argv[1]
    family, replicas, seed, rps, objective = sys.argv[2:7]
    if switch.startswith("calibrate-kinds="):
        names = [k for k in switch.split("=", 1)[1].split(",") if k]
        _keep_learning_for({KIND_CODES[RequestKind(k)] for k in names})
    elif switch == "demand-floor=on":
        gmax_budget.demand_floor_applies = _demand_floor_always
        gmax.demand_floor_applies = _demand_floor_always
    elif switch.startswith("calm-guard="):
        delta, window_s = switch.split("=", 1)[1].split(",")
        _calm_guard(float(delta), float(window_s))
    elif switch != "none":
        raise SystemExit(f"unknown switch {switch!r}")
    task = gmax_sweep.Task(
        family, int(replicas), int(seed), float(rps), "gmax", (objective,), 300.0, "round-robin"
    )
    record, cpu_s = run_one_timed(task.config(), ("gmax", "round-robin", float(rps)))
    key = f"goodput_{objective}_ratio"
    line = {
        "switch": switch,
        "family": family,
        "replicas": int(replicas),
        "seed": int(seed),
        "rps": float(rps),
        "objective": objective,
        "token": round(record["goodput_token_ratio"], 6),
        "request": round(record["goodput_request_ratio"], 6),
        "rejected": record["rejected"],
        "tiers": {k: round(v[key], 3) for k, v in record["by_tier"].items()},
        "cpu": round(cpu_s),
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
