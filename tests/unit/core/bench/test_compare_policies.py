"""Every registered engine policy and router runs from an SLOPolicy-shaped {name, params} config on a
tiny mixed workload and ends every request (finished or rejected; none left waiting or running)."""

from __future__ import annotations

import pytest

from slo_core.crd.policy import PolicyRef
from slo_core.metrics import summarize
from slo_core.perf import load_profile
from slo_core.policies.registry import engine_policy_names, router_policy_names
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.sim.request import FINISHED, REJECTED
from slo_core.workloads import WorkloadSpec, build_workload

JOBS = build_workload(
    WorkloadSpec(trace="azure-conv-2023", arrival="poisson", rps=1.0, duration_s=8.0, seed=11)
)
PROFILE = load_profile("h100-llama3-8b-tp1")


def _run(engine: PolicyRef, router: PolicyRef, replicas: int) -> None:
    sim = FleetSim(
        [ReplicaSpec(PROFILE) for _ in range(replicas)],
        engine.name,
        router.name,
        policy_params=engine.params,
        router_params=router.params,
        config=SimConfig(drain="all"),
    )
    result = sim.run(JOBS)
    assert result.requests, "the workload produced no requests"
    left = [r.request_id for r in result.requests if r.state not in (FINISHED, REJECTED)]
    assert left == []
    m = summarize(result)
    assert m["jobs"] == len(JOBS)
    assert m["completed"] + m["rejected"] == len(JOBS)
    assert m["completed"] > 0


@pytest.mark.parametrize("name", engine_policy_names())
def test_engine_policy_from_config_ends_every_request(name: str) -> None:
    _run(PolicyRef.model_validate({"name": name, "params": {}}), PolicyRef(name="round-robin"), 1)


@pytest.mark.parametrize("name", router_policy_names())
def test_router_from_config_ends_every_request(name: str) -> None:
    engine = "slos-serve" if name == "slos-serve-reroute" else "fcfs"
    _run(PolicyRef(name=engine), PolicyRef.model_validate({"name": name, "params": {}}), 2)
