"""An engine that keeps a keyed-admission policy's queue sorted as requests join it (SimEngine
``keyed_admission``: EDF, SJF-oracle, LTR, strict priority, whose running order it also keeps)
produces the run that asking the policy at every decision produces: the same tokens at the same
times, the same preemptions and decision counts. And each such policy keeps the contract the engine
relies on: its decision is the stable sort of the waiting queue by its admission key (and, for strict
priority, decodes first, then prefills by the key), with the same knobs every time."""

from __future__ import annotations

import random

import pytest
from sim_outcomes import outcomes

from slo_core.perf import load_profile
from slo_core.policies.base import BaseEnginePolicy, EngineView, RequestView
from slo_core.policies.baselines import EDF, LTR, SJFOracle, StrictPriority
from slo_core.predict import load_estimator
from slo_core.predict.calibration import OnlineCalibrator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.sim.request import RUNNING, SimRequest
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")


def _deciding(cls: type[BaseEnginePolicy]) -> type[BaseEnginePolicy]:
    """``cls`` asked at every decision (the reference the keyed engine must match)."""
    return type(f"Deciding{cls.__name__}", (cls,), {"keyed_admission": False})


KEYED = {"edf": EDF, "sjf-oracle": SJFOracle, "ltr": LTR, "strict-priority": StrictPriority}


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
            computed_tokens=rng.choice((0, 100, 600)),  # some decode, some are in prefill
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
    knobs = set()
    for n in (0, 1, 5, 40):
        waiting = _queue(rng, n)
        running = _queue(rng, n // 2)
        d = p.decide(waiting, running, engine, random.Random(0))
        assert d.admit == tuple(r.request_id for r in sorted(waiting, key=p.admission_key))
        assert (d.preempt, d.reject, d.hold_unlisted) == ((), (), False)
        knobs.add((d.token_budget, d.prefill_first))
        if p.keyed_running:
            decodes = [r for r in running if not r.in_prefill]
            prefills = sorted((r for r in running if r.in_prefill), key=p.admission_key)
            assert d.running_order == tuple(r.request_id for r in decodes + prefills)
        else:
            assert d.running_order is None
    assert len(knobs) == 1  # the engine learns them once


def test_the_kept_running_order_puts_decodes_first_then_prefills_by_priority() -> None:
    """The reorder the fleet cases never need (this engine admits only into budget the running
    requests left over, so at most one prefill is under way at the end of the running list), on a
    running list where it matters: two prefills out of priority order around a decode."""
    low = SLOTargets(RequestKind.BEST_EFFORT, deadline_s=30.0, priority_weight=1.0)
    high = SLOTargets(RequestKind.BEST_EFFORT, deadline_s=30.0, priority_weight=2.0)
    orders = []
    for policy in (StrictPriority(), _deciding(StrictPriority)()):
        e = SimEngine("e", H100, policy, keyed_admission=True)
        reqs = [
            SimRequest("low-prefill", 0.0, low, 1000, output_tokens=8, max_tokens=8),
            SimRequest("decode", 0.1, low, 100, output_tokens=8, max_tokens=8),
            SimRequest("high-prefill", 0.2, high, 1000, output_tokens=8, max_tokens=8),
        ]
        reqs[0].computed = 300
        reqs[1].computed, reqs[1].generated = 102, 3  # decoding: all but its newest token computed
        reqs[2].computed = 100
        for r in reqs:
            r.set_state(RUNNING)
        e.running = list(reqs)
        e._decide(1.0)
        orders.append([r.request_id for r in e.running])
    assert orders[0] == orders[1] == ["decode", "high-prefill", "low-prefill"]
