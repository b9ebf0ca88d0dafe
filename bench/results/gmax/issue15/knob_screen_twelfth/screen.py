"""Screen (not shipped): GMAX with one parameter's default changed, at one sweep point.

Looks for the knob behind GMAX's loss to gmax-no-analyzer at Tree-of-Thoughts token goodput on two
replicas (compound-low programs expire). Each run overrides GMAXParams defaults (JSON) and prints one
JSON line: objective ratios, rejections and the compound tiers' token ratios.

    PYTHONPATH=core:lab .venv/bin/python bench/results/gmax/issue15/knob_screen_twelfth/screen.py \\
        '{"program_rest": false}' tot 2 0 13.0 token

Same Task config, workload and analyzer as ``bench/gmax_sweep.py run`` (300 s, round-robin).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # bench/

import gmax_sweep

from slo_core.bench.runner import run_one_timed
from slo_core.policies import gmax_params


def main() -> int:
    overrides = json.loads(sys.argv[1])
    family, replicas, seed, rps, objective = sys.argv[2:7]
    for name, value in overrides.items():
        gmax_params.GMAXParams.model_fields[name].default = value
    gmax_params.GMAXParams.model_rebuild(force=True)
    if any(getattr(gmax_params.GMAXParams(), k) != v for k, v in overrides.items()):
        raise SystemExit("override not taken")
    task = gmax_sweep.Task(
        family, int(replicas), int(seed), float(rps), "gmax", (objective,), 300.0, "round-robin"
    )
    record, cpu_s = run_one_timed(task.config(), ("gmax", "round-robin", float(rps)))
    by_tier = record["by_tier"]
    tiers = {k: round(v["goodput_token_ratio"], 3) for k, v in by_tier.items() if k.startswith("compound")}
    line = {
        "over": overrides,
        "seed": int(seed),
        "obj": objective,
        "token": record["goodput_token_ratio"],
        "request": record["goodput_request_ratio"],
        "rejected": record["rejected"],
        "tiers": tiers,
        "cpu": round(cpu_s),
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
