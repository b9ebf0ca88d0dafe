"""An engine that leaves out an order-free policy's decisions where they cannot change what runs
(SimEngine ``skip_order_free``) produces the run that deciding every step produces: the same tokens at
the same times, and the same running order wherever a router reads it."""

from __future__ import annotations

import pytest
from sim_outcomes import outcomes

from slo_core.perf import load_profile
from slo_core.policies.base import ReplicaView
from slo_core.policies.slide_batching import SlideBatching
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.sim.request import UNARRIVED, ProgramState, SimRequest
from slo_core.sim.views import request_views
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")


class EveryStep(SlideBatching):
    """SlideBatching with every decision taken (the reference the skipping engine must match)."""

    order_free_decisions = False


CASES = {
    # overloaded, KV pressure, compound programs whose stages are routed on finishes
    "mixed-kv-pressure": (WorkloadSpec(duration_s=6, rps=24, mix=(1, 1, 1), seed=3), 60_000, 64, "min-load"),
    # a router that reads every replica's running order on each arrival
    "snapshot-router": (WorkloadSpec(duration_s=4, rps=14, mix=(1, 1, 1), seed=5), 80_000, 64, "go-routing"),
    # light load: almost every step is left out
    "light-latency": (WorkloadSpec(duration_s=30.0, rps=4.0, mix=(1, 0, 0), seed=9), None, 256, "p2c"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_leaving_out_order_free_decisions_changes_no_outcome(case: str) -> None:
    workload, kv, seqs, router = CASES[case]
    jobs = build_workload(workload)
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=kv, max_num_seqs=seqs))
    runs = {}
    for policy in (SlideBatching, EveryStep):
        runs[policy] = FleetSim([spec, spec], policy, router, seed=3).run(jobs)
    skipping, reference = runs[SlideBatching], runs[EveryStep]
    assert outcomes(skipping) == outcomes(reference)
    decided = [sum(s["decisions"] for s in r.replica_stats) for r in (skipping, reference)]
    assert decided[0] < decided[1]  # the skipping path ran


def test_a_stale_report_is_taken_with_the_left_out_decision_applied() -> None:
    jobs = build_workload(WorkloadSpec(duration_s=4.0, rps=14.0, mix=(1, 0, 1), seed=7))
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=80_000, max_num_seqs=64))
    config = SimConfig(report_interval_s=0.05)
    skipping = FleetSim([spec] * 2, SlideBatching, "go-routing", seed=1, config=config).run(jobs)
    reference = FleetSim([spec] * 2, EveryStep, "go-routing", seed=1, config=config).run(jobs)
    assert outcomes(skipping) == outcomes(reference)


def _requests() -> list[SimRequest]:
    """Twelve requests arriving over 0.11 s; every third one a call of a compound program."""
    slos = (
        SLOTargets(RequestKind.LATENCY, ttft_s=0.4, tbt_s=0.03),
        SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1, priority_weight=2.0),
        SLOTargets(RequestKind.COMPOUND, deadline_s=3.0),
    )
    out = []
    for i in range(12):
        slo = slos[i % 3]
        program = ProgramState(f"p{i}", 0.01 * i, slo, ((),)) if slo.kind is RequestKind.COMPOUND else None
        out.append(
            SimRequest(
                f"r{i}",
                0.01 * i,
                slo,
                50 + 197 * i,
                output_tokens=5 + 23 * i,
                max_tokens=400,
                deadline_at_s=0.01 * i + 3.0 if program is not None else None,
                program=program,
            )
        )
    return out


ENGINES = {
    "roomy": EngineConfig(max_num_seqs=8),
    "token-budget": EngineConfig(max_num_seqs=8, max_num_batched_tokens=512),  # running prefills chunked
    "kv-pressure": EngineConfig(max_num_seqs=8, kv_cache_tokens=6_000),  # two KV preemptions
}


