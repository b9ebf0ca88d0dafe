"""``slofleet demo``'s simulated side: the demo policy, outcomes per job in the jobs' order, and the
per-job comparison that traces a live-vs-simulated gap to the requests behind it."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import yaml

from slo_core.crd.loads import parse_policy
from slo_core.workloads import WorkloadSpec, build_workload, parse_mix
from slo_core.workloads.jobs import Job
from slo_lab.localfleet.demo import _capped, demo_policy
from slo_lab.localfleet.launcher import LocalFleet
from slo_lab.localfleet.report import describe_differences, job_differences
from slo_lab.localfleet.simulate import engine_profile, simulate
from slo_lab.localfleet.spec import DEFAULT_PROFILE, EngineGroup, FleetSpec


def _jobs(duration_s: float = 10.0) -> list[Job]:
    spec = WorkloadSpec(
        trace="azure-conv-2023", rps=6.0, duration_s=duration_s, mix=parse_mix("1:1:1"), slo_scale=2.0,
        max_tokens=256, seed=0,
    )  # fmt: skip
    return [_capped(j, 256, 3000) for j in build_workload(spec) if j.total_output_tokens > 0]


def _engine_answer(
    stream: bool, n: int, finish: str = "length", headers: dict[str, str] | None = None
) -> httpx.Response:
    """An OpenAI answer of ``n`` one-token pieces ending with ``finish``: server-sent chunks (the last one
    with usage) when ``stream``, else a completion."""
    usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
    if stream:
        head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}

        def chunk(content: str, reason: str | None) -> dict[str, object]:
            return {**head, "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": reason}]}

        chunks = [
            *(chunk("x", None) for _ in range(n)),
            chunk("", finish),
            {**head, "choices": [], "usage": usage},
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(
            200, text=text, headers={"content-type": "text/event-stream", **(headers or {})}
        )
    return httpx.Response(200, headers=headers, json={
        "id": "c", "object": "text_completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "text": "x" * n, "finish_reason": finish}], "usage": usage,
    })  # fmt: skip


def test_the_demo_policy_serves_what_it_cannot_serve_in_time_best_effort() -> None:
    # refusing a deep-research call fails its whole program: the demo demotes instead of refusing
    runtime = parse_policy(demo_policy(2.0, "gmax", "go-routing"), "demo").spec.runtime()
    assert runtime.admission.demotes and runtime.admission.best_effort_tier == "best-effort"
    assert runtime.routing.name == "go-routing" and runtime.scheduling.name == "gmax"


def test_simulated_outcomes_come_back_in_the_jobs_order() -> None:
    jobs = _jobs()
    assert {j.slo.kind.value for j in jobs} == {"latency", "deadline", "compound"}
    outs = simulate(
        jobs, demo_policy(2.0, "gmax", "go-routing"), profile=DEFAULT_PROFILE, speedup=0.5, engines=1, seed=0
    )
    assert [(o.tier, o.kind, o.delivery.arrival_s) for o in outs] == [
        (j.tier, j.slo.kind.value, j.arrival_s) for j in jobs
    ]


def test_job_differences_name_the_jobs_on_each_side() -> None:
    jobs = _jobs(4.0)[:3]
    policy = demo_policy(2.0, "fcfs", "round-robin")
    outs = simulate(jobs, policy, profile=DEFAULT_PROFILE, speedup=0.5, engines=1, seed=0)
    ids, tiers = [j.job_id for j in jobs], [j.tier for j in jobs]
    assert all(not row[k] for row in job_differences(ids, outs, outs, tiers).values() for k in row)
    missed = [*outs]
    first = missed[0]
    missed[0] = replace(first, gains={**first.gains, "request": 0.0}, rejected=True)
    assert first.gains["request"] > 0, "an idle engine serves the first job in time"
    diff = job_differences(ids, missed, outs, tiers)
    assert diff[tiers[0]]["met_sim_only"] == [ids[0]] and diff[tiers[0]]["rejected_live_only"] == [ids[0]]
    assert diff[tiers[0]]["met_sim_only_sent_late"] == []
    late = job_differences(ids, missed, outs, tiers, late=[True, False, False])
    assert late[tiers[0]]["met_sim_only_sent_late"] == [ids[0]]
    met_live_only = job_differences(ids, outs, missed, tiers, late=[True] * 3)[tiers[0]]
    assert met_live_only["met_sim_only_sent_late"] == [] and met_live_only["met_live_only"] == [ids[0]]
    line = describe_differences("slofleet", diff)
    assert line.startswith(f"slofleet {tiers[0]}: met sim only 1 ({ids[0]})")


async def test_the_simulator_gets_the_max_tokens_the_replay_sends() -> None:
    # The replay imposes each call's length with max_tokens; schedulers cap their bounds with it. The
    # simulated requests must carry the same max_tokens as the HTTP bodies the replay sends.
    import json
    import time

    import httpx
    import openai

    from slo_core.perf import load_profile
    from slo_core.sim.engine_types import EngineConfig
    from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
    from slo_lab.localfleet.replay import Replayer, as_sent

    jobs = [next(j for j in _jobs() if j.slo.kind.value == k) for k in ("latency", "deadline", "compound")]
    sent: dict[str, list[int]] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        job = (
            request.headers.get("x-slo-program-id") or body["prompt" if "prompt" in body else "messages"][:0]
        )
        sent.setdefault(job or request.headers["x-test-job"], []).append(body["max_tokens"])
        return _engine_answer(bool(body.get("stream")), body["max_tokens"])

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    client = openai.AsyncOpenAI(base_url="http://fleet/v1", api_key="k", http_client=http, max_retries=0)
    replayer = Replayer(client, "m", time.monotonic)
    for job in jobs:
        replayer.client = client.with_options(default_headers={"x-test-job": job.job_id})
        record = await replayer.run_job(replace(job, arrival_s=0.0), time.monotonic())
        assert record.completed, record.calls
    await http.aclose()

    sim = FleetSim(
        [ReplicaSpec(load_profile(DEFAULT_PROFILE), EngineConfig())], "fcfs", config=SimConfig(drain="all")
    )
    result = sim.run([as_sent(j) for j in jobs])
    simulated: dict[str, list[int]] = {}
    for r in result.requests:
        simulated.setdefault(r.program.program_id if r.program else r.request_id, []).append(r.max_tokens)
    assert {k: sorted(v) for k, v in simulated.items()} == {k: sorted(v) for k, v in sent.items()}
    assert any(max(v) < 256 for v in sent.values()), "the replay sends each call's own length, not the cap"


async def test_the_live_router_estimates_with_the_speed_the_engines_and_the_simulator_run_at(
    tmp_path: Path,
) -> None:
    # The demo slows engine-sim (--speedup 0.5) and the simulator's engines alike. The live router must
    # estimate with those slowed coefficients too, or GoRouting finds feasible what the engine (and the
    # simulator) cannot serve in time: the launcher tells each sidecar the engine's step-time correction,
    # the sidecar reports it in its PodState, and the router scales the named profile by it.
    from slo_core.cli import build_parser
    from slo_proto import slofleet_pb2 as pb
    from slo_router.podstate import replica_view
    from slo_sidecar.cli import _knobs
    from slo_sidecar.config import PolicyConfig
    from slo_sidecar.estimators import FallbackEstimator
    from slo_sidecar.grpc_service import pod_state
    from slo_sidecar.service import Sidecar

    policy = tmp_path / "policy.yaml"
    policy.write_text(demo_policy(2.0, "gmax", "go-routing"), encoding="utf-8")
    group = EngineGroup(count=1, profile=DEFAULT_PROFILE, speedup=0.5)
    fleet = LocalFleet(FleetSpec(engines=[group], port=0, policy_file=policy, workdir=tmp_path / "fleet"))
    cmd = fleet._sidecar_child("sidecar-0", "http://127.0.0.1:9", 1, "pod-0", group).cmd
    argv = cmd[cmd.index("sidecar") :]
    args = build_parser(argv).parse_args(argv)
    sc = Sidecar(
        knobs=_knobs(args), config=PolicyConfig.default(), engine_url="http://127.0.0.1:9",
        estimator=FallbackEstimator(),
    )  # fmt: skip
    now = time.time()
    await sc.mirror.take(pb.EngineReport(snapshot_unix_s=now, policy="gmax", models=["m"]))
    view = replica_view(pod_state(sc), replica_id="pod-0", now_s=1.0, wall_now_s=now)
    assert view.profile == engine_profile(DEFAULT_PROFILE, 0.5)
    assert view.profile != engine_profile(DEFAULT_PROFILE, 1.0)
    # a pod on its profiled GPU (the default) reports no correction, and its named profile is used
    plain = replica_view(pb.PodState(profile=DEFAULT_PROFILE), replica_id="p", now_s=1.0, wall_now_s=now)
    assert plain.profile == engine_profile(DEFAULT_PROFILE, 1.0)


def test_demotions_are_compared_live_vs_simulated_per_tier_the_router_counts() -> None:
    from prometheus_client import generate_latest

    from slo_lab.localfleet.demo import demotions_from_metrics
    from slo_lab.localfleet.report import comparison
    from slo_router.metrics import RouterMetrics

    metrics = RouterMetrics()
    metrics.downgraded.labels("latency-high", "t1", "m").inc(2)
    metrics.downgraded.labels("latency-high", "t2", "m").inc()
    metrics.downgraded.labels("compound-low", "t1", "m").inc(4)
    live = demotions_from_metrics(generate_latest(metrics.registry).decode())
    assert live == {"latency-high": 3, "compound-low": 4}
    tier = {"by_tier": {"latency-high": {"attainment": 1.0}}, "goodput_token_ratio": 0.5}
    text, _ = comparison(
        {"slofleet": {**tier, "demoted_by_tier": live}}, {"slofleet": {**tier, "demoted_by_tier": {"x": 2}}}
    )
    assert "| demoted to best effort (requests and calls) | 7 | 2 | +5 |" in text


@pytest.mark.parametrize("finish", ["abort", "length"])
@pytest.mark.parametrize("stream", [True, False])
async def test_a_call_the_engine_let_go_is_counted_dropped_not_an_error(finish: str, *, stream: bool) -> None:
    # The engine's scheduler ends a waiting call it can no longer serve in time with finish_reason
    # "abort" (the simulator counts it missed). The demo's console listed those as errors; a call that
    # ends short for any other reason still is one.
    import json
    import time

    import httpx
    import openai

    from slo_lab.localfleet.replay import Replayer, describe, failure_reasons

    kind = "latency" if stream else "deadline"
    job = replace(next(j for j in _jobs() if j.slo.kind.value == kind), arrival_s=0.0)

    def answer(request: httpx.Request) -> httpx.Response:
        return _engine_answer(bool(json.loads(request.content).get("stream")), 0, finish)

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    client = openai.AsyncOpenAI(base_url="http://fleet/v1", api_key="k", http_client=http, max_retries=0)
    record = await Replayer(client, "m", time.monotonic).run_job(job, time.monotonic())
    await http.aclose()
    expected = "dropped" if finish == "abort" else "error"
    assert not record.completed and record.status == expected
    assert describe([record])[expected] == 1
    assert next(iter(failure_reasons([record]))).startswith(
        "dropped by the engine" if finish == "abort" else "stream ended"
    )


def test_the_simulator_binds_each_stated_slo_to_its_tier_as_the_router_does() -> None:
    """What the replay states (its headers), bound by the router's rule, is what the simulator runs and
    measures each job against: a 4-stage program in the demo's 6-stage compound tier states a tighter
    whole-program deadline than the tier's, which the router raises to the tier's; the simulator once
    kept the stricter one (sim 160 s, live 240 s)."""
    from slo_core.perf import load_profile
    from slo_core.sim.engine_types import EngineConfig
    from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
    from slo_core.wire.request_slo import parse_slo
    from slo_lab.localfleet.replay import _headers, as_sent
    from slo_router.config import from_policy

    policy = parse_policy(demo_policy(2.0, "gmax", "go-routing"), "demo")
    router = from_policy(policy.spec, require_keys=False)
    jobs = _jobs(20.0)
    assert {len(j.stages) for j in jobs if j.stages} == {4, 6}
    routed = {}
    for job in jobs:
        slo = parse_slo(_headers(job, 0 if job.stages else None), {})
        tier, stripped = router.anonymous().bind_tier(slo.tier)
        assert tier == job.tier and not stripped
        routed[job.job_id] = router.tiers[tier].targets(
            ttft_s=slo.ttft_s, tbt_s=slo.tbt_s, deadline_s=slo.deadline_s
        )
    sim = FleetSim.from_runtime(
        [ReplicaSpec(load_profile(DEFAULT_PROFILE), EngineConfig())],
        policy.spec.runtime(),
        config=SimConfig(drain="all"),
    )
    result = sim.run([as_sent(j) for j in jobs])
    simulated = {r.request_id: r.slo for r in result.requests if r.program is None}
    simulated |= {p.program_id: p.slo for p in result.programs}
    assert simulated == routed
    # the demo's own tiers keep every stated target (the compound tier is its shortest program's)
    assert all(routed[j.job_id] == j.slo for j in jobs)
    # a 6-stage whole-program tier raises a 4-stage program's stated deadline, in both
    compound = {"name": "compound-high", "kind": "compound", "deadlineS": 240.0, "priorityClass": "high"}
    doc = yaml.safe_load(demo_policy(2.0, "gmax", "go-routing"))
    doc["spec"]["tiers"] = [compound if t["name"] == "compound-high" else t for t in doc["spec"]["tiers"]]
    policy = parse_policy(yaml.safe_dump(doc), "demo, 6-stage tier")
    router = from_policy(policy.spec, require_keys=False)
    tiers = policy.spec.runtime().tiers
    sim = FleetSim.from_runtime(
        [ReplicaSpec(load_profile(DEFAULT_PROFILE), EngineConfig())],
        policy.spec.runtime(),
        config=SimConfig(drain="all"),
    )
    result = sim.run([as_sent(j) for j in jobs])
    simulated = {p.program_id: p.slo for p in result.programs}
    raised = 0
    for job in (j for j in jobs if j.tier == "compound-high"):
        slo = parse_slo(_headers(job, 0), {})
        bound = router.tiers[job.tier].targets(deadline_s=slo.deadline_s)
        assert simulated[job.job_id] == bound == tiers[job.tier].bind(job.slo)
        raised += bound.deadline_s != job.slo.deadline_s
    assert raised, "some 4-stage program states less than the tier's 240 s"


@pytest.mark.parametrize("chat", [True, False])
def test_the_router_sizes_the_replays_prompts_as_the_engine_counts_them(chat: bool) -> None:
    """The simulator's router sees each prompt's true length; the live router estimates it from the
    body (slo_core.wire.tokens.estimate_body_prompt_tokens, the sidecar's count). The replay's filler
    must read the same to both (a 5-letter filler word once read as 2 tokens to the router, 1 to
    engine-sim: every live prompt looked twice its size), BOS and chat framing included."""
    from slo_core.wire.tokens import estimate_body_prompt_tokens
    from slo_lab.engine_sim.tokens import count_chat_tokens, count_text_tokens
    from slo_lab.localfleet.replay import filler_prompt

    for n in (20, 601, 3000):
        text = filler_prompt(n, chat=chat)
        engine = count_chat_tokens([("user", text)]) if chat else count_text_tokens(text)
        assert engine == n
        body = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
        assert estimate_body_prompt_tokens(body) == n


async def test_the_replay_records_the_tier_each_call_was_served_in() -> None:
    # The router's answers say which tier served a request (x-slo-tier); the replay keeps it per call,
    # so a job the live router demoted can be matched to the simulator's demotions of the same job.
    import json
    import time

    import httpx
    import openai

    from slo_lab.localfleet.replay import CallTrace, Replayer

    compound = next(j for j in _jobs() if j.slo.kind.value == "compound" and len(j.stages or ()) > 1)
    latency = next(j for j in _jobs() if j.slo.kind.value == "latency")

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        # the router demotes stage 1 of the program, and serves everything else as asked
        served = "best-effort" if request.headers.get("x-slo-stage") == "1" else request.headers["x-slo-tier"]
        return _engine_answer(bool(body.get("stream")), body["max_tokens"], headers={"x-slo-tier": served})

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    client = openai.AsyncOpenAI(base_url="http://fleet/v1", api_key="k", http_client=http, max_retries=0)
    replayer = Replayer(client, "m", time.monotonic)
    start = time.monotonic()
    program = await replayer.run_job(replace(compound, arrival_s=0.0), start)
    chat = await replayer.run_job(replace(latency, arrival_s=0.0), start)
    await http.aclose()
    assert program.completed and chat.completed
    traces = program.traces(start)
    assert [c.stage for c in traces] == [s for s, calls in enumerate(compound.stages or ()) for _ in calls]
    assert [c.demoted for c in traces] == [c.stage == 1 for c in traces]
    assert all(c.sent_s >= 0 for c in traces)
    assert chat.traces(start) == [CallTrace(None, chat.calls[0].sent_s - start, False)]
    assert chat.calls[0].tier == latency.tier


def test_demotions_are_matched_per_job_and_timed_against_the_simulator() -> None:
    from slo_lab.localfleet.replay import CallTrace
    from slo_lab.localfleet.report import demotion_timing, describe_demotion_timing

    jobs = _jobs(4.0)[:3]
    policy = demo_policy(2.0, "fcfs", "round-robin")
    outs = simulate(jobs, policy, profile=DEFAULT_PROFILE, speedup=0.5, engines=1, seed=0)
    ids, tiers = [j.job_id for j in jobs], [j.tier for j in jobs]
    sim = [[CallTrace(0, 1.0, False), CallTrace(1, 3.0, False)], [CallTrace(None, 2.0, True)], []]
    live = [[CallTrace(0, 1.1, False), CallTrace(1, 3.5, True)], [CallTrace(None, 2.2, True)], []]
    diff = job_differences(ids, outs, outs, tiers, traces=(live, sim))
    assert diff[tiers[0]]["demoted_live_only"] == [ids[0]]
    assert all(not diff[t]["demoted_sim_only"] for t in diff)
    assert ids[1] not in diff[tiers[1]]["demoted_live_only"]  # demoted on both sides
    timing = demotion_timing(live, sim)
    assert timing["calls_demoted"] == {"live": 2, "sim": 1, "both": 1}
    assert timing["send_lag_demoted_live_only"]["n"] == 1
    assert timing["send_lag_demoted_live_only"]["median_s"] == pytest.approx(0.5)
    assert timing["send_lag_all_calls"]["n"] == 3
    assert timing["send_lag_all_calls"]["median_s"] == pytest.approx(0.2)
    line = describe_demotion_timing("slofleet", timing)
    assert line.startswith("slofleet demoted calls: 2 live, 1 simulated, 1 the same call;")
    assert "demoted live only +0.50 s" in line
    assert describe_demotion_timing("stock", demotion_timing([[]], [[]])) == ""


def test_the_simulators_call_traces_show_the_demotions_it_counts() -> None:
    # overload one engine for a moment: the demo's policy demotes what it cannot serve in time, and the
    # per-job traces the demo compares with the live run carry exactly those demotions
    spec = WorkloadSpec(
        trace="azure-conv-2023", rps=300.0, duration_s=2.0, mix=parse_mix("1:1:1"), slo_scale=2.0,
        max_tokens=256, seed=0,
    )  # fmt: skip
    jobs = [_capped(j, 256, 3000) for j in build_workload(spec) if j.total_output_tokens > 0]
    demoted: dict[str, int] = {}
    from slo_lab.localfleet.replay import CallTrace

    calls: dict[str, list[CallTrace]] = {}
    simulate(
        jobs, demo_policy(2.0, "gmax", "go-routing"), profile=DEFAULT_PROFILE, speedup=0.5, engines=1,
        seed=0, demoted_by_tier=demoted, calls=calls,
    )  # fmt: skip
    traced = sum(c.demoted for v in calls.values() for c in v)
    assert traced == sum(demoted.values()) > 0
    assert set(calls) == {j.job_id for j in jobs}
    for j in jobs:  # each job's calls as released: a program that failed releases no later stage
        stages = [c.stage for c in calls[j.job_id]]
        if j.stages is None:
            assert stages == [None]
        else:
            planned = [s for s, stage in enumerate(j.stages) for _ in stage]
            assert stages == planned[: len(stages)] and stages


async def test_a_call_whose_connection_broke_says_which_side_hung_up() -> None:
    # The openai client wraps every transport failure as APIConnectionError("Connection error."); the
    # replay's failure reasons keep the transport's own error, so a demo run's one failed call can be
    # told apart: the router hung up on a reused connection, a refused connect, a timeout.
    import openai

    from slo_lab.localfleet.replay import Replayer, failure_reasons

    job = replace(next(j for j in _jobs() if j.slo.kind.value == "deadline"), arrival_s=0.0)

    def hang_up(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)

    http = httpx.AsyncClient(transport=httpx.MockTransport(hang_up))
    client = openai.AsyncOpenAI(base_url="http://fleet/v1", api_key="k", http_client=http, max_retries=0)
    record = await Replayer(client, "m", time.monotonic).run_job(job, time.monotonic())
    await http.aclose()
    assert record.status == "error"
    assert failure_reasons([record]) == {
        "APIConnectionError (RemoteProtocolError: Server disconnected without sending a response.)": 1
    }
