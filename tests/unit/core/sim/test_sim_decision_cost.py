"""A decision's CPU time charged to its step (``DecisionCost``: the vLLM plugin decides on the engine's
step loop, between two GPU steps): a decided step ends that much later, exactly; a FIFO policy (never
asked) and a quiet or deep-queue-deferred decision cost nothing; the simulator's exact shortcuts
(coasting, order-free decisions left out, keyed admission) still give the run that stepping and
deciding every step give; with no cost the run is the run without the option."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from sim_outcomes import outcomes

from slo_core.perf import load_profile
from slo_core.policies.base import BaseEnginePolicy, Decision
from slo_core.policies.registry import make_engine_policy
from slo_core.policies.slide_batching import SlideBatching
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import DecisionCost, EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig, SimResult
from slo_core.sim.request import SimRequest
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")
COST = DecisionCost(base_s=0.004, per_request_s=2e-5)
OVERLOAD = WorkloadSpec(duration_s=8, rps=24, mix=(1, 1, 1), seed=3)
LIGHT = WorkloadSpec(duration_s=40.0, rps=3.0, mix=(1, 0, 0), seed=11)


class EveryStep(SlideBatching):
    """SlideBatching with every decision taken (what the engine leaves out is still made)."""

    order_free_decisions = False


def _run(policy: Any, workload: WorkloadSpec, cost: DecisionCost | None, *, coast: bool = True) -> SimResult:
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=60_000, max_num_seqs=64))
    sim = FleetSim(
        [spec, spec], policy, "round-robin", seed=3, config=SimConfig(coast=coast), decision_cost=cost
    )
    return sim.run(build_workload(workload))


def _engine(policy: str, cost: DecisionCost | None) -> SimEngine:
    engine = SimEngine("e", H100, make_engine_policy(policy, None), rng=random.Random(1), decision_cost=cost)
    slo = SLOTargets(RequestKind.DEADLINE, deadline_s=30.0)
    for i in range(5):
        r = SimRequest(f"r{i}", 0.0, slo, 200 + 10 * i, output_tokens=20, max_tokens=64, deadline_at_s=30.0)
        engine.accept(r, 0.0)
    return engine


@pytest.mark.parametrize("policy", ["gmax", "edf", "slide-batching", "tempo"])
def test_a_decided_step_ends_later_by_exactly_the_decisions_seconds(policy: str) -> None:
    free, costed = _engine(policy, None), _engine(policy, COST)
    end_free, end_costed = free.plan(0.0), costed.plan(0.0)
    assert end_free is not None and end_costed is not None
    assert free.decisions == costed.decisions == 1 or policy == "slide-batching"
    assert end_costed == end_free + COST.seconds(5)
    assert costed.decision_s == COST.seconds(5) and free.decision_s == 0.0


def test_a_fifo_policy_is_never_asked_so_nothing_is_charged() -> None:
    engine = _engine("fcfs", COST)
    end = engine.plan(0.0)
    assert end == _engine("fcfs", None).plan(0.0) and engine.decision_s == 0.0


@pytest.mark.parametrize("policy", ["fcfs", "gmax", "edf", "tempo"])
def test_no_cost_is_the_run_without_the_option(policy: str) -> None:
    assert outcomes(_run(policy, OVERLOAD, DecisionCost())) == outcomes(_run(policy, OVERLOAD, None))


@pytest.mark.parametrize("policy", ["gmax", "edf", "slide-batching", "tempo", "autellix"])
@pytest.mark.parametrize("workload", [OVERLOAD, LIGHT], ids=["overload", "light"])
def test_coasting_with_a_cost_is_stepping_with_it(policy: str, workload: WorkloadSpec) -> None:
    coasting, stepping = _run(policy, workload, COST), _run(policy, workload, COST, coast=False)
    assert outcomes(coasting) == outcomes(stepping)
    assert coasting.end_s == stepping.end_s
    assert outcomes(coasting) != outcomes(_run(policy, workload, None))  # the cost moved the run


def test_an_order_free_policys_left_out_decisions_are_charged_as_made() -> None:
    """The engine leaves out SlideBatching's decisions that cannot change what runs; the plugin would
    make them, so they are charged: the run is the run that makes every one."""
    skipping, reference = _run(SlideBatching, OVERLOAD, COST), _run(EveryStep, OVERLOAD, COST)
    assert outcomes(skipping) == outcomes(reference)
    decided = [sum(s["decisions"] for s in r.replica_stats) for r in (skipping, reference)]
    assert decided[0] < decided[1]  # the left-out path ran


def _one(policy: Any, workload: WorkloadSpec, cost: DecisionCost, **params: Any) -> SimEngine:
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=60_000, max_num_seqs=64))
    sim = FleetSim([spec], policy, seed=3, policy_params=params or None, decision_cost=cost)
    sim.run(build_workload(workload))
    return sim.engines[0]


def test_decisions_left_out_as_quiet_or_deferred_cost_nothing() -> None:
    quiet = _one("gmax", LIGHT, DecisionCost(base_s=0.004))
    assert quiet.quiet_skipped > 0 and quiet.decision_s == pytest.approx(0.004 * quiet.decisions)
    deep = _one("gmax", OVERLOAD, DecisionCost(base_s=0.004), deep_queue_from=4, deep_queue_every=10)
    every = _one("gmax", OVERLOAD, DecisionCost(base_s=0.004))
    assert deep.decision_s == pytest.approx(0.004 * deep.decisions)
    assert deep.decisions < every.decisions  # the deep-queue rule left events for later


def test_the_charge_follows_the_queue() -> None:
    per = _one("gmax", OVERLOAD, DecisionCost(per_request_s=1e-4))
    assert per.decision_s > 1e-4 * per.decisions  # more than one request a decision


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "1"])
def test_a_cost_must_be_finite_and_not_negative(bad: Any) -> None:
    with pytest.raises(ValueError):
        DecisionCost(base_s=bad)
    with pytest.raises(ValueError):
        DecisionCost(per_request_s=bad)


class HoldAll(BaseEnginePolicy):
    """Admits nobody: each decision leaves the engine idle until its next poll."""

    name = "hold-all"

    def decide(self, waiting: Any, running: Any, engine: Any, rng: Any) -> Decision:
        return Decision(admit=(), hold_unlisted=True)


def test_a_decision_that_runs_nothing_delays_the_next_poll() -> None:
    slo = SLOTargets(RequestKind.DEADLINE, deadline_s=30.0)
    for cost, extra in ((None, 0.0), (COST, COST.seconds(1))):
        engine = SimEngine("e", H100, HoldAll(), decision_cost=cost)
        engine.accept(SimRequest("r", 0.0, slo, 100, output_tokens=5, max_tokens=8, deadline_at_s=30.0), 0.0)
        assert engine.plan(1.0) == 1.0 + engine.config.idle_poll_s + extra
