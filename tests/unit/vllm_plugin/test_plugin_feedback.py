"""The vLLM plugin tells its policy of each request that finished, as the simulator does.

Before, the plugin never called ``EnginePolicy.observe``: GMAX's cutoff tuner, its per-tenant
service (``spec.fairness``) and its learned reading of the analyzer's bounds learned in the
simulator and engine-sim but stayed at their starting values in a real engine. The bridge now keeps
the output tokens' times of each request (only for a policy that observes) and hands the policy
core's :class:`~slo_core.policies.feedback.Feedback` of it: the same FinishedView the simulator
builds from a SimRequest with the same times (compared here)."""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from builders import engine

from slo_core.perf import load_profile
from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, FinishedView, RequestView
from slo_core.policies.feedback import Feedback
from slo_core.policies.gmax import GMAX
from slo_core.policies.gmax_snapshot import DEADLINE
from slo_core.policies.registry import make_engine_policy
from slo_core.sim.outcomes import finished_view
from slo_core.sim.request import FINISHED, SimRequest
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags
from slo_vllm_plugin.bridge import PolicyBridge
from slo_vllm_plugin.report import finish_reason

BATCH = SLOTargets(RequestKind.DEADLINE, deadline_s=3.0, priority_weight=2.0)
CHAT = SLOTargets(RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.4)


class Recorder(BaseEnginePolicy):
    name = "test-recorder"

    def __init__(self) -> None:
        self.seen: list[FinishedView] = []

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        return Decision()

    def observe(self, finished: Sequence[FinishedView], now_s: float) -> None:
        self.seen.extend(finished)


def request(rid: str, tags: EngineTags, at: float, prompt: int = 10, max_tokens: int = 256) -> Any:
    return SimpleNamespace(
        request_id=rid, sampling_params=SimpleNamespace(extra_args=tags.to_xargs()), arrival_time=at,
        num_prompt_tokens=prompt, max_tokens=max_tokens, num_output_tokens=0, num_computed_tokens=0,
    )  # fmt: skip


def run(b: PolicyBridge, req: Any, steps: list[tuple[float, int]], end: float, reason: str = "stop") -> None:
    """``req`` arrives, has ``n`` output tokens at each step's time, and leaves at ``end``."""
    b.arrived(req)
    for t, n in steps:
        req.num_output_tokens = n
        req.num_computed_tokens = req.num_prompt_tokens + n - 1
        b.made_tokens(req, t)
    req.num_output_tokens += 1  # the step that finished it
    b.call_ended(req, reason, now_s=end)


def sim_twin(slo: SLOTargets, arrival: float, prompt: int, times: list[float]) -> FinishedView:
    r = SimRequest("twin", arrival, slo, prompt, output_tokens=len(times), max_tokens=256)
    r.generated, r.computed, r.token_times = len(times), prompt + len(times) - 1, times
    r.state, r.finish_s = FINISHED, times[-1]
    return finished_view(Feedback("token"), r)


@pytest.mark.parametrize(
    ("slo", "steps", "end", "times"),
    [
        # a deadline request finishing after its deadline (3 s): no gain, the ideal it could have had
        (BATCH, [(100.5, 2), (101.0, 4)], 103.5, [100.5, 100.5, 101.0, 101.0, 103.5]),
        (BATCH, [(100.5, 2), (101.0, 4)], 102.0, [100.5, 100.5, 101.0, 101.0, 102.0]),
        # a latency request whose last token is late (due 100 + 0.5 + 3·0.4 = 101.7)
        (CHAT, [(100.4, 1), (100.8, 2), (101.2, 3)], 101.9, [100.4, 100.8, 101.2, 101.9]),
    ],
    ids=["deadline-missed", "deadline-met", "latency-late-token"],
)
def test_a_finished_request_is_fed_back_as_the_simulator_would(
    slo: SLOTargets, steps: list[tuple[float, int]], end: float, times: list[float]
) -> None:
    policy = Recorder()
    b = PolicyBridge(policy, feedback=Feedback("token"), clock=lambda: 0.0)
    run(b, request("a", EngineTags(slo, tenant="acme"), 100.0), steps, end)
    assert len(policy.seen) == 1
    got, twin = policy.seen[0], sim_twin(slo, 100.0, 10, times)
    assert (got.gain, got.ideal_gain, got.met_slo, got.finish_s) == (
        twin.gain,
        twin.ideal_gain,
        twin.met_slo,
        twin.finish_s,
    )
    assert got.request.generated_tokens == len(times)
    assert got.request.tenant == "acme"


