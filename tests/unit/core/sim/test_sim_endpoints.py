"""A router that reads only the replicas' counters is offered the engines themselves (each view taken
when the pipeline reads it, survivors only); the run is the one in which every replica's snapshot is
taken first and offered as a ``SnapshotEndpoint``, replicas that the context filter turns away
included."""

from __future__ import annotations

import pytest
from sim_outcomes import outcomes

from slo_core.perf import load_profile
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")


class SnapshotFirstFleet(FleetSim):
    """The fleet as it routed before: a snapshot of every replica at every routing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        assert self._endpoints is not None
        self._endpoints = None


@pytest.mark.parametrize("router", ["round-robin", "min-load"])
def test_engines_as_endpoints_route_as_their_snapshots(router: str) -> None:
    # one replica too short for the longer prompts: the context filter turns it away for them
    short = ReplicaSpec(H100, EngineConfig(max_model_len=1_500, max_num_seqs=32))
    long = ReplicaSpec(H100, EngineConfig(max_num_seqs=32))
    jobs = build_workload(WorkloadSpec(duration_s=6, rps=20, mix=(1, 1, 1), seed=7))
    runs = [
        outcomes(cls([short, long, long], "fcfs", router, seed=3).run(jobs))
        for cls in (FleetSim, SnapshotFirstFleet)
    ]
    assert runs[0]
    assert runs[0] == runs[1]
    assert any(j.prompt_tokens > 1_500 for j in jobs if j.stages is None)  # the filter has work


def test_a_router_that_reads_the_queues_gets_snapshots() -> None:
    sim = FleetSim([ReplicaSpec(H100, EngineConfig())] * 2, "fcfs", "go-routing")
    assert sim._endpoints is None
