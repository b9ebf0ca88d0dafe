"""The engine simulator's vLLM v1 semantics on small hand-checked cases (constant 10 ms steps)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import builders
import pytest

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView
from slo_core.policies.registry import make_engine_policy
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.request import ABORTED, FINISHED, REJECTED, WAITING, SimRequest
from slo_core.slo import RequestKind, SLOTargets

SLO = SLOTargets(RequestKind.DEADLINE, deadline_s=100.0)


def profile(*, step_ms: float = 10.0, per_token_ms: float = 0.0) -> PerfProfile:
    """Each step takes max(step_ms, per_token_ms · tokens)."""
    return builders.profile(floor_ms=step_ms, a_ms_per_token=per_token_ms)


def engine(policy: object = None, **cfg: int) -> SimEngine:
    pol = policy if policy is not None else make_engine_policy("fcfs", {"prefill_first": False})
    return SimEngine("e0", profile(), pol, EngineConfig(**cfg))  # type: ignore[arg-type]


def req(rid: str, prompt: int, out: int, t: float = 0.0) -> SimRequest:
    return SimRequest(rid, t, SLO, prompt, output_tokens=out, max_tokens=1000)


def run(e: SimEngine, now: float = 0.0, max_steps: int = 1000) -> float:
    """Step until idle; returns the clock."""
    for _ in range(max_steps):
        end = e.plan(now)
        if end is None:
            return now
        e.complete()
        now = end
    raise AssertionError("engine did not drain")


def ms(times: Sequence[float]) -> list[int]:
    return [round(t * 1000) for t in times]


def test_prompt_is_chunked_to_the_token_budget_then_decodes_one_token_per_step() -> None:
    e = engine(max_num_batched_tokens=8)
    r = req("a", 20, 3)
    e.accept(r, 0.0)
    run(e)
    # 8 + 8 + 4 prompt tokens: first token at the end of step 3, then one token per step
    assert ms(r.token_times) == [30, 40, 50]
    assert r.state == FINISHED and r.finish_s == pytest.approx(0.05)


def test_running_requests_are_scheduled_before_new_prefills_share_the_rest_of_the_budget() -> None:
    e = engine(max_num_batched_tokens=8)
    a = req("a", 6, 3)
    e.accept(a, 0.0)
    end = e.plan(0.0)
    e.complete()
    b = req("b", 10, 1)
    e.accept(b, end)  # type: ignore[arg-type]
    run(e, end)  # type: ignore[arg-type]
    # step 2: a decodes (1 token), b gets the 7 left; step 3: a decodes, b's last 3 prompt tokens
    assert ms(a.token_times) == [10, 20, 30]
    assert ms(b.token_times) == [30]


def test_per_token_timestamps_follow_the_performance_model() -> None:
    e = SimEngine("e0", profile(step_ms=0.0, per_token_ms=1.0), make_engine_policy("fcfs"))
    r = req("a", 5, 3)
    e.accept(r, 0.0)
    run(e)
    assert ms(r.token_times) == [5, 6, 7]  # 5 prompt tokens take 5 ms, each decode 1 ms


def test_max_num_seqs_caps_the_running_batch() -> None:
    e = engine(max_num_seqs=2)
    rs = [req(f"r{i}", 4, 2) for i in range(3)]
    for r in rs:
        e.accept(r, 0.0)
    e.plan(0.0)
    assert [r.request_id for r in e.running] == ["r0", "r1"]
    e.complete()
    run(e, 0.01)
    assert ms(rs[2].token_times) == [30, 40]  # admitted when r0 and r1 finished at 20 ms


def test_kv_exhaustion_preempts_the_last_running_request_which_recomputes_later() -> None:
    # 8 blocks of 4 tokens; two 12-token prompts take 3 blocks each; their decodes need a 4th, then a 5th
    e = engine(kv_cache_tokens=32, block_size=4)
    a, b = req("a", 12, 10), req("b", 12, 10)
    e.accept(a, 0.0)
    e.accept(b, 0.0)
    run(e)
    # step 6: a needs its 5th block, none is free: b (the last running) is preempted; b waits until a
    # finishes at step 10, then recomputes its 12 + 5 tokens in one step and emits token 6 at step 11
    assert ms(a.token_times) == [10 * k for k in range(1, 11)]
    assert ms(b.token_times) == [10, 20, 30, 40, 50, 110, 120, 130, 140, 150]
    assert (a.preemptions, b.preemptions, e.preemptions) == (0, 1, 1)
    assert e.free_blocks == e.kv_blocks_total


def test_a_waiting_request_without_free_blocks_is_not_admitted() -> None:
    e = engine(kv_cache_tokens=32, block_size=4)
    big, small = req("big", 24, 4), req("small", 12, 1)  # 6 (+1 for decode) and 3 blocks of 8
    e.accept(big, 0.0)
    e.accept(small, 0.0)
    run(e)
    assert ms(big.token_times) == [10, 20, 30, 40]
    assert ms(small.token_times) == [50]  # waited until big freed its blocks


def test_a_prompt_longer_than_the_kv_cache_is_rejected_on_arrival() -> None:
    e = engine(kv_cache_tokens=32, block_size=4)
    r = req("huge", 40, 1)
    assert not e.accept(r, 0.0)
    assert r.state == REJECTED and e.plan(0.0) is None


def test_prefill_first_admits_new_prefills_before_running_decodes() -> None:
    e = engine(policy=make_engine_policy("fcfs"), max_num_batched_tokens=8)  # vLLM v0 order
    a = req("a", 4, 3)
    e.accept(a, 0.0)
    end = e.plan(0.0)
    e.complete()
    e.accept(req("b", 8, 1), end)  # type: ignore[arg-type]
    e.plan(end)  # type: ignore[arg-type]
    # b's 8-token prompt takes the whole budget: a's decode is skipped this step
    assert [(r.request_id, n) for r, n in e._batch_p] == [("b", 8)] and e._batch_d == []


class Reverse(BaseEnginePolicy):
    """Admits the waiting requests by descending id; records the steps at which it is asked."""

    name = "reverse"

    def __init__(self, frame_steps: int = 1, on_events: bool = True) -> None:
        self.frame_steps = frame_steps
        self.reschedule_on_events = on_events
        self.steps: list[int] = []

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        self.steps.append(engine.step)
        return Decision(admit=tuple(sorted((r.request_id for r in waiting), reverse=True)))


def test_the_policy_decision_orders_admission() -> None:
    e = engine(policy=Reverse(), max_num_seqs=1)
    rs = [req(f"r{i}", 4, 1) for i in range(3)]
    for r in rs:
        e.accept(r, 0.0)
    run(e)
    assert [ms(r.token_times) for r in rs] == [[30], [20], [10]]


def test_the_policy_is_asked_every_frame_of_steps() -> None:
    pol = Reverse(frame_steps=3, on_events=False)
    e = engine(policy=pol)
    e.accept(req("a", 4, 10), 0.0)
    run(e)
    assert pol.steps == [3, 6, 9]


def test_complete_with_a_measured_duration_and_token_events() -> None:
    e = engine()
    a, b = req("a", 4, 2), req("b", 4, 1)
    e.accept(a, 1.0)
    e.accept(b, 1.0)
    assert e.plan(1.0) == pytest.approx(1.01)  # the modelled step
    out = e.complete(duration_s=0.5)  # engine-sim: what the step really took
    assert out.end_s == pytest.approx(1.5)
    assert [r.request_id for r in out.emitted] == ["a", "b"]
    assert [r.request_id for r in out.finished] == ["b"]
    assert a.token_times == [pytest.approx(1.5)]


def test_abort_between_steps_and_during_a_step() -> None:
    e = engine()
    a, b, c = req("a", 4, 5), req("b", 4, 5), req("c", 4, 5)
    for r in (a, b, c):
        e.accept(r, 0.0)
    assert e.abort("c", 0.0) is c and c.state == ABORTED  # queued: leaves at once
    e.plan(0.0)
    assert e.abort("b", 0.005) is b and b.state != ABORTED  # in the step in flight
    out = e.complete()
    assert b in out.emitted and b.state == ABORTED and b.blocks == 0
    assert [r.request_id for r in e.running] == ["a"]
    assert e.abort("nope", 0.0) is None
    run(e, 0.01)
    assert a.state == FINISHED and e.free_blocks == e.kv_blocks_total and e.outstanding_tokens == 0
    assert c.state == ABORTED and b.state == ABORTED and a.state != WAITING
