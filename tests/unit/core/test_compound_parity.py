"""The sidecar and the simulator give the same compound sub-deadlines for the same programs.

A fleet run with the simulator's analyzer (core's CompoundTracker behind SimAnalyzer) serves a few
compound programs one after another, so later programs match the patterns of earlier ones. The very
same timeline (each call's arrival, tokens and finish, from the simulated run) is then replayed into
the sidecar's Tracker (its CompoundAnalyzer over the same core tracker): every call must get the
sub-deadline the simulator gave it, both where a stored pattern matched and where the fallback applied.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import STEP_10MS

from slo_core.gain import GainParams
from slo_core.policies.registry import make_engine_policy
from slo_core.predict import load_estimator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.sim.request import FINISHED, SimRequest
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_core.workloads.jobs import Job
from slo_sidecar.history import History
from slo_sidecar.tracker import LiveRequest, Tracker

FLOW = SLOTier("flow", RequestKind.COMPOUND, PriorityClass("p", 1.0), deadline_s=40.0)


def programs() -> list[Job]:
    """Programs of 3 stages (1–2 calls each), spaced so each finishes before the next arrives."""
    shapes = [
        (((30, 40), (20, 30)), ((50, 80),), ((10, 20), (10, 10))),
        (((30, 200),), ((40, 30), (40, 60)), ((20, 20),)),
        (((30, 45), (20, 25)), ((50, 70),), ((10, 25), (10, 10))),  # like the first: matches it
        (((30, 190),), ((40, 35), (40, 50)), ((20, 20),)),  # like the second
        (((25, 40), (20, 35)), ((50, 90),), ((10, 20), (10, 15))),
    ]
    return [
        Job(f"prog{i}", 10.0 * i, FLOW.targets(), stages=stages, max_tokens=256)
        for i, stages in enumerate(shapes)
    ]


def simulate() -> tuple[list[SimRequest], SimAnalyzer]:
    analyzer = SimAnalyzer(load_estimator())
    sim = FleetSim([ReplicaSpec(STEP_10MS)], "fcfs", analyzer=analyzer, config=SimConfig(drain="all"))
    result = sim.run(programs())
    calls = [r for r in result.requests if r.program is not None]
    assert all(r.state == FINISHED for r in calls)
    return calls, analyzer


def simulate_in_tier(share: tuple[float, ...] | None) -> tuple[list[SimRequest], dict[str, float | None]]:
    """The programs in tier ``flow`` with ``share`` as its stage shares: the calls, and the due time the
    simulator's router routed each one on."""
    tier = replace(FLOW, stage_deadline_share=share)
    analyzer = SimAnalyzer(load_estimator())
    sim = FleetSim(
        [ReplicaSpec(STEP_10MS)], "fcfs", analyzer=analyzer, config=SimConfig(drain="all"),
        tiers={"flow": tier},
    )  # fmt: skip
    routed: dict[str, float | None] = {}
    route = sim.pipeline.route

    def recording(view, *args, **kwargs):  # type: ignore[no-untyped-def]
        routed[view.request_id] = view.deadline_at_s
        return route(view, *args, **kwargs)

    sim.pipeline.route = recording  # type: ignore[method-assign]
    jobs = [replace(j, tier="flow") for j in programs()]
    calls = [r for r in sim.run(jobs).requests if r.program is not None]
    assert analyzer.matched_stages > 0 and analyzer.default_stages > 0  # both paths are exercised
    return calls, routed


def replay_in_sidecar(calls: list[SimRequest]) -> dict[str, float | None]:
    """Feed the simulated timeline to the sidecar's tracker; each call's sub-deadline there."""
    now = [0.0]
    tracker = Tracker(History(), clock=lambda: now[0])
    events: list[tuple[float, int, SimRequest]] = []
    for r in calls:
        assert r.finish_s is not None
        events += [(r.arrival_s, 1, r), (r.finish_s, 0, r)]  # at equal times a finish comes first
    live: dict[str, LiveRequest] = {}
    out: dict[str, float | None] = {}
    for t, kind, r in sorted(events, key=lambda e: (e[0], e[1], e[2].request_id)):
        now[0] = t
        if kind == 1:
            assert r.program is not None
            lv = tracker.new_request(
                tier=FLOW,
                targets=FLOW.targets(),
                prompt_text="",
                prompt_tokens=r.prompt_tokens,
                max_tokens=r.max_tokens,
                max_wait_s=30.0,
                bound=r.max_tokens,
                program_id=r.program.program_id,
                stage=r.stage,
                stated_stages=len(r.program.stages),
                request_id=r.request_id,
            )
            live[r.request_id] = lv
            out[r.request_id] = lv.deadline_at_s
        else:
            lv = live.pop(r.request_id)
            tracker.record_tokens(lv, r.generated, "", t)
            tracker.finish(lv, tracker.outcome(lv, True, "token", GainParams()), "ok")
    return out