@pytest.mark.parametrize("mid_step", [True, False], ids=["read-mid-step", "read-after-finishes"])
@pytest.mark.parametrize("config", sorted(ENGINES))
def test_the_running_order_a_reader_sees_is_the_order_deciding_every_step_gives(
    config: str, *, mid_step: bool
) -> None:
    """Read mid-step (a router between steps; a read applies a left-out decision, so the other case
    reads only after a program's call finished: the fleet routes its next stage then, before the
    engine plans again)."""
    cfg = ENGINES[config]
    engines = [
        SimEngine("e", H100, SlideBatching(), cfg, skip_order_free=True),
        SimEngine("e", H100, EveryStep(), cfg, skip_order_free=True),
    ]
    queues = [_requests(), _requests()]
    now = 0.0
    for step in range(2000):
        ends = set()
        for e, reqs in zip(engines, queues, strict=True):
            for r in reqs:  # arrivals spread over the first steps
                if r.state == UNARRIVED and r.arrival_s <= now:
                    e.accept(r, now)
            ends.add(e.plan(now))
        assert len(ends) == 1
        (end,) = ends
        if end is None:
            break
        if mid_step and step % 5 == 4:
            assert _order(engines[0], now) == _order(engines[1], now)
        for e in engines:
            e.complete()
        if any(r.program is not None for r in engines[0].done):
            assert _order(engines[0], end) == _order(engines[1], end)
        for e in engines:
            e.done = []
        now = end
    assert [r.token_times for r in queues[0]] == [r.token_times for r in queues[1]]
    assert all(r.finish_s is not None for r in queues[0])
    assert engines[0].decisions < engines[1].decisions


def _order(e: SimEngine, now: float) -> tuple[list[str], list[str], bool, frozenset[str]]:
    """Both queues' order as a reader sees them, and the held set admission will go by."""
    view = e.replica_view(now)
    return (
        [r.request_id for r in view.running],
        [r.request_id for r in view.waiting],
        e.hold_unlisted,
        e.listed,
    )


def test_with_every_sequence_slot_taken_the_waiting_queue_decides_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Requests wait while all max_num_seqs slots run: no order admits any of them this step, so the
    # decision is left out there too; arrivals during the step join the waiting queue after the
    # left-out decision's order, as they would after a decision taken.
    left_out_while_waiting = 0
    skippable = SimEngine._skippable

    def counting(self: SimEngine) -> bool:
        nonlocal left_out_while_waiting
        out = skippable(self)
        left_out_while_waiting += out and bool(self.waiting)
        return out

    monkeypatch.setattr(SimEngine, "_skippable", counting)
    jobs = build_workload(WorkloadSpec(duration_s=5.0, rps=30.0, mix=(1, 1, 1), seed=11))
    spec = ReplicaSpec(H100, EngineConfig(max_num_seqs=6))
    config = SimConfig(report_interval_s=0.02)
    skipping = FleetSim([spec] * 2, SlideBatching, "go-routing", seed=2, config=config).run(jobs)
    reference = FleetSim([spec] * 2, EveryStep, "go-routing", seed=2, config=config).run(jobs)
    assert outcomes(skipping) == outcomes(reference)
    assert left_out_while_waiting > 100


def test_the_replica_view_is_the_dataclass_a_router_would_build() -> None:
    """replica_view builds its ReplicaView through the slots twin: the same object ReplicaView(...)
    gives for the engine's state, with and without the queues, mid-run."""
    e = SimEngine("e", H100, SlideBatching(), ENGINES["kv-pressure"])
    now = 0.0
    checked = 0
    for step in range(40):
        for r in _requests() if step == 0 else ():
            e.accept(r, now)
        end = e.plan(now)
        if end is None:
            break
        for with_requests in (True, False):
            view = e.replica_view(now, with_requests=with_requests)
            expected = ReplicaView(
                replica_id="e",
                snapshot_s=now,
                waiting=tuple(request_views(e.waiting)) if with_requests else (),
                running=tuple(request_views(e.running)) if with_requests else (),
                kv_blocks_total=e.kv_blocks_total,
                kv_blocks_free=e.free_blocks,
                max_num_seqs=e.config.max_num_seqs,
                max_num_batched_tokens=e.config.max_num_batched_tokens,
                block_size=e.block_size,
                profile=H100,
                engine_policy="slide-batching",
                capabilities=e.capabilities,
                reported_outstanding_tokens=e.outstanding_tokens,
            )
            assert type(view) is ReplicaView
            assert view == expected and hash(view) == hash(expected)
            checked += 1
        e.complete()
        now = end
    assert checked >= 20
