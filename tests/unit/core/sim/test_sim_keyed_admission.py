"""An engine that keeps a keyed-admission policy's queue sorted as requests join it (SimEngine
``keyed_admission``: EDF, SJF-oracle, LTR) produces the run that asking the policy at every decision
produces: the same tokens at the same times, the same preemptions and decision counts. And each such
policy keeps the contract the engine relies on: its decision is the stable sort of the waiting queue by
its admission key, and nothing else."""

from __future__ import annotations

import random

import pytest

from slo_core.perf import load_profile
from slo_core.policies.base import BaseEnginePolicy, EngineView, RequestView
from slo_core.policies.baselines import EDF, LTR, SJFOracle
from slo_core.predict import load_estimator
from slo_core.predict.calibration import OnlineCalibrator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimResult
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")


def _deciding(cls: type[BaseEnginePolicy]) -> type[BaseEnginePolicy]:
    """``cls`` asked at every decision (the reference the keyed engine must match)."""
    return type(f"Deciding{cls.__name__}", (cls,), {"keyed_admission": False})


KEYED = {"edf": EDF, "sjf-oracle": SJFOracle, "ltr": LTR}


def outcomes(result: SimResult) -> list[tuple[object, ...]]:
    return [
        (r.request_id, r.state, r.replica, r.finish_s, r.preemptions, r.generated, tuple(r.token_times))
        for r in sorted(result.requests, key=lambda r: r.request_id)
    ]


CASES = {
    # overloaded, KV pressure (the engine preempts, and requeues at the front), compound programs
    "mixed-kv-pressure": (WorkloadSpec(duration_s=6, rps=24, mix=(1, 1, 1), seed=3), 60_000, 64, "min-load"),
    # Tree-of-Thoughts: a stage's calls arrive together with one sub-deadline (ties in EDF's key)
    "tot-ties": (
        WorkloadSpec(duration_s=8, rps=6, mix=(0, 0, 1), dags="tot", seed=4),
        200_000,
        32,
        "round-robin",
    ),
    # light load: short queues, most decisions find nothing to order
    "light-latency": (WorkloadSpec(duration_s=20.0, rps=4.0, mix=(1, 0, 0), seed=9), None, 256, "p2c"),
}


@pytest.mark.parametrize("policy", sorted(KEYED))
@pytest.mark.parametrize("case", sorted(CASES))
def test_keeping_the_queue_sorted_changes_no_outcome(case: str, policy: str) -> None:
    workload, kv, seqs, router = CASES[case]
    jobs = build_workload(workload)
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=kv, max_num_seqs=seqs))
    keyed_fleet = FleetSim([spec, spec], KEYED[policy], router, seed=3)
    assert all(e._keyed for e in keyed_fleet.engines)  # the keyed path runs
    keyed = keyed_fleet.run(jobs)
    reference_fleet = FleetSim([spec, spec], _deciding(KEYED[policy]), router, seed=3)
    assert not any(e._keyed for e in reference_fleet.engines)
    reference = reference_fleet.run(jobs)
    assert outcomes(keyed) == outcomes(reference)
    assert keyed.replica_stats == reference.replica_stats  # decisions and preemptions included
    if case == "mixed-kv-pressure":
        assert sum(s["preemptions"] for s in keyed.replica_stats) > 0  # the front insertion ran


def test_the_engine_asks_the_policy_where_the_queue_order_is_read_or_views_teach() -> None:
    spec = ReplicaSpec(H100)
    # a router that reads every replica's queue would see it sorted before the policy's decision
    assert not any(e._keyed for e in FleetSim([spec], EDF, "go-routing").engines)
    # an online-calibrated analyzer learns from the views every decision refreshes
    est = load_estimator()
    analyzer = SimAnalyzer(est, calibrator=OnlineCalibrator(est.params.quantile))
    assert not any(e._keyed for e in FleetSim([spec], EDF, "round-robin", analyzer=analyzer).engines)


SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.05),
    SLOTargets(RequestKind.DEADLINE, deadline_s=4.0),
    SLOTargets(RequestKind.BEST_EFFORT, deadline_s=30.0),
)


def _queue(rng: random.Random, n: int) -> list[RequestView]:
    return [
        RequestView(
            request_id=f"r{i}",
            slo=rng.choice(SLOS),
            arrival_s=float(rng.randrange(5)),  # few distinct values: ties
            prompt_tokens=rng.randrange(1, 500),
            max_tokens=rng.choice((64, 128)),
            generated_tokens=rng.choice((0, 0, 3)),
            deadline_at_s=rng.choice((None, 6.0, 9.0)),
            output_bound=rng.choice((None, 50, 100)),
            true_output_tokens=rng.choice((None, 20, 40)),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("policy", sorted(KEYED))
def test_a_keyed_policys_decision_is_the_stable_sort_by_its_key(policy: str) -> None:
    rng = random.Random(11)
    p = KEYED[policy]()
    assert p.keyed_admission
    engine = EngineView(
        now_s=7.0, step=3, max_num_seqs=8, max_num_batched_tokens=2048, kv_blocks_total=100, kv_blocks_free=40
    )
    for n in (0, 1, 5, 40):
        waiting = _queue(rng, n)
        running = _queue(rng, 3)
        d = p.decide(waiting, running, engine, random.Random(0))
        assert d.admit == tuple(r.request_id for r in sorted(waiting, key=p.admission_key))
        assert (d.preempt, d.reject, d.running_order, d.token_budget) == ((), (), None, None)
        assert not d.prefill_first and not d.hold_unlisted
