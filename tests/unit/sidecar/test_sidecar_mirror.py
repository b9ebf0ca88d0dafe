"""Engine mode in the sidecar: the engine's reports become bounds (new, refined, learned from finishes)
and the PodState routers read, without the sidecar seeing a token."""

from __future__ import annotations

import time

import pytest

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_proto import slofleet_pb2 as pb
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.grpc_service import pod_state
from slo_sidecar.service import Sidecar

CHAT = SLOTier("chat", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=2.0, tbt_s=0.1)


def _bounds(answer: list[tuple[str, int, float]]) -> dict[str, int]:
    return {key: bound for key, bound, _ in answer}


def _sidecar() -> Sidecar:
    return Sidecar(
        knobs=SidecarKnobs(mode="engine", refine_every_tokens=10, pod="p"),
        config=PolicyConfig(tiers={"chat": CHAT}, default_tier="chat"),
        engine_url="http://127.0.0.1:9",
        estimator=FallbackEstimator(),
    )


def _report(
    generated: int, finished: list[pb.FinishedRequest] | None = None, *, now: float
) -> pb.EngineReport:
    chat = pb.EngineRequest(
        request_key="c1", phase="decode" if generated else "waiting", prompt_tokens=50,
        generated_tokens=generated, max_tokens=2000, arrival_unix_s=now - 1.0, kind="latency", tier="chat",
        priority_weight=4.0, ttft_s=2.0, tbt_s=0.1, tenant="t",
        first_token_unix_s=now - 0.5 if generated else 0,
    )  # fmt: skip
    plain = pb.EngineRequest(request_key="direct-1", phase="waiting", prompt_tokens=8, max_tokens=64)
    return pb.EngineReport(
        snapshot_unix_s=now, waiting=1, running=1, kv_usage=0.3, kv_cache_tokens=8192,
        requests=[chat, plain], finished=finished or [], policy="gmax", models=["m"], max_model_len=4096,
    )  # fmt: skip


async def test_new_requests_get_a_bound_refined_as_tokens_are_reported() -> None:
    sc = _sidecar()
    now = time.time()
    first = _bounds(await sc.mirror.take(_report(0, now=now)))
    assert 1 <= first["c1"] <= 2000 and 1 <= first["direct-1"] <= 64
    again = _bounds(await sc.mirror.take(_report(5, now=now)))
    assert again["c1"] == first["c1"], "no refinement before refine_every_tokens"
    grown = first["c1"] + 5
    later = _bounds(await sc.mirror.take(_report(grown, now=now)))
    assert later["c1"] > grown, "a refined bound stays above what was generated"


async def test_finished_requests_teach_the_estimator_and_count() -> None:
    sc = _sidecar()
    now = time.time()
    await sc.mirror.take(_report(3, now=now))
    observed = len(sc.estimator.observed)  # type: ignore[attr-defined]
    done = [pb.FinishedRequest(request_key="c1", generated_tokens=42, finish_reason="stop", tier="chat")]
    await sc.mirror.take(_report(0, done, now=now))
    assert len(sc.estimator.observed) == observed + 1  # type: ignore[attr-defined]
    assert sc.metrics.requests.labels("chat", "-", "ok")._value.get() == 1
    assert sc.metrics.output_tokens.labels("chat", "-")._value.get() == 42


async def test_the_pod_state_is_the_engines_report_with_due_times_and_bounds() -> None:
    sc = _sidecar()
    now = time.time()
    bounds = _bounds(await sc.mirror.take(_report(4, now=now)))
    state = pod_state(sc)
    assert (state.waiting, state.running, state.kv_usage, state.engine_policy) == (1, 1, 0.3, "gmax")
    assert list(state.capabilities.models) == ["m"] and state.capabilities.max_context_tokens == 4096
    chat = next(r for r in state.requests if r.request_id == "c1")
    assert chat.tier == "chat" and chat.kind == "latency" and chat.output_bound == bounds["c1"]
    assert abs(chat.deadline_unix_s - (now - 1.0 + 2.0 + 4 * 0.1)) < 1e-6  # token 4's due time
    assert abs(chat.ttft_s - 0.5) < 1e-6
    plain = next(r for r in state.requests if r.request_id == "direct-1")
    assert plain.kind == "best-effort"
    assert state.outstanding_tokens == (bounds["c1"] - 4) + (bounds["direct-1"] + 8)


async def test_an_engine_that_stopped_reporting_is_shown_unhealthy() -> None:
    sc = _sidecar()
    sc.engine.healthy = True
    await sc.mirror.take(_report(0, now=time.time()))
    assert pod_state(sc).healthy
    sc.mirror.received_s = time.monotonic() - 60
    assert not pod_state(sc).healthy


