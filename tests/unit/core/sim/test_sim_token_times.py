"""The simulator promises its token times in order (``Delivery.times_in_order``, which lets the
on-time count read a few of them): every request's times never decrease, through prefill chunks,
coasted decode runs, KV preemptions and recompute, and the goodput the fleet and the policies'
feedback compute from that promise is the goodput of every token compared with its deadline."""

from __future__ import annotations

import dataclasses

import pytest

from slo_core.gain import Delivery, latency_token_outcome, request_goodput, token_goodput
from slo_core.objective import Objective
from slo_core.perf import load_profile
from slo_core.policies import feedback as feedback_module
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.sim.outcomes import program_delivery, request_delivery
from slo_core.slo import RequestKind
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")


@pytest.mark.parametrize("policy", ["gmax", "fcfs"])
def test_token_times_never_decrease_and_the_in_order_count_is_every_tokens(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Delivery] = []
    call_delivery = feedback_module.call_delivery

    def recording(*args: object, **kwargs: object) -> Delivery:
        d = call_delivery(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(d)
        return d

    monkeypatch.setattr(feedback_module, "call_delivery", recording)
    jobs = build_workload(WorkloadSpec(duration_s=8, rps=40, mix=(1, 1, 1), seed=5))
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=20_000, max_num_seqs=48))
    sim = FleetSim([spec, spec], policy, "round-robin", seed=2, objective=Objective(goodput="token"))
    result = sim.run(jobs)
    assert sum(s["preemptions"] for s in result.replica_stats) > 0  # recompute after preemption
    assert sum(s["steps_coasted"] for s in result.replica_stats) > 0
    assert any(len(r.token_times) > 100 for r in result.requests)
    deliveries = [request_delivery(r) for r in result.requests]
    deliveries += [program_delivery(p) for p in result.programs]
    if policy == "gmax":
        assert seen and all(d.times_in_order for d in seen)
        deliveries += seen
    latency = partly_late = 0
    for d in deliveries:
        assert d.times_in_order
        times = list(d.token_times_s)
        assert times == sorted(times)
        every = dataclasses.replace(d, times_in_order=False)
        assert token_goodput(d) == token_goodput(every)
        assert request_goodput(d) == request_goodput(every)
        if d.slo.kind is RequestKind.LATENCY:
            latency += 1
            n = len(times)
            assert latency_token_outcome(d, n) == latency_token_outcome(every, n)
            partly_late += 0 < token_goodput(every) < d.slo.priority_weight * n
    assert latency > 50
    assert partly_late > 0  # tokens on both sides of their deadlines in one request