def test_sidecar_and_simulator_give_the_same_stage_sub_deadlines() -> None:
    calls, analyzer = simulate()
    assert analyzer.matched_stages > 0 and analyzer.default_stages > 0  # both paths are exercised
    sidecar = replay_in_sidecar(calls)
    for r in calls:
        assert sidecar[r.request_id] == pytest.approx(r.deadline_at_s, abs=1e-9), r.request_id
    # the sub-deadlines are not all the equal-split fallback: some came from matched patterns
    equal_split = [
        r
        for r in calls
        if r.program is not None
        and r.deadline_at_s
        == pytest.approx(r.program.stage_deadline_at_s(r.stage or 0, r.arrival_s), abs=1e-9)
    ]
    assert len(equal_split) < len(calls)


@pytest.mark.parametrize("share", [None, (0.5, 0.3, 0.2)])
def test_the_router_routes_each_call_on_the_due_time_the_simulator_routes_it(
    share: tuple[float, ...] | None,
) -> None:
    # The router cannot know the analyzer's pattern-matched sub-deadline before it dispatches (the pod's
    # sidecar computes it for the engine), so both route a compound call on core's routing_deadline_at_s,
    # reckoned from the program's first call; the engine then gets the analyzer's sub-deadline.
    from slo_core.routing import ProgramClock
    from slo_core.wire.request_slo import SLORequest
    from slo_router.intake import request_view
    from slo_router.tenants import Tenant

    calls, routed = simulate_in_tier(share)
    programs_seen = ProgramClock()
    tenant = Tenant("t", ("flow",), "flow")
    narrowed = 0
    for r in sorted(calls, key=lambda c: (c.arrival_s, c.request_id)):
        assert r.program is not None
        slo = SLORequest(program_id=r.program.program_id, stage=r.stage, stages=len(r.program.stages))
        live = request_view(
            r.request_id, r.slo, r.arrival_s, body={"prompt": "x"}, tenant=tenant, slo=slo,
            programs=programs_seen, stage_share=share,
        )  # fmt: skip
        assert live.deadline_at_s == pytest.approx(routed[r.request_id], abs=1e-9), r.request_id
        narrowed += r.deadline_at_s != pytest.approx(routed[r.request_id], abs=1e-9)
    # the engine got the analyzer's sub-deadline, not the routing figure, where a pattern matched
    assert narrowed > 0


def test_the_program_clock_is_per_tenant_bounded_and_forgets_programs_long_past_their_deadline() -> None:
    from slo_core.routing import ProgramClock

    clock = ProgramClock(max_entries=2)
    assert clock.arrival_s("a", "p", 10.0, 30.0) == 10.0
    assert clock.arrival_s("a", "p", 25.0, 30.0) == 10.0  # a later call of the same program
    assert clock.arrival_s("b", "p", 26.0, 30.0) == 26.0  # another tenant's program of the same id
    assert clock.arrival_s("a", "q", 27.0, 30.0) == 27.0
    assert len(clock) == 2  # the least recently seen, ("a", "p"), dropped: seen again, it starts anew
    assert clock.arrival_s("a", "p", 28.0, 30.0) == 28.0
    assert clock.arrival_s("a", "q", 27.0 + 61.0, 30.0) == 88.0  # two deadlines later: a new program


