"""The request analyzer inside the simulator: bounds refined as tokens stream, learned stage sub-deadlines."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from builders import STEP_10MS

from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView
from slo_core.predict import load_estimator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.sim.request import FINISHED
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads.jobs import Job


@pytest.fixture(scope="module")
def estimator():  # type: ignore[no-untyped-def]
    return load_estimator()


class Recorder(BaseEnginePolicy):
    """FCFS that records (request, generated tokens, bound, deadline) from every snapshot it gets."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int | None, float | None]] = []

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        for r in (*waiting, *running):
            self.seen.append((r.request_id, r.generated_tokens, r.output_bound, r.deadline_at_s))
        return Decision(admit=tuple(r.request_id for r in waiting))


def run(jobs: list[Job], analyzer: SimAnalyzer | None, policy: str = "fcfs") -> tuple[FleetSim, Recorder]:
    recorder = Recorder()
    sim = FleetSim(
        [ReplicaSpec(STEP_10MS)],
        (lambda: recorder) if policy == "recorder" else policy,
        analyzer=analyzer,
    )
    sim.last = sim.run(jobs)  # type: ignore[attr-defined]
    return sim, recorder


def test_bounds_start_at_the_qrf_bound_and_are_refined_upward_as_tokens_stream(estimator) -> None:  # type: ignore[no-untyped-def]
    analyzer = SimAnalyzer(estimator)
    job = Job("long", 0.0, SLOTargets(RequestKind.DEADLINE, deadline_s=600.0), 200, 900, max_tokens=2048)
    _, recorder = run([job], analyzer, policy="recorder")
    seen = [(g, b) for rid, g, b, _ in recorder.seen if rid == "long"]
    schedule = analyzer.schedule(200, "deadline", 2048)
    assert seen[0] == (0, schedule.at(0))
    assert all(b is not None and b >= g + 1 for g, b in seen), "a bound is never below what was generated"
    bounds = [b for _, b in seen]
    assert bounds == sorted(bounds), "refinement only relaxes the bound (conditioned on 'longer than g')"
    assert len(set(bounds)) > 1, "900 tokens cross several 50-token checkpoints"


def test_without_the_analyzer_bounds_are_unknown(estimator) -> None:  # type: ignore[no-untyped-def]
    job = Job("r", 0.0, SLOTargets(RequestKind.DEADLINE, deadline_s=60.0), 100, 40, max_tokens=512)
    _, recorder = run([job], None, policy="recorder")
    assert {b for _, _, b, _ in recorder.seen} == {None}


def test_fcfs_round_robin_is_unchanged_by_the_analyzer(estimator) -> None:  # type: ignore[no-untyped-def]
    slo = SLOTargets(RequestKind.DEADLINE, deadline_s=30.0)
    jobs = [Job(f"j{i}", i * 0.05, slo, 100 + 10 * i, 20 + 7 * i, max_tokens=1024) for i in range(30)]
    with_a, _ = run(jobs, SimAnalyzer(estimator))
    without, _ = run(jobs, None)
    times_a = {r.request_id: r.token_times for r in with_a.last.requests}  # type: ignore[attr-defined]
    times_b = {r.request_id: r.token_times for r in without.last.requests}  # type: ignore[attr-defined]
    assert times_a == times_b


def test_stage_sub_deadlines_follow_the_learned_shape_of_past_programs(estimator) -> None:  # type: ignore[no-untyped-def]
    # every program: a short planning call, then a long synthesis call; 40 s for the whole program
    slo = SLOTargets(RequestKind.COMPOUND, deadline_s=40.0)
    stages = (((300, 20),), ((300, 600),))
    jobs = [Job(f"p{i}", i * 20.0, slo, stages=stages, max_tokens=1024) for i in range(8)]
    analyzer = SimAnalyzer(estimator)
    sim, recorder = run(jobs, analyzer, policy="recorder")
    assert all(p.finish_s is not None for p in sim.last.programs)  # type: ignore[attr-defined]
    first_stage = {rid: dl for rid, _, _, dl in recorder.seen if rid.endswith("/s0/c0")}
    equal_split = 0.0 + 40.0 / 2
    assert first_stage["p0/s0/c0"] == pytest.approx(equal_split), "no history yet: equal split"
    late = first_stage["p7/s0/c0"] - 7 * 20.0
    assert late < equal_split / 2, "learned: the first stage takes a small share of the program's time"
    assert analyzer.matched_stages > 0
    for p in sim.last.programs:  # type: ignore[attr-defined]
        for c in p.calls:
            assert c.deadline_at_s <= p.deadline_at_s + 1e-9
            assert c.state == FINISHED
