"""Fleet runs: compound stage ordering, routing, drain, determinism, and the run metrics."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from builders import SMALL_GPU, STEP_10MS

from slo_core.gain import Delivery, GainParams, ideal_gain
from slo_core.metrics import summarize
from slo_core.metrics.summary import instant_gain
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.sim.request import FINISHED
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads import WorkloadSpec, build_workload
from slo_core.workloads.jobs import Job, read_jobs_jsonl, write_jobs_jsonl

LAT = SLOTargets(RequestKind.LATENCY, ttft_s=0.05, tbt_s=0.01)
DEAD = SLOTargets(RequestKind.DEADLINE, deadline_s=0.025)


def fleet(n: int = 2, policy: str = "fcfs", router: str = "round-robin", **cfg: float) -> FleetSim:
    return FleetSim([ReplicaSpec(STEP_10MS, EngineConfig())] * n, policy, router, config=SimConfig(**cfg))


def test_a_stage_is_released_only_when_every_call_of_the_previous_stage_finished() -> None:
    stages = (((8, 3), (8, 5)), ((8, 2), (8, 1)), ((8, 1),))
    job = Job("p", 0.0, SLOTargets(RequestKind.COMPOUND, deadline_s=60.0), stages=stages)
    res = fleet(2, drain="all", tool_latency_s=0.1).run([job])
    (prog,) = res.programs
    by_stage: dict[int, list] = {}
    for c in prog.calls:
        by_stage.setdefault(c.stage or 0, []).append(c)
    assert [len(by_stage[s]) for s in range(3)] == [2, 2, 1]
    for s in (1, 2):
        prev_done = max(c.finish_s or 0.0 for c in by_stage[s - 1])
        assert [c.arrival_s for c in by_stage[s]] == [pytest.approx(prev_done + 0.1)] * len(by_stage[s])
        assert all(c.first_scheduled_s >= prev_done + 0.1 for c in by_stage[s])  # type: ignore[operator]
    # stage 0: the 5-token call on its own replica finishes at 50 ms; stage 1 at 150 ms + 20 ms ...
    assert prog.finish_s == pytest.approx(0.05 + 0.1 + 0.02 + 0.1 + 0.01)
    assert all(c.state == FINISHED for c in prog.calls)


def test_round_robin_spreads_requests_and_min_load_avoids_the_busy_replica() -> None:
    jobs = [
        Job(f"r{i}", 0.0, LAT, prompt_tokens=4, output_tokens=n, output_bound=n)
        for i, n in enumerate((20, 1, 1, 1))
    ]
    res = fleet(2, drain="all").run(jobs)
    assert [r.replica for r in res.requests] == [0, 1, 0, 1]
    res = fleet(2, router="min-load", drain="all").run(jobs)
    assert [r.replica for r in res.requests][:2] == [0, 1] and res.requests[2].replica == 1


def test_metrics_of_a_hand_checked_run() -> None:
    # one replica, 10 ms steps: a latency request (TTFT 50 ms, TBT 10 ms) is served on time; a
    # deadline request (25 ms) sharing the steps finishes at 30 ms and misses
    jobs = [
        Job("lat", 0.0, LAT, prompt_tokens=4, output_tokens=3),
        Job("dl", 0.0, DEAD, prompt_tokens=4, output_tokens=3),
    ]
    res = fleet(1, drain="all").run(jobs)
    m = summarize(res, bucket_s=0.02)
    assert m["jobs"] == 2 and m["completed"] == 2
    assert m["attainment"] == pytest.approx(0.5)
    assert m["goodput_token"] == pytest.approx(3.0)  # three on-time tokens; the deadline request earns 0
    assert m["goodput_token_ratio"] == pytest.approx(3.0 / (3 + 7))
    assert m["by_kind"]["latency"]["attainment"] == 1.0 and m["by_kind"]["deadline"]["attainment"] == 0.0
    assert m["ttft_p50_s"] == pytest.approx(0.01) and m["e2e_p99_s"] == pytest.approx(0.03)
    assert m["tbt_p50_s"] == pytest.approx(0.01)
    assert m["goodput_over_time"]["token"] == [1.0, 2.0]  # tokens at 10 ms | 20 and 30 ms
    assert set(m["by_tier"]) == {""} and set(m["by_priority"]) == {"default"}


def test_slo_drain_stops_once_no_gain_is_possible() -> None:
    jobs = [Job(f"r{i}", 0.0, DEAD, prompt_tokens=4, output_tokens=50) for i in range(3)]
    res = fleet(1, drain="slo").run(jobs)
    assert res.end_s <= 0.025 + 1e-6
    assert all(r.state != FINISHED for r in res.requests)


def test_the_same_workload_and_seed_give_the_same_run_with_any_policy_twice() -> None:
    spec = WorkloadSpec(rps=4.0, duration_s=20.0, seed=3)
    for policy in ("fcfs", "sarathi", "edf"):
        a = summarize(fleet(2, policy).run(build_workload(spec)))
        b = summarize(fleet(2, policy).run(build_workload(spec)))
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b


def test_jobs_round_trip_through_jsonl(tmp_path: Path) -> None:
    jobs = build_workload(WorkloadSpec(rps=2.0, duration_s=10.0, seed=1, best_effort_share=0.2, dags="tot"))
    path = tmp_path / "jobs.jsonl"
    assert write_jobs_jsonl(jobs, path) == len(jobs)
    back = list(read_jobs_jsonl(path))
    assert [replace(j, arrival_s=round(j.arrival_s, 6)) for j in jobs] == back


@pytest.mark.parametrize("name", ["token", "request", "tempo", "tdg"])
@pytest.mark.parametrize(
    "slo",
    [
        LAT,
        DEAD,
        SLOTargets(RequestKind.COMPOUND, deadline_s=3.0, priority_weight=2.0),
        SLOTargets(RequestKind.BEST_EFFORT, priority_weight=0.5),
    ],
)
@pytest.mark.parametrize("n", [0, 1, 7])
def test_the_closed_form_ideal_gain_equals_the_gain_of_instant_service(
    name: str, slo: SLOTargets, n: int
) -> None:
    d = Delivery(slo, 5.0, 11, (), True)
    assert instant_gain(name, slo, 11, n, GainParams()) == pytest.approx(
        ideal_gain(d, name, GainParams(), output_tokens=n)
    )


def test_a_request_demoted_to_best_effort_is_judged_against_the_slo_it_asked_for() -> None:
    # No replica can give a 1 ms first token to a 500-token prompt: GoRouting finds no gain, the
    # admission rule demotes the request to best effort, and it is served there. Its client asked for
    # TTFT 1 ms and counts it missed; the simulator's outcome must say the same, not judge it against
    # the best-effort targets it ran on.
    from slo_core.metrics.summary import job_outcomes
    from slo_core.runtime_policy import AdmissionRule
    from slo_core.slo import PriorityClass, SLOTier

    spare = SLOTier("spare", RequestKind.BEST_EFFORT, PriorityClass("spare", 0.1))
    demote = AdmissionRule("best-effort", best_effort_tier="spare", best_effort=spare)
    sim = FleetSim(
        [ReplicaSpec(SMALL_GPU, EngineConfig())], "fcfs", "go-routing",
        config=SimConfig(drain="all"), admission=demote,
    )  # fmt: skip
    asked = SLOTargets(RequestKind.LATENCY, ttft_s=0.001, tbt_s=0.01)
    res = sim.run([Job("r", 0.0, asked, prompt_tokens=500, output_tokens=3, tier="chat")])
    assert res.demoted_by_router == 1 and res.requests[0].state == FINISHED
    assert res.demoted_by_tier == {"chat": 1}  # counted under the tier it asked for, as the router counts
    assert res.demoted_ids == ["r"]  # which one, so a live run's demotions can be matched to it
    assert res.requests[0].slo.kind is RequestKind.BEST_EFFORT  # it ran on best effort ...
    (out,) = job_outcomes(res)
    assert out.tier == "chat" and out.kind == "latency"  # ... but is reported as what it asked for
    assert out.delivery.slo == asked
    assert out.gains["request"] == 0, "its first token came after the 1 ms it asked for"


def test_with_a_report_interval_the_router_sees_the_last_report_plus_what_it_sent_since() -> None:
    # A live router holds each pod's last reported state and adds the requests it sent there since;
    # the simulator does the same with report_interval_s (0: the exact engine state at every arrival).
    import random as _random
    from collections.abc import Sequence

    from slo_core.policies.base import BaseRouterPolicy, ReplicaView, RequestView, RouteDecision

    class Recording(BaseRouterPolicy):
        name = "recording"

        def __init__(self) -> None:
            self.seen: list[tuple[float, ReplicaView]] = []

        def route(
            self, request: RequestView, replicas: Sequence[ReplicaView], now_s: float, rng: _random.Random
        ) -> RouteDecision:
            self.seen.append((now_s, replicas[0]))
            return RouteDecision(replicas[0].replica_id)

    jobs = [Job(f"r{i}", 0.1 * i, LAT, prompt_tokens=4, output_tokens=50) for i in range(4)]
    exact, stale = Recording(), Recording()
    for router, interval in ((exact, 0.0), (stale, 0.25)):
        FleetSim(
            [ReplicaSpec(STEP_10MS, EngineConfig())], "fcfs", router,
            config=SimConfig(drain="all", report_interval_s=interval),
        ).run(jobs)  # fmt: skip
    # exact: at 0.1 s request r0 is running, 10 tokens out
    t, view = exact.seen[1]
    assert view.snapshot_s == t == pytest.approx(0.1)
    assert [r.request_id for r in view.running] == ["r0"] and not view.waiting
    # stale: the report of 0.0 (empty engine) plus r0 as sent, until a new report at 0.3 s
    snapshots = [(t, v.snapshot_s, [r.request_id for r in v.waiting]) for t, v in stale.seen]
    assert snapshots[:3] == [
        (0.0, 0.0, []), (pytest.approx(0.1), 0.0, ["r0"]), (pytest.approx(0.2), 0.0, ["r0", "r1"])
    ]  # fmt: skip
    t3, v3 = stale.seen[3]
    assert v3.snapshot_s == t3 == pytest.approx(0.3) and {r.request_id for r in v3.running} == {
        "r0",
        "r1",
        "r2",
    }
