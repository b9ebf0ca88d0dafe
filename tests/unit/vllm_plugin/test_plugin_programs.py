"""The vLLM plugin views a compound call with its program, as engine-sim and the simulator do.

Before, the plugin's views carried no program: GMAX took a call's own arrival plus the SLO's deadline
for its program's deadline (a later stage's program then ended long after the real one), counted no
service of the program's earlier calls, and Autellix saw every request at zero attained service."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from slo_core.policies.base import MAX_ENGINE_PROGRAMS, Decision, RequestView
from slo_core.policies.registry import make_engine_policy
from slo_core.sim.request import RUNNING, WAITING, ProgramState, SimRequest
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags
from slo_vllm_plugin.bridge import PolicyBridge

AGENT = SLOTargets(RequestKind.COMPOUND, deadline_s=60.0, priority_weight=2.0)
BATCH = SLOTargets(RequestKind.DEADLINE, deadline_s=30.0)


def request(rid: str, tags: EngineTags, at: float, prompt: int, computed: int, out: int) -> Any:
    return SimpleNamespace(
        request_id=rid, sampling_params=SimpleNamespace(extra_args=tags.to_xargs()), arrival_time=at,
        num_prompt_tokens=prompt, max_tokens=256, num_output_tokens=out, num_computed_tokens=computed,
    )  # fmt: skip


def sim_call(rid: str, prompt: int, computed: int, out: int, program: ProgramState | None) -> SimRequest:
    r = SimRequest(rid, 0.0, AGENT, prompt, output_tokens=64, max_tokens=256, program=program)
    r.computed, r.generated = computed, out
    return r


def decided_views(b: PolicyBridge, waiting: list[Any], running: list[Any]) -> dict[str, RequestView]:
    seen: dict[str, RequestView] = {}

    def record(w: list[RequestView], r: list[RequestView], *_: Any) -> Decision:
        seen.update({v.request_id: v for v in (*w, *r)})
        return Decision()

    b.guard.decide = record  # type: ignore[method-assign]
    b.decide(waiting, running, lambda now: None)  # type: ignore[arg-type,return-value]
    return seen


def test_a_compound_call_carries_its_programs_arrival_deadline_and_service() -> None:
    b = PolicyBridge(make_engine_policy("fcfs", {}), clock=lambda: 111.0)
    stage0 = EngineTags(AGENT, program_id="p", stage=0, deadline_at_s=130.0)
    stage1 = EngineTags(AGENT, program_id="p", stage=1, deadline_at_s=145.0)
    first = request("a", stage0, 100.0, prompt=20, computed=20, out=30)
    b.view(first, {})  # seen while it ran
    b.call_ended(first)  # finished: 50 tokens of service stay with the program
    running = request("b", stage1, 110.0, prompt=25, computed=25, out=5)
    waiting = request("c", stage1, 110.5, prompt=15, computed=0, out=0)
    plain = request("d", EngineTags(BATCH), 110.0, prompt=10, computed=4, out=0)
    views = decided_views(b, [waiting, plain], [running])

    # the simulator's rule on the same calls (core's ProgramState and SimRequest)
    program = ProgramState("p", 100.0, AGENT, ())
    done = sim_call("a", 20, 20, 30, program).attained_tokens()
    live = [sim_call("b", 25, 25, 5, program), sim_call("c", 15, 0, 0, program)]
    live[0].state, live[1].state = RUNNING, WAITING
    program.attained_done_tokens = done
    program.calls = live
    for rid in ("b", "c"):
        v = views[rid]
        assert v.program_arrival_s == 100.0  # the program's first call here, not this call's arrival
        assert v.program_deadline_at_s == program.deadline_at_s == 160.0
        assert v.program_attained_tokens == program.attained_tokens() == 50 + 30 + 0
        assert v.deadline_at_s == {"b": 145.0, "c": 145.0}[rid]  # the stage's own due time stays
    d = views["d"]
    assert d.program_arrival_s is None and d.program_deadline_at_s is None
    assert d.program_attained_tokens == sim_call("d", 10, 4, 0, None).attained_tokens() == 4


def test_a_later_tag_deadline_extends_the_program_and_old_programs_are_dropped() -> None:
    b = PolicyBridge(make_engine_policy("fcfs", {}))
    late = EngineTags(AGENT, program_id="q", stage=0, deadline_at_s=500.0)
    assert b.view(request("x", late, 100.0, 5, 0, 0), {}).program_deadline_at_s == 500.0
    latency = EngineTags(SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.1), program_id="r")
    assert b.view(request("y", latency, 100.0, 5, 0, 0), {}).program_deadline_at_s is None
    for i in range(MAX_ENGINE_PROGRAMS + 5):
        b.program(EngineTags(AGENT, program_id=f"p{i}"), float(i))
    assert len(b._programs) == MAX_ENGINE_PROGRAMS and "q" not in b._programs
