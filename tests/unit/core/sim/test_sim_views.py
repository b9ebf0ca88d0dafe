"""The simulator's request snapshots equal the RequestView its dataclass constructor builds.

views.py builds views through base.slots_twin (faster than the frozen dataclass's __init__); a view
of every shape of request (plain and a program's call, waiting and running, before and after its first
token, with and without a bound) must equal, hash and read like the constructor's, and stay frozen.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.perf import load_profile
from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.baselines import EDF
from slo_core.predict import OutputBoundEstimator, load_estimator
from slo_core.sim import engine as engine_module
from slo_core.sim import engine_snapshots as snapshots_module
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.sim.request import RUNNING, WAITING, ProgramState, SimRequest
from slo_core.sim.views import new_engine_view, request_view, request_views
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads import WorkloadSpec, build_workload

SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.DEADLINE, deadline_s=8.0),
    SLOTargets(RequestKind.COMPOUND, deadline_s=30.0),
)


@pytest.fixture(scope="module")
def estimator() -> OutputBoundEstimator:
    return load_estimator()


CONTEXT = 5000  # short enough that some calls' max_tokens is capped at arrival


def expected(r: SimRequest) -> RequestView:
    program = r.program
    return RequestView(
        r.request_id,
        r.slo,
        r.arrival_s,
        r.prompt_tokens,
        r.max_tokens,
        r.generated,
        r.computed,
        r.deadline_at_s,
        r.token_times[0] if r.token_times else None,
        r.output_bound,
        r.target_tokens,
        r.tenant,
        program.program_id if program is not None else None,
        r.stage,
        program.arrival_s if program is not None else None,
        program.deadline_at_s if program is not None else None,
        program.attained_tokens() if program is not None else r.attained_tokens(),
        r.preemptions,
        r.waiting_since_s if r.state == WAITING else None,
    )


@settings(max_examples=200, deadline=None)
@given(
    slo=st.sampled_from(SLOS),
    prompt=st.integers(1, 4000),
    generated=st.integers(0, 300),
    running=st.booleans(),
    bound=st.one_of(st.none(), st.integers(1, 2000)),
    in_program=st.booleans(),
    preemptions=st.integers(0, 3),
    tenant=st.sampled_from(["default", "t1"]),
)
def test_a_view_equals_the_dataclass_constructors(
    slo: SLOTargets,
    prompt: int,
    generated: int,
    running: bool,
    bound: int | None,
    in_program: bool,
    preemptions: int,
    tenant: str,
) -> None:
    program = None
    if in_program:
        program = ProgramState("p1", 0.5, SLOS[2], (((prompt, 50),),), tenant=tenant)
    r = SimRequest(
        "r1",
        1.25,
        slo,
        prompt,
        output_tokens=400,
        max_tokens=1024,
        deadline_at_s=None if slo.kind is RequestKind.LATENCY else 9.0,
        output_bound=bound,
        tenant=tenant,
        program=program,
        stage=0 if in_program else None,
    )
    if program is not None:
        program.calls.append(r)
    r.state = RUNNING if running else WAITING
    r.computed = prompt + generated - (1 if generated else 0)
    r.generated = generated
    r.token_times = [2.0 + 0.05 * i for i in range(generated)]
    r.preemptions = preemptions
    view = request_view(r)
    want = expected(r)
    assert view == want
    assert hash(view) == hash(want)
    assert [getattr(view, f.name) for f in dataclasses.fields(RequestView)] == [
        getattr(want, f.name) for f in dataclasses.fields(RequestView)
    ]
    assert request_views([r]) == [want]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.generated_tokens = 0  # type: ignore[misc]


def test_an_engine_view_equals_the_dataclass_constructors() -> None:
    kw = {
        "now_s": 3.5,
        "step": 17,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
        "kv_blocks_total": 1000,
        "kv_blocks_free": 250,
        "block_size": 16,
        "profile": None,
        "engine_id": "replica-2",
    }
    view = new_engine_view(**kw)  # type: ignore[arg-type]
    want = EngineView(**kw)  # type: ignore[arg-type]
    assert view == want
    assert hash(view) == hash(want)
    assert [getattr(view, f.name) for f in dataclasses.fields(EngineView)] == list(kw.values())
    assert view.kv_tokens_free == 250 * 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.step = 0  # type: ignore[misc]


class DecidingEDF(EDF):
    """EDF asked at every decision (the engine would otherwise keep its order without views)."""

    keyed_admission = False


@pytest.mark.parametrize(("policy", "dags"), [("gmax", "tot"), (DecidingEDF, "deep-research")])
def test_a_programs_counted_service_always_equals_a_recount(
    monkeypatch: pytest.MonkeyPatch, policy: str | type[EDF], dags: str
) -> None:
    """The engine keeps a program's attained service up to date as its calls decode (one token each)
    instead of recounting it every step; every view read must see what a recount gives."""
    checked = [0]

    def recounting(reqs: list[SimRequest]) -> list[RequestView]:
        for r in reqs:
            p = r.program
            if p is not None and p.attained_cache >= 0:
                kept = p.attained_cache
                p.attained_cache = -1
                assert kept == p.attained_tokens(), r  # what a recount gives
                checked[0] += 1
        return request_views(reqs)

    monkeypatch.setattr(engine_module, "request_views", recounting)
    jobs = build_workload(WorkloadSpec(duration_s=8.0, rps=10.0, mix=(1, 1, 1), dags=dags, seed=4))
    spec = ReplicaSpec(load_profile("h100-llama3-8b-tp1"))
    FleetSim([spec], policy, "round-robin", seed=1).run(jobs)
    assert checked[0] > 1000


def test_a_programs_service_stays_with_it_when_a_call_of_the_running_stage_ends() -> None:
    """A call that finishes before its stage's other calls keeps its service in its program's attained
    tokens, as the vLLM plugin and engine-sim count it (their done_tokens grows at the call's end):
    with no preemption a program's attained service, as every view shows it, never goes down. Before,
    the simulator dropped a finished call's tokens until its whole stage ended."""
    jobs = build_workload(WorkloadSpec(duration_s=20.0, rps=3.0, mix=(0, 0, 1), dags="tot", seed=2))
    seen: dict[str, int] = {}
    dips = 0
    parallel_finishes = 0

    def watching(reqs: list[SimRequest]) -> list[RequestView]:
        nonlocal dips, parallel_finishes
        views = request_views(reqs)
        for r, v in zip(reqs, views, strict=True):
            p = r.program
            if p is None:
                continue
            dips += v.program_attained_tokens < seen.get(p.program_id, 0)
            seen[p.program_id] = v.program_attained_tokens
            parallel_finishes += any(
                c.state != WAITING and c.state != RUNNING for c in p.calls[p.live_from :]
            )
        return views

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_module, "request_views", watching)
        spec = ReplicaSpec(load_profile("h100-llama3-8b-tp1"), EngineConfig(kv_cache_tokens=4_000_000))
        result = FleetSim([spec], DecidingEDF, "round-robin", seed=1).run(jobs)
    assert sum(r.preemptions for r in result.requests) == 0
    assert parallel_finishes > 100  # the case arose: a sibling had left while this call was viewed
    assert dips == 0


