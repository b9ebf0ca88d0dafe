"""Autoscaling in the simulator: start-up delay, routing to ready replicas only, drain, GPU time."""

from __future__ import annotations

from slo_core.perf.profiles import load_profile
from slo_core.scaling import ScalingParams
from slo_core.sim.autoscale import Autoscaler, capacity_tokens_per_s, startup_time_s
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads.jobs import Job

PROFILE = load_profile("h100-llama3-8b-tp1")
SLO = SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1, priority_class="gold")


def burst(start_s: float, n: int, gap_s: float) -> list[Job]:
    return [
        Job(
            f"j{start_s}-{i}",
            start_s + i * gap_s,
            SLO,
            prompt_tokens=800,
            output_tokens=150,
            max_tokens=512,
            tier="gold",
        )
        for i in range(n)
    ]


def scaler(**kw: object) -> Autoscaler:
    params = ScalingParams(min_replicas=1, max_replicas=4, down_window_s=30.0, **kw)  # type: ignore[arg-type]
    return Autoscaler(
        params=params,
        startup_s=startup_time_s(PROFILE),
        capacity_tokens_per_s=capacity_tokens_per_s(PROFILE, tbt_s=0.1),
        tier_targets={"gold": 0.95},
        period_s=10.0,
    )


def test_startup_time_comes_from_the_profile_weights() -> None:
    small = startup_time_s(PROFILE)
    big = startup_time_s(load_profile("h100-llama2-70b-tp4"), "h100-llama2-70b-tp4")
    assert 45 < small < big  # 16 GB over one GPU vs 138 GB over four: weights dominate


def test_load_starts_replicas_that_serve_only_after_starting_up_then_drain_and_stop() -> None:
    a = scaler()
    fleet = FleetSim(
        [ReplicaSpec(PROFILE)] * 4, "sarathi", "min-load", config=SimConfig(drain="all"), autoscaler=a
    )
    jobs = burst(0.0, 3000, 0.02) + burst(100.0, 60, 5.0)  # 50 req/s for 60 s, then a trickle for 300 s
    result = fleet.run(jobs)
    started = next(e.t_s for e in a.timeline if e.starting > 0)
    first_ready = started + a.startup_s
    served_by = {
        r.replica for r in result.requests if r.first_scheduled_s is not None and r.arrival_s < first_ready
    }
    assert served_by == {0}  # nothing lands on a replica still loading its weights
    assert max(e.ready for e in a.timeline) > 1
    assert a.timeline[-1].ready + a.timeline[-1].starting < max(
        e.ready for e in a.timeline
    )  # scaled back down
    peak = max(e.ready + e.starting + e.draining for e in a.timeline)
    span_h = max(result.end_s, result.duration_s) / 3600
    assert span_h < a.gpu_hours(max(result.end_s, result.duration_s)) < peak * span_h


def test_a_replica_holding_a_program_is_never_drained() -> None:
    from slo_core.sim.request import ProgramState, SimRequest

    a = scaler()
    a.initial = 2
    fleet = FleetSim([ReplicaSpec(PROFILE)] * 4, "sarathi", "min-load", autoscaler=a)
    a.attach(fleet)
    prog = ProgramState("p", 0.0, SLOTargets(RequestKind.COMPOUND, deadline_s=600.0), (((10, 5),),))
    call = SimRequest("p/s0/c0", 0.0, prog.slo, 10, output_tokens=5, max_tokens=5, program=prog)
    plain = SimRequest("r", 0.0, SLO, 100, output_tokens=50, max_tokens=50)
    assert fleet.engines[0].accept(call, 0.0) and fleet.engines[1].accept(plain, 0.0)
    # replica 0 is the less loaded, the one to drain were it not holding a program's call
    a._drain_one(fleet, 1.0)
    assert [r.state for r in a._replicas[:2]] == ["ready", "draining"]
    a._drain_one(fleet, 2.0)
    assert a._replicas[0].state == "ready"  # nothing else may go


def test_replicas_keep_the_counters_their_sidecars_export() -> None:
    """Prompt tokens when admitted, output tokens and one SLO outcome per tier when a request ends; the
    router's refusals (a prompt longer than any context) reach no replica's counters."""
    a = Autoscaler(
        params=ScalingParams(min_replicas=2, max_replicas=2),
        startup_s=60.0,
        capacity_tokens_per_s=1e6,
        tier_targets={"gold": 0.95},
        period_s=5.0,
    )
    fleet = FleetSim(
        [ReplicaSpec(PROFILE)] * 2, "sarathi", "round-robin", config=SimConfig(drain="all"), autoscaler=a
    )
    jobs = burst(0.0, 40, 0.5)
    jobs.append(Job("huge", 1.0, SLO, prompt_tokens=10**7, output_tokens=5, max_tokens=5, tier="gold"))
    result = fleet.run(jobs)
    assert result.rejected_by_router == 1
    assert a.timeline[0].reason == "measuring" and a.timeline[0].step is None
    last = a.timeline[-1].samples
    assert sorted(last) == ["replica-0", "replica-1"]
    served = [r for r in result.requests if r.replica >= 0]
    assert len(served) == 40
    assert sum(c.prompt_tokens for c in last.values()) == 40 * 800
    assert sum(c.output_tokens for c in last.values()) == sum(r.generated for r in served) == 40 * 150
    outcomes = sum(c.met.get("gold", 0) + c.missed.get("gold", 0) for c in last.values())
    assert outcomes == 40 and all(c.outstanding_tokens == c.waiting == 0 for c in last.values())
    demand = [e.step.signals.demand_tokens_per_s for e in a.timeline if e.step is not None]
    assert max(demand) > 0


def test_a_program_call_is_judged_against_its_programs_deadline_as_the_sidecar_judges_it() -> None:
    """The replicas' met/missed counters follow the sidecar's rule (``Tracker.outcome``: a compound
    call's delivery measured from its program's arrival against the program's deadline), not the
    stage sub-deadline the scheduler plans with."""
    from slo_core.sim.autoscale import _met
    from slo_core.sim.request import ProgramState, SimRequest

    slo = SLOTargets(RequestKind.COMPOUND, deadline_s=10.0, priority_class="gold")
    program = ProgramState("p", 0.0, slo, (((10, 5),), ((10, 5),)))
    call = SimRequest(
        "p/s1/c0", 4.0, slo, 10, output_tokens=5, max_tokens=5, deadline_at_s=6.0, program=program, stage=1
    )
    call.token_times = [6.5, 7.0, 7.5, 8.0, 8.5]  # after the stage's 6 s, before the program's 10 s
    call.finish_s = 8.5
    assert _met(call)
    call.token_times[-1] = call.finish_s = 10.5  # past the program's deadline
    assert not _met(call)