@pytest.mark.parametrize("share", [None, (0.5, 0.3, 0.2)])
async def test_in_engine_mode_each_call_is_scheduled_by_the_sub_deadline_the_simulator_gives_it(
    share: tuple[float, ...] | None,
) -> None:
    # Engine mode end to end: the router's view and tags, the engine's report (the vLLM plugin's and
    # engine-sim's to_report), the pod sidecar's answer, and the due time the engine then schedules
    # the call by (engine-sim's runner: the answer's sub-deadline where it gives one, else the tags').
    # The pod sees neither the stated stage count nor the program's first call elsewhere in the fleet,
    # so where no pattern matched it must keep the router's figure, not fall back to the program's
    # whole deadline (what it did: live GMAX saw no stage split at all, the simulator's did).
    from slo_core.routing import ProgramClock
    from slo_core.wire.request_slo import SLORequest
    from slo_proto import slofleet_pb2 as pb
    from slo_router.enginetags import engine_tags
    from slo_router.intake import request_view
    from slo_router.tenants import Tenant
    from slo_sidecar.config import PolicyConfig, SidecarKnobs
    from slo_sidecar.estimators import FallbackEstimator
    from slo_sidecar.service import Sidecar
    from slo_vllm_plugin.report import EngineSnapshot, Finished, RequestRow, to_report

    tier = replace(FLOW, stage_deadline_share=share)
    calls, _ = simulate_in_tier(share)
    sidecar = Sidecar(
        knobs=SidecarKnobs(mode="engine", pod="p"),
        config=PolicyConfig(tiers={"flow": tier}, default_tier="flow"),
        engine_url="http://127.0.0.1:9",
        estimator=FallbackEstimator(),
    )
    programs_seen = ProgramClock()
    tenant = Tenant("t", ("flow",), "flow")
    events: list[tuple[float, int, SimRequest]] = []
    for r in calls:
        assert r.finish_s is not None
        events += [(r.arrival_s, 1, r), (r.finish_s, 0, r)]  # at equal times a finish comes first
    split = 0
    for t, kind, r in sorted(events, key=lambda e: (e[0], e[1], e[2].request_id)):
        assert r.program is not None
        if kind == 0:  # the engine's next report (a fraction of a second later in a live engine)
            done = Finished(r.request_id, r.generated, "stop", "flow", "met", r.prompt_tokens)
            await sidecar.mirror.take(to_report(EngineSnapshot(t, 0, 0, 0, 0.0, 8192, ()), [done]))
            continue
        slo = SLORequest(program_id=r.program.program_id, stage=r.stage, stages=len(r.program.stages))
        view = request_view(
            r.request_id, r.slo, t, body={"prompt": "x"}, tenant=tenant, slo=slo, programs=programs_seen,
            stage_share=share,
        )  # fmt: skip
        tags = replace(engine_tags(view, "flow", now_s=t, wall_now_s=t, stages=slo.stages), tier="flow")
        row = RequestRow(r.request_id, "waiting", r.prompt_tokens, 0, r.max_tokens, t, tags)
        report = to_report(EngineSnapshot(t, 0, 1, 0, 0.0, 8192, (row,)), [])
        answer = {key: due for key, _, due in await sidecar.mirror.take(report)}
        engine_due = answer[r.request_id] or tags.deadline_at_s
        assert engine_due == pytest.approx(r.deadline_at_s, abs=1e-9), r.request_id
        split += engine_due < r.program.deadline_at_s - 1e-9
    assert split > len(calls) // 2  # most calls are due before their program's end
    assert isinstance(pb.EngineRequest().HasField("stage"), bool)


