"""Step-level tests of the slofleet scheduler plugin inside a real (in-process, CPU) vLLM engine.

Each test drives ``LLMEngine.add_request`` / ``step`` directly, so the order of admissions and the
preemptions are exact, and compares what the engine did (its engine-side trace) with what the pure
policy decided on the same snapshots.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm import EngineArgs, SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

from slo_core.policies import registry
from slo_core.policies.base import (
    BaseEnginePolicy,
    Decision,
    EngineView,
    FinishedView,
    RequestView,
    quiet_step,
)
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags

pytestmark = pytest.mark.vllm

PROMPT = "def add(a, b):\n    return a + b\n"


class DeadlineOrder(BaseEnginePolicy):
    """Admit earliest absolute deadline first; records every decision it returns."""

    name = "test-deadline-order"

    def __init__(self) -> None:
        self.decisions: list[tuple[list[str], Decision]] = []

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        order = sorted(waiting, key=lambda r: (r.deadline_at_s or 0.0, r.arrival_s))
        d = Decision(admit=tuple(r.request_id for r in order))
        self.decisions.append(([r.request_id for r in waiting], d))
        return d


class PreemptWhenUrgentWaits(BaseEnginePolicy):
    """Preempt the running request with the latest deadline whenever a request with priority
    weight ≥ 2 is waiting and no seat is free; admit urgent first."""

    name = "test-preempt"

    def __init__(self) -> None:
        self.preempted: list[str] = []

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        urgent = [r for r in waiting if r.priority_weight >= 2]
        order = tuple(r.request_id for r in sorted(waiting, key=lambda r: -r.priority_weight))
        if urgent and len(running) >= engine.max_num_seqs:
            victim = max(running, key=lambda r: r.deadline_at_s or 0.0)
            if victim.priority_weight < 2:
                self.preempted.append(victim.request_id)
                return Decision(admit=order, preempt=(victim.request_id,))
        return Decision(admit=order)


class SmallBudgetLatestDeadlineFirst(BaseEnginePolicy):
    """An 8-token step budget while prompts are prefilling (Sarathi-style); once two requests decode,
    a 1-token budget, so only the first in the running order (latest deadline first) advances."""

    name = "test-budget"

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        latest_first = sorted(running, key=lambda r: -(r.deadline_at_s or 0.0))
        decoding = len(running) == 2 and not waiting and not any(r.in_prefill for r in running)
        return Decision(
            admit=tuple(r.request_id for r in waiting),
            running_order=tuple(r.request_id for r in latest_first),
            token_budget=1 if decoding else 8,
        )


class DeadlineOrderThatLearns(DeadlineOrder):
    """:class:`DeadlineOrder` that keeps what the engine tells it of each finished request."""

    name = "test-deadline-order-learns"

    def __init__(self) -> None:
        super().__init__()
        self.finished: list[FinishedView] = []

    def observe(self, finished: Sequence[FinishedView], now_s: float) -> None:
        self.finished.extend(finished)


class QuietDeadlineOrder(DeadlineOrder):
    """:class:`DeadlineOrder` that leaves out quiet decisions; records the queues of every call."""

    name = "test-deadline-order-quiet"
    skip_quiet_decisions = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, list[tuple[int, int]], int, int]] = []

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        rows = [(r.prompt_tokens + r.generated_tokens, r.computed_tokens) for r in running]
        self.seen.append((len(waiting), rows, engine.kv_blocks_free, engine.block_size))
        return super().decide(waiting, running, engine, rng)


@pytest.fixture(autouse=True)
def _register_test_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.ENGINE_POLICIES, QuietDeadlineOrder.name, f"{__name__}:QuietDeadlineOrder")
    monkeypatch.setitem(
        registry.ENGINE_POLICIES, DeadlineOrderThatLearns.name, f"{__name__}:DeadlineOrderThatLearns"
    )
    monkeypatch.setitem(registry.ENGINE_POLICIES, DeadlineOrder.name, f"{__name__}:DeadlineOrder")
    monkeypatch.setitem(
        registry.ENGINE_POLICIES,
        SmallBudgetLatestDeadlineFirst.name,
        f"{__name__}:SmallBudgetLatestDeadlineFirst",
    )
    monkeypatch.setitem(
        registry.ENGINE_POLICIES, PreemptWhenUrgentWaits.name, f"{__name__}:PreemptWhenUrgentWaits"
    )


def make_engine(model: Path, policy: str, trace: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> Any:
    monkeypatch.setenv("SLOFLEET_POLICY", policy)
    monkeypatch.setenv("SLOFLEET_ENGINE_TRACE", str(trace))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = EngineArgs(
        model=str(model),
        max_model_len=512,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        scheduler_cls="slo_vllm_plugin.scheduler.SLOScheduler",
        max_num_seqs=2,
        max_num_batched_tokens=256,
        seed=0,
    )
    return LLMEngine.from_engine_args(args)


def scheduler_of(engine: Any) -> Any:
    return engine.engine_core.engine_core.scheduler


def tagged(max_tokens: int, deadline_s: float, weight: float = 1.0) -> SamplingParams:
    tags = EngineTags(SLOTargets(RequestKind.DEADLINE, deadline_s=deadline_s, priority_weight=weight))
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=tags.to_xargs())


def run_all(engine: Any) -> dict[str, int]:
    tokens: dict[str, int] = {}
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = len(out.outputs[0].token_ids)
    return tokens


def events(trace: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, trace.read_text().splitlines()) if e["event"] == kind]


def base_id(engine_request_id: str) -> str:
    return engine_request_id.rsplit("-", 1)[0]


def test_admission_follows_the_policys_order(
    tiny_model: Path, vllm_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = vllm_env / "trace.jsonl"
    engine = make_engine(tiny_model, DeadlineOrder.name, trace, monkeypatch)
    deadlines = {"a": 40.0, "b": 10.0, "c": 30.0, "d": 20.0, "e": 50.0}
    for rid, dl in deadlines.items():
        engine.add_request(rid, PROMPT, tagged(8, dl))
    done = run_all(engine)
    assert {base_id(k): v for k, v in done.items()} == dict.fromkeys(deadlines, 8)
    admitted = [base_id(e["request_id"]) for e in events(trace, "admit")]
    assert admitted == sorted(deadlines, key=deadlines.__getitem__)  # b d c a e
    # the engine applied exactly what the pure policy returned on the snapshots it was given
    policy = scheduler_of(engine).slo_bridge.policy
    first_waiting, first_decision = policy.decisions[0]
    assert [base_id(x) for x in first_decision.admit] == ["b", "d", "c", "a", "e"]
    assert sorted(map(base_id, first_waiting)) == sorted(deadlines)
    decided = [list(map(base_id, e["admit"])) for e in events(trace, "decide")]
    assert decided[0] == ["b", "d", "c", "a", "e"]


def test_preempts_exactly_when_the_policy_says(
    tiny_model: Path, vllm_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = vllm_env / "trace.jsonl"
    engine = make_engine(tiny_model, PreemptWhenUrgentWaits.name, trace, monkeypatch)
    engine.add_request("low1", PROMPT, tagged(40, 100.0))
    engine.add_request("low2", PROMPT, tagged(40, 200.0))
    for _ in range(5):
        engine.step()
    engine.add_request("urgent", PROMPT, tagged(4, 5.0, weight=2.0))
    done = run_all(engine)
    # every request still completes with its full length (recompute after preemption)
    assert {base_id(k): v for k, v in done.items()} == {"low1": 40, "low2": 40, "urgent": 4}
    policy = scheduler_of(engine).slo_bridge.policy
    preempted = [base_id(e["request_id"]) for e in events(trace, "preempt")]
    assert preempted == [base_id(x) for x in policy.preempted] == ["low2"]
    finish_order = [base_id(e["request_id"]) for e in events(trace, "finish")]
    assert finish_order.index("urgent") < finish_order.index("low2")
    assert scheduler_of(engine).slo_metrics.preemptions == 1


def test_unreachable_analyzer_degrades_to_stock_order(
    tiny_model: Path, vllm_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = vllm_env / "trace.jsonl"
    engine = make_engine(
        tiny_model,
        DeadlineOrder.name,
        trace,
        monkeypatch,
        SLOFLEET_ANALYZER="127.0.0.1:9",
        SLOFLEET_STALE_AFTER_S="0.5",
    )
    deadlines = {"a": 40.0, "b": 10.0, "c": 30.0}
    for rid, dl in deadlines.items():
        engine.add_request(rid, PROMPT, tagged(6, dl))
    done = run_all(engine)
    assert {base_id(k): v for k, v in done.items()} == dict.fromkeys(deadlines, 6)
    assert [base_id(e["request_id"]) for e in events(trace, "admit")] == ["a", "b", "c"]  # arrival order
    assert events(trace, "degraded")
    assert scheduler_of(engine).slo_metrics.is_degraded


def test_malformed_tags_are_scheduled_best_effort_not_failed(
    tiny_model: Path, vllm_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = vllm_env / "trace.jsonl"
    engine = make_engine(tiny_model, DeadlineOrder.name, trace, monkeypatch)
    bad = SamplingParams(max_tokens=3, ignore_eos=True, extra_args={"slo_kind": "urgent-please"})
    engine.add_request("bad", PROMPT, bad)
    engine.add_request("good", PROMPT, tagged(3, 10.0))
    done = run_all(engine)
    assert {base_id(k): v for k, v in done.items()} == {"bad": 3, "good": 3}


def test_token_budget_and_running_order_are_applied(
    tiny_model: Path, vllm_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = vllm_env / "trace.jsonl"
    engine = make_engine(tiny_model, SmallBudgetLatestDeadlineFirst.name, trace, monkeypatch)
    sched = scheduler_of(engine)
    engine.add_request("early", PROMPT, tagged(6, 10.0))
    engine.add_request("late", PROMPT, tagged(6, 90.0))
    prompt_tokens = len(engine.get_tokenizer().encode(PROMPT))
    assert prompt_tokens > 8
    engine.step()
    # the first step admits under the policy's 8-token budget, not the engine's 256
    admits = events(trace, "admit")
    assert sum(e["tokens"] for e in admits) == 8
    done = run_all(engine)
    assert {base_id(k): v for k, v in done.items()} == {"early": 6, "late": 6}
    # the stock budget is restored after every step
    assert sched.max_num_scheduled_tokens == 256
    # once both decode, the later deadline is first in vLLM's running list: it gets the one token
    finish_order = [base_id(e["request_id"]) for e in events(trace, "finish")]
    assert finish_order == ["late", "early"]


def test_the_policy_is_told_of_every_request_that_finished(
    tiny_model: Path, vllm_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """observe() gets core's FinishedView of each finished request (as in the simulator), none of
    an aborted one: GMAX's tuner, fairness and bound reading learn in a real engine too."""
    trace = vllm_env / "trace.jsonl"
    engine = make_engine(tiny_model, DeadlineOrderThatLearns.name, trace, monkeypatch)
    engine.add_request("met", PROMPT, tagged(6, 600.0, weight=2.0))
    engine.add_request("missed", PROMPT, tagged(5, 1e-3))
    engine.add_request("gone", PROMPT, tagged(50, 600.0))
    # a natural end: every token is a stop token (FinishReason.STOP, which is 0, at the first token)
    stops = SamplingParams(
        max_tokens=50,
        stop_token_ids=list(range(len(engine.get_tokenizer()))),
        extra_args=EngineTags(SLOTargets(RequestKind.DEADLINE, deadline_s=600.0)).to_xargs(),
    )
    engine.add_request("stopped", PROMPT, stops)
    engine.step()
    engine.abort_request(["gone"])
    done = run_all(engine)
    assert sorted(map(base_id, done)) == ["met", "missed", "stopped"]
    policy = scheduler_of(engine).slo_bridge.policy
    told = {base_id(f.request.request_id): f for f in policy.finished}
    assert sorted(told) == ["met", "missed", "stopped"]
    met, missed, stopped = told["met"], told["missed"], told["stopped"]
    assert met.request.generated_tokens == 6 and missed.request.generated_tokens == 5
    # cut at max_tokens ("length"): the view says so; stopped on its own: its true length, uncut
    assert met.request.max_tokens == 6
    assert (stopped.request.generated_tokens, stopped.request.max_tokens) == (1, 50)
    assert stopped.met_slo
    prompt = len(engine.get_tokenizer().encode(PROMPT))
    # token goodput of a deadline request met in time: its prompt and output, weighted
    assert met.met_slo and met.gain == met.ideal_gain == 2.0 * (prompt + 6)
    assert not missed.met_slo and missed.gain == 0.0 and missed.ideal_gain == prompt + 5