def test_aborted_and_rejected_requests_are_not_fed_back() -> None:
    policy = Recorder()
    b = PolicyBridge(policy, feedback=Feedback("token"), clock=lambda: 0.0)
    run(b, request("gone", EngineTags(BATCH), 100.0), [(100.5, 2)], 101.0, reason="abort")
    b.arrived(rejected := request("no", EngineTags(BATCH), 100.0))
    b.call_ended(rejected, "abort", rejected=True, now_s=101.0)
    assert policy.seen == []
    assert not b._token_times  # nothing kept for requests that left


def test_a_policy_that_learns_nothing_costs_no_token_times() -> None:
    b = PolicyBridge(make_engine_policy("fcfs", {}), feedback=Feedback("token"))
    assert b.feedback is None
    b.arrived(req := request("a", EngineTags(BATCH), 100.0))
    b.made_tokens(req, 100.5)
    assert not b._token_times


def test_finish_reasons_read_as_vllm_writes_them() -> None:
    class FinishReason(enum.IntEnum):  # vLLM v1's: STOP is 0, a false value
        STOP = 0
        LENGTH = 1

        def __str__(self) -> str:
            return self.name.lower()

    def freed(reason: FinishReason | None) -> Any:
        return SimpleNamespace(get_finished_reason=lambda: reason)

    assert finish_reason(freed(FinishReason.STOP)) == "stop"
    assert finish_reason(freed(FinishReason.LENGTH)) == "length"
    assert finish_reason(freed(None)) == "abort"


def test_a_request_cut_at_a_length_is_not_read_as_its_true_length() -> None:
    policy = Recorder()
    b = PolicyBridge(policy, feedback=Feedback("token"), clock=lambda: 0.0)
    run(b, request("cut", EngineTags(BATCH), 100.0, max_tokens=4096), [(100.5, 9)], 101.0, reason="length")
    (told,) = policy.seen
    assert told.request.generated_tokens == told.request.max_tokens == 10


def test_a_feedback_that_fails_does_not_fail_the_engine_step(caplog: pytest.LogCaptureFixture) -> None:
    b = PolicyBridge(policy := Recorder(), feedback=Feedback("token"), clock=lambda: 0.0)
    b.feedback = SimpleNamespace()  # type: ignore[assignment]  # calling it raises TypeError
    run(b, request("a", EngineTags(BATCH), 100.0), [(100.5, 2)], 101.0)
    assert "could not feed back" in caplog.text
    assert not b._token_times and not policy.seen


@pytest.mark.parametrize("numpy_path", [False, True], ids=["scalar", "numpy"])
def test_gmax_in_the_plugin_learns_where_the_bound_sits(
    monkeypatch: pytest.MonkeyPatch, numpy_path: bool
) -> None:
    """GMAX behind the bridge: the analyzer's bounds arrive after the first decision (engine mode:
    the router's tags carry none), lengths come from the feedback."""
    if numpy_path:
        monkeypatch.setattr("slo_core.policies.gmax_scalar.MAX_ROWS", -1)
    gmax = GMAX()
    bounds: dict[str, int] = {}
    b = PolicyBridge(gmax, bounds=lambda: bounds, feedback=Feedback("token"), clock=lambda: 100.0)
    view = engine(100.0, step=1, batched=2048, kv_total=20_000, profile=load_profile("h100-llama3-8b-tp1"))
    reqs = [request(f"r{i}", EngineTags(BATCH), 99.0 + i / 100) for i in range(30)]
    for r in reqs:
        b.arrived(r)
    b.decide(reqs, [], lambda now: view)
    assert gmax.bounds.tracked == 0
    bounds.update({r.request_id: 800 for r in reqs})
    b.decide(reqs, [], lambda now: view)
    assert gmax.bounds.tracked == 30
    for r in reqs:
        r.num_output_tokens = 99  # the last token comes with the finishing step: 100 of a bound of 800
        b.call_ended(r, "stop", now_s=101.0)
    assert gmax.bounds.tracked == 0
    assert gmax.bounds.z_by_kind[DEADLINE] > gmax.bounds.static_z
    assert gmax.tuner._finished == 30  # the cutoff tuner heard of them too


def test_fairness_counts_the_service_of_finished_requests_in_a_real_engine_too() -> None:
    """spec.fairness: GMAX's per-tenant service grows from the finishes the engine reports (before,
    only in the simulator: the plugin never reported them, so a live tenant's service stayed 0)."""
    gmax = GMAX(fairness=0.5)
    b = PolicyBridge(gmax, feedback=Feedback("token"), clock=lambda: 100.0)
    run(b, request("a", EngineTags(BATCH, tenant="acme"), 100.0, prompt=10), [(100.5, 4)], 101.0)
    run(b, request("b", EngineTags(BATCH, tenant="zeta"), 100.0, prompt=10), [], 101.0)
    assert gmax.service.attained == {"acme": 15.0, "zeta": 11.0}  # prompt + output, each finish