async def test_a_pod_that_first_sees_a_later_stage_dates_the_program_from_its_first_call_in_the_fleet() -> (
    None
):
    # With several pods, a program's later stages may land on a pod that never saw its first call.
    # The simulator's ProgramState (one per fleet) begins at the first call; the router knows it (its
    # ProgramClock) and states it in the signed tags (engine mode) or headers (proxy mode). Before, each
    # pod dated the program from the first call it saw itself: a later deadline than the simulator's.
    from slo_core.routing import ProgramClock
    from slo_core.wire.headers import program_start_of, sign_headers, verify_headers
    from slo_core.wire.request_slo import SLORequest
    from slo_core.wire.tags import decode_tags
    from slo_lab.engine_sim.runner import EngineRunner, EngineSimSettings
    from slo_router.enginetags import engine_tags, program_start_unix_s
    from slo_router.intake import request_view, upstream_headers
    from slo_router.tenants import Tenant
    from slo_sidecar.config import PolicyConfig, SidecarKnobs
    from slo_sidecar.estimators import FallbackEstimator
    from slo_sidecar.service import Sidecar
    from slo_vllm_plugin.bridge import PolicyBridge
    from slo_vllm_plugin.report import EngineSnapshot, RequestRow, to_report

    calls, _ = simulate_in_tier(None)
    wall = 1.8e9  # unix seconds at the router's clock 0
    programs_seen = ProgramClock()
    tenant = Tenant("t", ("flow",), "flow")
    mirror = Sidecar(
        knobs=SidecarKnobs(mode="engine", pod="b"),
        config=PolicyConfig(tiers={"flow": FLOW}, default_tier="flow"),
        engine_url="http://127.0.0.1:9",
        estimator=FallbackEstimator(),
    ).mirror
    engine_sim = EngineRunner(EngineSimSettings())
    plugin = PolicyBridge(make_engine_policy("fcfs", {}))
    now = [0.0]
    proxy = Tracker(History(), clock=lambda: now[0], wall_offset_s=wall)
    checked = 0
    for r in sorted(calls, key=lambda c: (c.arrival_s, c.request_id)):
        assert r.program is not None
        t = r.arrival_s
        slo = SLORequest(program_id=r.program.program_id, stage=r.stage, stages=len(r.program.stages))
        view = request_view(
            r.request_id, r.slo, t, body={"prompt": "x"}, tenant=tenant, slo=slo, programs=programs_seen,
        )  # fmt: skip
        assert (view.program_arrival_s, view.program_deadline_at_s) == (
            r.program.arrival_s,
            r.program.deadline_at_s,
        )
        if r.stage == 0:
            continue  # pod b never sees a first stage: it is the router's word against its own clock
        tags = engine_tags(view, "flow", now_s=t, wall_now_s=t + wall, stages=slo.stages)
        tags = decode_tags(tags.to_xargs())  # as the engine reads them
        assert tags is not None
        pid, start, end = r.program.program_id, r.program.arrival_s + wall, r.program.deadline_at_s + wall
        # engine mode: the pod sidecar (from the engine's report), engine-sim and the vLLM plugin
        row = RequestRow(r.request_id, "waiting", r.prompt_tokens, 0, r.max_tokens, t + wall, tags)
        await mirror.take(to_report(EngineSnapshot(t + wall, 0, 1, 0, 0.0, 8192, (row,)), []))
        run = mirror.compound.programs[pid]
        assert (run.arrival_s, run.deadline_at_s) == pytest.approx((start, end), abs=1e-6)
        state = engine_sim._program(tags, tags.targets, t + wall)
        assert state is not None
        assert (state.arrival_s, state.deadline_at_s) == pytest.approx((start, end), abs=1e-6)
        seen = plugin.program(tags, t + wall)
        assert seen is not None
        assert (seen.arrival_s, seen.deadline_at_s) == pytest.approx((start, end), abs=1e-6)
        # proxy mode: the router's signed header, read by the pod sidecar's tracker
        headers = upstream_headers(
            slo, "flow", tenant, r.request_id, program_start_unix_s=program_start_unix_s(
                view, clock=lambda: t, wall_clock=lambda: t + wall  # noqa: B023
            ),
        )  # fmt: skip
        now[0] = t
        live = proxy.new_request(
            tier=FLOW, targets=FLOW.targets(), prompt_text="", prompt_tokens=r.prompt_tokens,
            max_tokens=r.max_tokens, max_wait_s=30.0, bound=r.max_tokens, program_id=pid, stage=r.stage,
            stated_stages=slo.stages, program_start_unix_s=program_start_of(headers), request_id=r.request_id,
        )  # fmt: skip
        assert (live.program_arrival_s, live.program_deadline_at_s) == pytest.approx(
            (r.program.arrival_s, r.program.deadline_at_s), abs=1e-6
        )
        checked += 1
    assert checked > 5
    # the start is signed with the rest: a caller cannot move its program's clock
    key = b"k" * 32
    signed = sign_headers({"x-slo-tier": "flow", "x-slofleet-program-start": "100.0"}, key, wall)
    assert verify_headers(signed, [key], wall) is None
    assert verify_headers({**signed, "x-slofleet-program-start": "1.0"}, [key], wall) is not None


@pytest.mark.parametrize("raw", ["", "nan", "inf", "-5", "0", "1e400", "12abc", "1" * 40])
def test_a_malformed_program_start_is_ignored(raw: str) -> None:
    from slo_core.wire.headers import program_start_of
    from slo_core.wire.tags import program_start_s

    assert program_start_of({"x-slofleet-program-start": raw}) is None
    assert program_start_s(50.0, None) == 50.0
    assert program_start_s(50.0, 60.0) == 50.0  # a start after the call itself: the call's time
    assert program_start_s(50.0, 40.0) == 40.0