def test_quiet_decisions_are_left_out_as_the_simulator_leaves_them(
    tiny_model: Path, vllm_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy that declares skip_quiet_decisions is called at every frame (one step) except those
    where nothing waits and both running requests decode: core's quiet_step, the simulator's rule."""
    trace = vllm_env / "trace.jsonl"
    engine = make_engine(tiny_model, QuietDeadlineOrder.name, trace, monkeypatch)
    engine.add_request("a", PROMPT, tagged(24, 40.0))
    engine.add_request("b", PROMPT, tagged(16, 10.0))
    engine.add_request("c", PROMPT, tagged(8, 20.0))  # waits for a seat (max_num_seqs=2)
    done = run_all(engine)
    assert {base_id(k): v for k, v in done.items()} == {"a": 24, "b": 16, "c": 8}
    sched = scheduler_of(engine)
    policy = sched.slo_bridge.policy
    assert policy.seen and policy.seen[0][0] == 3
    for n_waiting, rows, free, block in policy.seen:  # no call the rule calls quiet
        assert not quiet_step(n_waiting, rows, 256, free, block)
    assert sched.slo_bridge.quiet_skipped > 10  # the decode-only steps of a, b and c
    assert sched.slo_metrics.quiet_skipped == sched.slo_bridge.quiet_skipped
    assert [base_id(e["request_id"]) for e in events(trace, "admit")][:2] == ["b", "c"]
