"""Seeded fleet runs reproduce their recorded per-request outcomes (the simulator's speed work changes
how snapshots are built, never what a run produces).

The golden file holds, per policy, a digest of every request's outcome (state, replica, finish time,
preemptions, every token time) of a small overloaded run with KV pressure and compound programs.
Re-record (only when a change is *meant* to alter outcomes) with
``.venv/bin/python tests/unit/core/sim/test_sim_golden.py --record``.
"""

from __future__ import annotations

import hashlib
import json
import sys

import pytest
from repo_paths import ROOT

from slo_core.perf import load_profile
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimResult
from slo_core.workloads import WorkloadSpec, build_workload

GOLDEN = ROOT / "tests" / "golden" / "sim" / "outcomes.json"
POLICIES = (
    "fcfs",
    "sarathi",
    "edf",
    "ltr",
    "autellix",
    "tempo",
    "slide-batching",
    "slos-serve",
    "annealing",
    "gmax",
    "gmax-oracle",
    "gmax-no-analyzer",
    "gmax-no-gmax",
)


def run(policy: str) -> SimResult:
    jobs = build_workload(WorkloadSpec(duration_s=6.0, rps=24.0, mix=(1, 1, 1), seed=3))
    cfg = EngineConfig(kv_cache_tokens=60_000, max_num_seqs=64)
    spec = ReplicaSpec(load_profile("h100-llama3-8b-tp1"), cfg)
    return FleetSim([spec, spec], policy, "min-load", seed=3).run(jobs)


def outcome_rows(result: SimResult) -> list[list[object]]:
    rows: list[list[object]] = []
    for r in sorted(result.requests, key=lambda r: r.request_id):
        rows.append(
            [r.request_id, r.state, r.replica, repr(r.finish_s), r.preemptions, r.generated, r.token_times]
        )
    return rows


def digest(result: SimResult) -> dict[str, object]:
    rows = outcome_rows(result)
    blob = json.dumps(rows, separators=(",", ":"), default=repr).encode()
    return {
        "requests": len(rows),
        "tokens": sum(len(row[6]) for row in rows),  # type: ignore[arg-type]
        "preemptions": sum(int(row[4]) for row in rows),  # type: ignore[call-overload]
        "sha256": hashlib.sha256(blob).hexdigest(),
    }


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_seeded_run_matches_golden(policy: str) -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert digest(run(policy)) == golden[policy]


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    out = {p: digest(run(p)) for p in POLICIES}
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=1))
