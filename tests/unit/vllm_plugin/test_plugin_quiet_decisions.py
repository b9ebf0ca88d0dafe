"""Quiet decisions (``BaseEnginePolicy.skip_quiet_decisions``): one rule, core's ``quiet_step``, that
the simulator and the vLLM plugin both apply, so a policy that leaves them out keeps one cadence in
the simulator and in the pods."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from slo_core.perf import load_profile
from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView, quiet_step
from slo_core.policies.registry import engine_policy_names, make_engine_policy
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.request import SimRequest
from slo_core.slo import RequestKind, SLOTargets
from slo_vllm_plugin.bridge import PolicyBridge

CHAT = SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1)


def _decodes(*computed: int) -> list[tuple[int, int]]:
    return [(c + 1, c) for c in computed]


def test_the_rule() -> None:
    assert quiet_step(0, _decodes(10, 20, 30), 8, 0, 16)
    assert quiet_step(0, [], 8, 0, 16)  # nothing at all: nothing to decide
    assert not quiet_step(1, _decodes(10, 20), 8, 10, 16)  # a request waits (held ones count)
    assert not quiet_step(0, [*_decodes(10), (100, 60), *_decodes(3)], 8, 10, 16)  # a chunked prefill
    assert not quiet_step(0, [*_decodes(10), (40, 40)], 8, 10, 16)  # nothing to compute: not a decode
    assert not quiet_step(0, _decodes(10, 20, 30), 2, 10, 16)  # the budget in force starves a decode
    assert quiet_step(0, _decodes(10, 20), 2, 10, 16)
    # two decodes whose blocks are full (32, 48 computed) open a block each: two must be free
    assert quiet_step(0, _decodes(32, 48, 50), 8, 2, 16)
    assert not quiet_step(0, _decodes(32, 48, 50), 8, 1, 16)  # the step would preempt


class Counting(BaseEnginePolicy):
    """FCFS that counts its calls; ``quiet`` says whether it leaves out quiet decisions."""

    name = "counting"

    def __init__(self, quiet: bool) -> None:
        self.skip_quiet_decisions = quiet
        self.calls: list[tuple[int, int]] = []

    def decide(
        self, waiting: Any, running: Any, engine: EngineView, rng: random.Random
    ) -> Decision:  # fmt: skip
        self.calls.append((len(waiting), len(running)))
        return Decision(running_order=tuple(r.request_id for r in running))


def _engine(policy: BaseEnginePolicy) -> SimEngine:
    return SimEngine("e0", load_profile("h100-llama3-8b-tp1"), policy, EngineConfig(max_num_seqs=8))


def _run(engine: SimEngine, steps: int) -> None:
    t = 0.0
    for _ in range(steps):
        end = engine.plan(t)
        if end is None:
            return
        engine.complete()
        t = end


@pytest.mark.parametrize("quiet", [False, True])
def test_the_simulator_leaves_out_quiet_decisions_only(quiet: bool) -> None:
    policy = Counting(quiet)
    engine = _engine(policy)
    for i in range(3):
        engine.accept(SimRequest(f"r{i}", 0.0, CHAT, 100, output_tokens=5 + 3 * i, max_tokens=64), 0.0)
    _run(engine, 40)
    assert all(r.generated == r.target_tokens for r in engine.done)
    assert len(engine.done) == 3
    # the first step decides (three wait); the prefill step's end makes them decodes; each finish is
    # an event: with quiet decisions left out only the decision with requests waiting remains
    if quiet:
        assert policy.calls == [(3, 0)]
        assert engine.quiet_skipped > 0
    else:
        assert policy.calls[0] == (3, 0)
        assert len(policy.calls) > 3  # every step (frame of one step) decides
        assert engine.quiet_skipped == 0


def test_an_arrival_or_a_prefill_is_never_quiet() -> None:
    policy = Counting(True)
    engine = _engine(policy)
    engine.accept(SimRequest("a", 0.0, CHAT, 100, output_tokens=50, max_tokens=64), 0.0)
    _run(engine, 5)
    engine.accept(SimRequest("b", 0.0, CHAT, 100, output_tokens=50, max_tokens=64), 0.1)
    _run(engine, 1)  # b waits: the decision is taken
    assert policy.calls == [(1, 0), (1, 1)]
    engine.token_budget = 1  # a budget that starves a decode: not quiet either
    _run(engine, 1)
    assert policy.calls[-1] == (0, 2)


def _vllm_request(rid: str, prompt: int, computed: int, out: int) -> Any:
    return SimpleNamespace(
        request_id=rid, sampling_params=None, arrival_time=0.0, num_prompt_tokens=prompt, max_tokens=256,
        num_output_tokens=out, num_computed_tokens=computed, num_tokens=prompt + out,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("n_waiting", "rows", "budget", "free_blocks"),
    [
        (0, [(100, 101, 2), (50, 53, 4)], None, 0),  # decodes only: quiet
        (1, [(100, 101, 2)], None, 4),  # a request waits
        (0, [(100, 40, 0), (50, 53, 4)], None, 4),  # a chunked prefill runs
        (0, [(100, 101, 2), (50, 53, 4)], 1, 4),  # the policy's budget starves a decode
        (0, [(100, 101, 2), (50, 53, 4)], 2, 4),
        (0, [(100, 112, 13), (50, 64, 15)], None, 2),  # both fill their blocks: two new ones fit
        (0, [(100, 112, 13), (50, 64, 15)], None, 1),  # ... one does not
    ],
)
def test_the_plugin_and_the_simulator_agree(
    n_waiting: int, rows: list[tuple[int, int, int]], budget: int | None, free_blocks: int
) -> None:
    # the simulator's side, on SimRequests in the same state
    sim_running = []
    for i, (prompt, computed, out) in enumerate(rows):
        r = SimRequest(f"s{i}", 0.0, CHAT, prompt, output_tokens=64, max_tokens=256)
        r.computed, r.generated, r.num_tokens = computed, out, prompt + out
        sim_running.append(r)
    stock = 8192
    sim_quiet = quiet_step(
        n_waiting,
        [(r.num_tokens, r.computed) for r in sim_running],
        stock if budget is None else budget,
        free_blocks,
        16,
    )
    # the plugin's side: a GMAX bridge at an event
    bridge = PolicyBridge(make_engine_policy("gmax", {}), clock=lambda: 1.0)
    bridge.token_budget = budget
    bridge.note_event()
    running = [_vllm_request(f"v{i}", *row) for i, row in enumerate(rows)]
    due = bridge.frame_due(n_waiting, running, stock, free_blocks, 16)
    assert due is not sim_quiet
    assert bridge.quiet_skipped == int(sim_quiet)


def test_a_policy_that_keeps_its_quiet_decisions_is_always_called_by_the_plugin() -> None:
    bridge = PolicyBridge(make_engine_policy("edf", {}), clock=lambda: 1.0)
    bridge.note_event()
    assert bridge.frame_due(0, [_vllm_request("a", 10, 11, 1)], 8192, 100, 16)


QUIET = [
    n for n in engine_policy_names() if getattr(make_engine_policy(n, {}), "skip_quiet_decisions", False)
]
DEADLINE = SLOTargets(RequestKind.DEADLINE, deadline_s=20.0)


def test_the_policies_that_leave_out_quiet_decisions() -> None:
    assert set(QUIET) >= {"gmax", "gmax-oracle", "gmax-no-analyzer", "gmax-no-gmax", "tempo", "slos-serve"}
    assert "annealing" in QUIET
    assert not make_engine_policy("annealing", {"hold_later_batches": True}).skip_quiet_decisions
    assert not {"fcfs", "edf", "autellix", "slide-batching"} & set(QUIET)


@pytest.mark.parametrize("name", QUIET)
def test_a_quiet_decision_would_change_nothing_but_the_running_order(name: str) -> None:
    """The contract a policy declares with ``skip_quiet_decisions``, checked on a seeded engine's real
    quiet decisions: nobody admitted, preempted or rejected, a budget that covers every running decode,
    and, for a policy that does not decide at every arrival, the knobs the decision before it set (an
    arrival before the next frame meets them)."""
    params: dict[str, Any] = {"frame_steps": 1} if name.startswith("gmax") else {}
    policy = make_engine_policy(name, params)
    engine = _engine(policy)
    for i in range(12):
        slo = CHAT if i % 2 else DEADLINE
        engine.accept(SimRequest(f"r{i}", 0.0, slo, 300, output_tokens=20 + 7 * i, max_tokens=128), 0.0)
    seen: list[tuple[Decision, list[RequestView], Decision | None]] = []
    last: list[Decision] = []
    inner = policy.decide

    def spy(waiting: Any, running: Any, view: EngineView, rng: random.Random) -> Decision:
        d = inner(waiting, running, view, rng)
        rows = [(r.prompt_tokens + r.generated_tokens, r.computed_tokens) for r in running]
        if quiet_step(len(waiting), rows, engine.token_budget, view.kv_blocks_free, view.block_size):
            seen.append((d, list(running), last[-1] if last else None))
        last.append(d)
        return d

    policy.decide = spy  # type: ignore[method-assign]
    engine._quiet = False  # take them, to look at them
    _run(engine, 400)
    assert len(engine.done) == 12
    assert len(seen) > 5
    for d, running, before in seen:
        assert not d.admit and not d.preempt and not d.reject
        assert d.token_budget is None or d.token_budget >= len(running)
        assert set(d.running_order or ()) <= {r.request_id for r in running}
        if not policy.reschedule_on_events:
            assert before is not None
            knobs = (d.token_budget, d.prefill_first, d.hold_unlisted)
            assert knobs == (before.token_budget, before.prefill_first, before.hold_unlisted)
