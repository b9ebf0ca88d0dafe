"""A fleet whose engines coast (run the steps nothing can change in one pass: SimEngine.coast) produces
the run that stepping through the event queue one step at a time produces: every request's state,
replica, finish time, preemptions and token times, and every replica's counters, bit for bit."""

from __future__ import annotations

import pytest
from sim_outcomes import outcomes

from slo_core.perf import load_profile
from slo_core.predict import load_estimator
from slo_core.predict.calibration import OnlineCalibrator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig, SimResult
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads import WorkloadSpec, build_workload
from slo_core.workloads.jobs import Job

H100 = load_profile("h100-llama3-8b-tp1")


def counters(result: SimResult) -> list[dict[str, float]]:
    return [{k: v for k, v in s.items() if k != "steps_coasted"} for s in result.replica_stats]


def both(
    workload: WorkloadSpec | list[Job],
    policy: str,
    router: str = "round-robin",
    *,
    kv: int | None = None,
    seqs: int = 256,
    replicas: int = 2,
    analyzer: bool = False,
    **config: object,
) -> tuple[SimResult, SimResult]:
    jobs = build_workload(workload) if isinstance(workload, WorkloadSpec) else workload
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=kv, max_num_seqs=seqs))
    runs = []
    for coast in (True, False):
        a = None
        if analyzer:
            est = load_estimator()
            a = SimAnalyzer(est, calibrator=OnlineCalibrator(est.params.quantile))
        sim = FleetSim(
            [spec] * replicas, policy, router, seed=4, analyzer=a, config=SimConfig(coast=coast, **config)
        )
        runs.append(sim.run(jobs))
    return runs[0], runs[1]


def assert_same(coasting: SimResult, stepping: SimResult, coasted_share: float = 0.2) -> None:
    assert outcomes(coasting) == outcomes(stepping)
    assert counters(coasting) == counters(stepping)
    assert coasting.end_s == stepping.end_s
    assert sum(s["steps_coasted"] for s in stepping.replica_stats) == 0
    # the coasting path ran (for most steps of the light runs)
    coasted = sum(s["steps_coasted"] for s in coasting.replica_stats)
    assert coasted > coasted_share * sum(s["steps"] for s in coasting.replica_stats)


LIGHT = WorkloadSpec(duration_s=60.0, rps=3.0, mix=(1, 0, 0), seed=11)


@pytest.mark.parametrize(
    "policy",
    # FIFO (fifo_fast_path), order-free (decisions left out), every-frame with events, frames of 8 and 32
    ["fcfs", "sarathi", "edf", "slide-batching", "gmax", "gmax-no-gmax", "tempo", "annealing", "autellix"],
)
def test_coasting_changes_no_outcome_at_light_load(policy: str) -> None:
    assert_same(*both(LIGHT, policy))


def test_coasting_under_kv_pressure_stops_where_a_block_would_be_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a KV cache so small that decodes preempt: coasting runs only the steps whose blocks fit
    short: list[int] = []
    blocks_to_run = SimEngine._blocks_to_run

    def spy(self: SimEngine, steps: int) -> int:
        need = blocks_to_run(self, steps)
        if need > self.free_blocks:
            short.append(steps)
        return need

    monkeypatch.setattr(SimEngine, "_blocks_to_run", spy)
    # two long decodes outgrow a 2,048-token cache with nothing waiting: the later one is preempted
    slo = SLOTargets(RequestKind.DEADLINE, deadline_s=600.0)
    jobs = [Job("a", 0.0, slo, 100, 1500, max_tokens=1500), Job("b", 0.1, slo, 100, 1500, max_tokens=1500)]
    coasting, stepping = both(jobs, "fcfs", kv=2_048, seqs=64, replicas=1)
    assert sum(s["preemptions"] for s in stepping.replica_stats) > 0
    assert short  # some coasts were cut short by the free blocks
    assert_same(coasting, stepping)


@pytest.mark.parametrize(
    ("policy", "router", "replicas", "seed"),
    [("fcfs", "go-routing", 2, 7), ("gmax", "min-load", 4, 7), ("autellix", "min-load", 4, 8)],
)
def test_coasting_beside_compound_programs_changes_no_outcome(
    policy: str, router: str, replicas: int, seed: int
) -> None:
    # programs' calls run beside single requests: a call finishing on one engine routes its program's
    # next stage, reading every engine, so an engine holding a call bounds the others' coasting
    # (without that bound each of these cases routes a stage differently)
    workload = WorkloadSpec(duration_s=30.0, rps=2.0, mix=(1, 1, 1), seed=seed)
    assert_same(*both(workload, policy, router, replicas=replicas), coasted_share=0.0)


def test_coasting_with_stale_reports_a_calibrating_analyzer_and_drain_all() -> None:
    workload = WorkloadSpec(duration_s=40.0, rps=3.0, mix=(1, 1, 0), seed=2)
    assert_same(*both(workload, "gmax", "go-routing", analyzer=True, report_interval_s=0.5, drain="all"))


def test_coasting_stops_at_the_horizon() -> None:
    # drain 'all' with a short drain: the run ends mid-decode, where stepping would have stopped
    workload = WorkloadSpec(duration_s=20.0, rps=3.0, mix=(1, 0, 0), seed=3)
    coasting, stepping = both(workload, "fcfs", drain="all", max_drain_s=0.5)
    assert any(r.finish_s is None for r in stepping.requests)
    assert_same(coasting, stepping)