@pytest.mark.parametrize(
    ("policy", "dags", "router"),
    [
        ("gmax", "tot", "go-routing"),
        ("slide-batching", "deep-research", "round-robin"),
        ("autellix", "tot", "go-routing"),
    ],
)
def test_every_view_a_policy_or_router_reads_shows_the_requests_current_counts_and_state(
    monkeypatch: pytest.MonkeyPatch, estimator: OutputBoundEstimator, policy: str, dags: str, router: str
) -> None:
    """The engine marks a request's view stale wherever it changes the request's counts or state
    (views.py reuses a view without reading them): under KV pressure (preemptions), compound programs
    and arrivals, every view handed to a policy, or to a router mid-step, carries what the request
    holds at that moment."""
    checked = [0]
    preempted = [0]
    capped = [0]

    def checking(reqs: list[SimRequest]) -> list[RequestView]:
        views = request_views(reqs)
        for r, v in zip(reqs, views, strict=True):
            assert v == expected(r)  # every field: counts, state, caps, targets, program service
            checked[0] += 1
            preempted[0] += r.preemptions > 0
            capped[0] += r.prompt_tokens + r.max_tokens == CONTEXT
        return views

    monkeypatch.setattr(engine_module, "request_views", checking)
    monkeypatch.setattr(snapshots_module, "request_views", checking)
    jobs = build_workload(WorkloadSpec(duration_s=8.0, rps=16.0, mix=(1, 1, 1), dags=dags, seed=5))
    spec = ReplicaSpec(
        load_profile("h100-llama3-8b-tp1"),
        EngineConfig(kv_cache_tokens=40_000, max_num_seqs=48, max_model_len=CONTEXT),
    )
    # with the analyzer's bounds the router passes calls whose max_tokens the engine then caps
    FleetSim([spec, spec], policy, router, seed=2, analyzer=SimAnalyzer(estimator)).run(jobs)
    assert checked[0] > 5000
    assert preempted[0] > 0  # the preemption path was exercised
    assert capped[0] > 0  # so was the context's cap on max_tokens at arrival
