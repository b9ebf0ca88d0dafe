"""SlideBatching's deep-queue decision (kept terms, no order of the whole queue) runs the simulation
its planned decision runs: the same tokens at the same times, on overloaded fleets where the engines
are full, short of KV, or hold compound programs whose calls change while they wait."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import pytest
from sim_outcomes import outcomes

from slo_core.perf import load_profile
from slo_core.policies.base import Decision, EngineView, RequestView
from slo_core.policies.slide_batching import SlideBatching
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")


class Deep(SlideBatching):
    """The deep path wherever anything waits, listing one waiting request at first (the walks that
    need more list more); counts the decisions it took."""

    deep_from: ClassVar[int] = 1
    deep_prefix: ClassVar[int] = 1
    taken: ClassVar[list[int]] = [0]

    def _decide_deep(
        self, waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView
    ) -> Decision | None:
        decision = super()._decide_deep(waiting, running, engine)
        self.taken[0] += decision is not None
        return decision


class Planned(SlideBatching):
    """Every decision through the plan (the reference)."""

    deep_from: ClassVar[int] = 1 << 30


CASES = {
    # overloaded, KV pressure, compound programs
    "mixed-kv-pressure": (WorkloadSpec(duration_s=6, rps=24, mix=(1, 1, 1), seed=3), 60_000, 64),
    # few sequence slots: the engines are full most steps
    "full-engines": (WorkloadSpec(duration_s=8, rps=20, mix=(1, 1, 0), seed=4), 200_000, 8),
    # deep queues of latency requests, slots and KV to spare
    "latency-backlog": (WorkloadSpec(duration_s=6, rps=40, mix=(1, 0, 0), seed=6), None, 256),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_deep_decision_runs_the_planned_run(case: str) -> None:
    workload, kv, seqs = CASES[case]
    jobs = build_workload(workload)
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=kv, max_num_seqs=seqs))
    Deep.taken[0] = 0
    deep = FleetSim([spec, spec], Deep, "min-load", seed=3).run(jobs)
    planned = FleetSim([spec, spec], Planned, "min-load", seed=3).run(jobs)
    assert outcomes(deep) == outcomes(planned)
    assert Deep.taken[0] > 100  # the deep path decided