async def test_a_compound_call_gets_its_stage_sub_deadline_in_the_answer_and_the_state() -> None:
    agent = SLOTier(
        "agent",
        RequestKind.COMPOUND,
        PriorityClass("mid", 2.0),
        deadline_s=100.0,
        stage_deadline_share=(0.25, 0.25, 0.5),
    )
    sc = Sidecar(
        knobs=SidecarKnobs(mode="engine", pod="p"),
        config=PolicyConfig(tiers={"chat": CHAT, "agent": agent}, default_tier="chat"),
        engine_url="http://127.0.0.1:9",
        estimator=FallbackEstimator(),
    )
    t0 = time.time()

    def call(key: str, stage: int, at: float) -> pb.EngineRequest:
        return pb.EngineRequest(
            request_key=key, phase="waiting", prompt_tokens=20, max_tokens=256, arrival_unix_s=at,
            kind="compound", tier="agent", deadline_s=100.0, program_id="prog-1", stage=stage,
        )  # fmt: skip

    first = pb.EngineReport(snapshot_unix_s=t0, requests=[call("s0", 0, t0)])
    ((_, _, sub0),) = await sc.mirror.take(first)
    # tags without a due time (the router's, in a fleet: test_compound_parity): the tier's share
    assert sub0 == pytest.approx(t0 + 25.0, abs=1e-6)  # stage 0: a quarter of the program's 100 s
    done = pb.FinishedRequest(request_key="s0", generated_tokens=30, finish_reason="stop", tier="agent")
    second = pb.EngineReport(snapshot_unix_s=t0 + 5, requests=[call("s1", 1, t0 + 5)], finished=[done])
    ((_, _, sub1),) = await sc.mirror.take(second)
    assert sub1 == pytest.approx(t0 + 50.0, abs=1e-6)  # stages 0-1: half, from the program's arrival
    (row,) = pod_state(sc).requests
    assert row.deadline_unix_s == pytest.approx(sub1, abs=1e-6)


def _count(sc: Sidecar, metric: str, *labels: str) -> float:
    value = sc.metrics.registry.get_sample_value(
        f"slofleet_sidecar_{metric}", dict(zip(_LABELS[metric], labels, strict=True))
    )
    return value or 0.0


_LABELS = {
    "prompt_tokens_total": ("tier", "priority_class"),
    "slo_met_total": ("tier", "priority_class"),
    "slo_missed_total": ("tier", "priority_class"),
    "rejects_total": ("tier", "priority_class", "reason"),
    "requests_total": ("tier", "priority_class", "outcome"),
}


async def test_reports_count_prompts_once_outcomes_per_tier_and_set_the_work_gauges() -> None:
    """Prompt tokens when a request is first reported (or at its finish, if no report saw it live);
    met/missed per tier and rejections as the engine judged them, aborts no outcome; the gauges."""
    sc = _sidecar()
    now = time.time()
    await sc.mirror.take(_report(0, now=now))
    await sc.mirror.take(_report(4, now=now))
    assert _count(sc, "prompt_tokens_total", "chat", "-") == 50  # c1 once, though reported twice
    assert _count(sc, "prompt_tokens_total", "-", "-") == 8  # direct-1 (untagged)
    m = sc.metrics
    bound = sc.mirror.bound_of("c1", 0)
    assert m.outstanding_tokens._value.get() == (bound - 4) + sc.mirror.bound_of("direct-1", 0) + 8
    assert (m.program_requests._value.get(), m.engine_waiting._value.get()) == (0, 1)
    sc.update_gauges()  # what /metrics calls: engine mode keeps the engine's figures
    assert m.outstanding_tokens._value.get() > 0 and m.engine_waiting._value.get() == 1
    done = [
        pb.FinishedRequest(request_key="c1", generated_tokens=9, finish_reason="stop", tier="chat",
                           outcome=pb.SLO_OUTCOME_MET, prompt_tokens=50),
        pb.FinishedRequest(request_key="gone", generated_tokens=3, finish_reason="length", tier="chat",
                           outcome=pb.SLO_OUTCOME_MISSED, prompt_tokens=70),
        pb.FinishedRequest(request_key="no", generated_tokens=0, finish_reason="abort", tier="chat",
                           outcome=pb.SLO_OUTCOME_REJECTED, prompt_tokens=5),
        pb.FinishedRequest(request_key="left", generated_tokens=2, finish_reason="abort", tier="chat",
                           prompt_tokens=6),
    ]  # fmt: skip
    # c1 finished after this report's snapshot was taken: still in its requests, not a new request
    await sc.mirror.take(_report(9, done, now=now))
    assert "c1" not in sc.mirror.tracked
    assert _count(sc, "prompt_tokens_total", "chat", "-") == 50 + 70 + 5 + 6
    assert (_count(sc, "slo_met_total", "chat", "-"), _count(sc, "slo_missed_total", "chat", "-")) == (1, 2)
    assert _count(sc, "rejects_total", "chat", "-", "engine_policy") == 1
    assert [_count(sc, "requests_total", "chat", "-", o) for o in ("ok", "rejected", "aborted")] == [2, 1, 1]
    assert m.outstanding_tokens._value.get() == sc.mirror.bound_of("direct-1", 0) + 8
