"""Deep-queue cadence (``BaseEnginePolicy.deep_queue_from``, ``deep_queue_every``): one rule, core's
``event_deferred``, that the simulator, engine-sim (through the guard) and the vLLM plugin all apply, so a
policy that takes its events every so many steps over a deep queue keeps one cadence everywhere."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from slo_core.crd.policy import SLOPolicySpec
from slo_core.crd.semantics import policy_spec_problems
from slo_core.perf import load_profile
from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, decision_due, event_deferred
from slo_core.policies.guard import GuardedPolicy
from slo_core.policies.registry import make_engine_policy
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.request import SimRequest
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags
from slo_vllm_plugin.bridge import PolicyBridge

CHAT = SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1)
BATCH = SLOTargets(RequestKind.DEADLINE, deadline_s=600.0)


def test_the_rule() -> None:
    deep = {"deep_queue_from": 512, "deep_queue_every": 10}
    assert not event_deferred(7, 10_000, deep_queue_from=0, deep_queue_every=10, urgent=False)  # off
    assert not event_deferred(7, 511, **deep, urgent=False)  # a shallow queue: every event
    assert event_deferred(7, 512, **deep, urgent=False)  # a deep one: off the cadence, deferred
    assert not event_deferred(20, 512, **deep, urgent=False)  # ... on it, decided
    assert not event_deferred(7, 512, **deep, urgent=True)  # ... a latency arrival, decided at once


def test_decision_due_is_frames_and_the_events_the_rule_leaves() -> None:
    deep = {"deep_queue_from": 512, "deep_queue_every": 10}
    assert decision_due(50, 50, False, False, 10_000, **deep, urgent=False)  # a frame boundary, always
    assert not decision_due(7, 50, True, False, 10, **deep, urgent=False)  # no event since the last
    assert not decision_due(7, 50, False, True, 10, **deep, urgent=False)  # a policy not on events
    assert decision_due(7, 50, True, True, 511, **deep, urgent=False)  # an event over a shallow queue
    assert not decision_due(7, 50, True, True, 512, **deep, urgent=False)  # deep, off the cadence
    assert decision_due(7, 50, True, True, 512, **deep, urgent=True)  # ... a latency arrival


class Counting(BaseEnginePolicy):
    """FCFS that records the step and queue of each call."""

    name = "counting"
    frame_steps = 50

    def __init__(self, deep_from: int, every: int) -> None:
        self.deep_queue_from = deep_from
        self.deep_queue_every = every
        self.calls: list[tuple[int, int]] = []

    def decide(
        self, waiting: Any, running: Any, engine: EngineView, rng: random.Random
    ) -> Decision:  # fmt: skip
        self.calls.append((engine.step, len(waiting)))
        return Decision(running_order=tuple(r.request_id for r in running))


def _run(engine: SimEngine, arrivals: list[SimRequest], steps: int) -> None:
    """``steps`` engine steps with one arrival before each (an event at every step)."""
    t = 0.0
    for r in arrivals[:steps]:
        r.arrival_s = t
        engine.accept(r, t)
        end = engine.plan(t)
        assert end is not None
        engine.complete()
        t = end


def _arrivals(n: int, chat_every: int = 0) -> list[SimRequest]:
    """Deadline requests; with ``chat_every``, every so many of them a latency one instead."""
    return [
        SimRequest(
            f"r{i}", 0.0, CHAT if chat_every and i % chat_every == 0 else BATCH, 200, output_tokens=40,
            max_tokens=64,
        )
        for i in range(n)
    ]  # fmt: skip


def test_the_simulator_takes_events_over_a_deep_queue_every_so_many_steps() -> None:
    policy = Counting(deep_from=12, every=5)
    engine = SimEngine("e0", load_profile("h100-llama3-8b-tp1"), policy, EngineConfig(max_num_seqs=4))
    _run(engine, _arrivals(60), 60)
    assert len(engine.waiting) > 40  # four seats: the queue grows by one a step
    shallow = [(s, n) for s, n in policy.calls if n < 12]
    deep = [(s, n) for s, n in policy.calls if n >= 12]
    assert shallow and deep
    # below the bar every step's arrival is decided at once; from it on, every fifth step (a frame
    # of 50 steps also falls on one)
    assert [s for s, _ in shallow] == list(range(1, len(shallow) + 1))
    assert all(s % 5 == 0 for s, _ in deep)
    assert [s for s, _ in deep] == [s for s in range(deep[0][0], 61) if s % 5 == 0]
    assert engine.decisions == len(policy.calls)


def test_a_latency_arrival_is_decided_at_once_over_a_deep_queue() -> None:
    policy = Counting(deep_from=12, every=5)
    engine = SimEngine("e0", load_profile("h100-llama3-8b-tp1"), policy, EngineConfig(max_num_seqs=4))
    arrivals = _arrivals(60, chat_every=7)
    _run(engine, arrivals, 60)
    deep = [s for s, n in policy.calls if n >= 12]
    # request i arrives before step i + 1: a latency one is decided at that step, deep queue or not
    chat_steps = {i + 1 for i in range(60) if i % 7 == 0}
    off_cadence = {s for s in deep if s % 5}
    assert off_cadence and off_cadence == {s for s in chat_steps if s >= deep[0] and s % 5}
    assert not engine.urgent  # taken into account by the last decision


def test_a_bar_no_queue_reaches_changes_nothing() -> None:
    runs = []
    for deep_from in (0, 10_000):
        policy = Counting(deep_from=deep_from, every=7)
        engine = SimEngine("e0", load_profile("h100-llama3-8b-tp1"), policy, EngineConfig(max_num_seqs=4))
        _run(engine, _arrivals(60), 60)
        runs.append((policy.calls, [r.token_times for r in engine.running], engine.step_end_s))
    assert runs[0] == runs[1]


def test_the_guard_carries_the_cadence() -> None:
    g = GuardedPolicy(Counting(deep_from=512, every=10))
    assert (g.deep_queue_from, g.deep_queue_every) == (512, 10)
    plain = GuardedPolicy(make_engine_policy("gmax", {}))
    assert (plain.deep_queue_from, plain.deep_queue_every) == (512, 10)  # GMAX's default
    off = GuardedPolicy(make_engine_policy("gmax", {"deep_queue_from": 0}))
    assert off.deep_queue_from == 0  # off: GMAX takes every event
    # GMAX's params set it (an SLOPolicy's policy params reach it so)
    gmax = GuardedPolicy(make_engine_policy("gmax", {"deep_queue_from": 512, "deep_queue_every": 8}))
    assert (gmax.deep_queue_from, gmax.deep_queue_every) == (512, 8)


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"deep_queue_from": 512, "deep_queue_every": 10}, None),
        ({"deep_queue_from": -1}, "deep_queue_from"),
        ({"deep_queue_from": 512, "deep_queue_every": 0}, "deep_queue_every"),
    ],
)
def test_an_slopolicy_turns_it_on_for_gmax(params: dict[str, int], problem: str | None) -> None:
    """The README's way to turn the rule on: GMAX's params in the SLOPolicy, checked by their model."""
    example = Path(__file__).parents[3] / "examples" / "slopolicy-chat-agent.yaml"
    doc = next(d for d in yaml.safe_load_all(example.read_text(encoding="utf-8")) if d["kind"] == "SLOPolicy")
    assert doc["spec"]["scheduling"]["name"] == "gmax"
    doc["spec"]["scheduling"]["params"].update(params)
    spec = SLOPolicySpec.model_validate(doc["spec"])
    problems = policy_spec_problems(spec)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and f"spec.scheduling.params.{problem}" in problems[0]


def _vllm_request(rid: str, slo: SLOTargets | None = None) -> Any:
    params = None if slo is None else SimpleNamespace(extra_args=EngineTags(targets=slo).to_xargs())
    return SimpleNamespace(
        request_id=rid, sampling_params=params, arrival_time=0.0, num_prompt_tokens=100, max_tokens=256,
        num_output_tokens=0, num_computed_tokens=0, num_tokens=100,
    )  # fmt: skip


@pytest.mark.parametrize(("step", "n_waiting"), list(itertools.product((1, 5, 10, 49, 50, 60), (0, 3, 20))))
def test_the_plugin_and_the_simulator_agree(step: int, n_waiting: int) -> None:
    policy = Counting(deep_from=20, every=10)
    bridge = PolicyBridge(policy, clock=lambda: 1.0)
    bridge.step = step
    bridge.note_event()
    # a prefill runs, so the decision is never quiet: the cadence alone decides
    due = bridge.frame_due(n_waiting, [_vllm_request("a")], 8192, 100, 16)
    deferred = event_deferred(step, n_waiting, deep_queue_from=20, deep_queue_every=10, urgent=False)
    assert due is (step % 50 == 0 or not deferred)
    if not n_waiting:  # an empty engine does not step
        return
    # the simulator's engine, at the same step with the same queue and an event pending
    sim = SimEngine("e0", load_profile("h100-llama3-8b-tp1"), Counting(20, 10), EngineConfig())
    for i in range(n_waiting):
        sim.accept(SimRequest(f"w{i}", 0.0, BATCH, 100, output_tokens=4, max_tokens=8), 0.0)
    sim.step, sim.events = step - 1, True
    sim.plan(1.0)
    assert (sim.decisions == 1) is due


@pytest.mark.parametrize("slo", [CHAT, BATCH, None])
def test_the_plugin_decides_a_latency_arrival_at_once_over_a_deep_queue(slo: SLOTargets | None) -> None:
    bridge = PolicyBridge(Counting(deep_from=20, every=10), clock=lambda: 1.0)
    bridge.step = 7
    bridge.arrived(_vllm_request("new", slo))
    bridge.note_event()
    running = [_vllm_request("a")]
    assert bridge.frame_due(30, running, 8192, 100, 16) is (slo is CHAT)
    # as the simulator's engine does for the same arrival
    sim = SimEngine("e0", load_profile("h100-llama3-8b-tp1"), Counting(20, 10), EngineConfig())
    sim.accept(SimRequest("new", 0.0, slo or BATCH, 100, output_tokens=4, max_tokens=8), 0.0)
    assert sim.urgent is (slo is CHAT)
    if slo is CHAT:  # a decision takes it into account: another event waits for the cadence again
        bridge.decide([], running, sim.engine_view)
        bridge.note_event()
        assert not bridge.frame_due(30, running, 8192, 100, 16)
