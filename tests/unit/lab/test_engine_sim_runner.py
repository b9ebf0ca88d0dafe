"""engine-sim's engine task and policy hook: SLO tags reach the policy, decisions are applied,
failures and a silent analyzer degrade to stock order, vLLM's priority mode orders the queue."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags
from slo_lab.engine_sim.protocol import decode_xargs
from slo_lab.engine_sim.runner import EngineRunner, Handle, Submission
from slo_lab.engine_sim.settings import EngineSimSettings


class Recorder(BaseEnginePolicy):
    """Admits in arrival order and remembers every snapshot it was shown."""

    name = "recorder"

    def __init__(self, reject: bool = False, fail: bool = False) -> None:
        self.views: dict[str, RequestView] = {}
        self.calls = 0
        self.reject = reject
        self.fail = fail

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        self.calls += 1
        if self.fail:
            raise RuntimeError("policy bug")
        for v in (*waiting, *running):
            self.views[v.request_id] = v
        if self.reject:
            return Decision(reject=tuple(v.request_id for v in waiting), reason="infeasible")
        return Decision(admit=tuple(v.request_id for v in waiting))


class FakeAnalyzer:
    def __init__(self, bounds: dict[str, int] | None) -> None:
        self.bounds = bounds
        self.closed = False

    def bounds_if_fresh(self, stale_after_s: float) -> dict[str, int] | None:
        return self.bounds

    def close(self) -> None:
        self.closed = True


async def _drain(h: Handle, timeout_s: float = 10.0) -> tuple[int, str, list[float]]:
    total, times = 0, []
    while True:
        n, t, reason = await asyncio.wait_for(h.events.get(), timeout_s)
        total += n
        times += [t] * n
        if reason is not None:
            return total, reason, times


@pytest.fixture
async def make_runner() -> AsyncIterator:
    runners: list[EngineRunner] = []

    async def make(**kwargs: object) -> EngineRunner:
        policy = kwargs.pop("policy", None)
        if isinstance(policy, str):  # a registry name goes through the settings, as on the CLI
            kwargs["policy"], policy = policy, None
        analyzer = kwargs.pop("analyzer", None)
        settings = EngineSimSettings(**{"speedup": 100, **kwargs})
        runner = EngineRunner(settings, policy=policy, analyzer=analyzer)
        await runner.start()
        runners.append(runner)
        return runner

    yield make
    for r in runners:
        await r.stop()


async def test_slo_tags_from_vllm_xargs_reach_the_policy_snapshot(make_runner) -> None:
    recorder = Recorder()
    runner = await make_runner(policy=recorder)
    deadline_at = time.time() + 30
    xargs = EngineTags(
        targets=SLOTargets(RequestKind.COMPOUND, deadline_s=40.0, priority_class="gold", priority_weight=3.0),
        request_key="key-1",
        tenant="acme",
        deadline_at_s=deadline_at,
        output_bound=77,
        program_id="prog-9",
        stage=2,
    ).to_xargs()
    h = runner.submit(Submission("r1", 20, 5, 5, decode_xargs(xargs)))
    assert await _drain(h) == (5, "length", pytest.approx(h.sim.token_times))
    v = recorder.views["r1"]
    assert v.slo.kind is RequestKind.COMPOUND and v.slo.deadline_s == 40.0
    assert v.slo.priority_class == "gold" and v.priority_weight == 3.0
    assert v.tenant == "acme" and v.output_bound == 77
    assert v.deadline_at_s == pytest.approx(deadline_at)
    assert v.program_id == "prog-9" and v.stage == 2
    assert v.prompt_tokens == 20 and v.max_tokens == 5


async def test_untagged_requests_are_best_effort_with_the_default_deadline(make_runner) -> None:
    recorder = Recorder()
    runner = await make_runner(policy=recorder)
    h = runner.submit(Submission("plain", 8, 3, 10))
    assert (await _drain(h))[:2] == (3, "stop")
    v = recorder.views["plain"]
    assert v.slo.kind is RequestKind.BEST_EFFORT
    assert v.deadline_at_s == pytest.approx(v.arrival_s + v.slo.effective_deadline_s)


async def test_policy_rejection_ends_the_request_as_abort(make_runner) -> None:
    runner = await make_runner(policy=Recorder(reject=True))
    h = runner.submit(Submission("doomed", 8, 3, 3))
    total, reason, _ = await _drain(h)
    assert (total, reason) == (0, "abort")
    assert runner.rejected == 1 and not runner.live
    assert runner.engine.free_blocks == runner.engine.kv_blocks_total


async def test_a_failing_policy_degrades_to_stock_order_and_still_serves(make_runner) -> None:
    runner = await make_runner(policy=Recorder(fail=True))
    handles = [runner.submit(Submission(f"r{i}", 8, 4, 4)) for i in range(3)]
    results = [await _drain(h) for h in handles]
    assert [r[:2] for r in results] == [(4, "length")] * 3
    assert runner.policy.degraded_reason.startswith("policy error")


async def test_analyzer_bounds_replace_the_tagged_bound_by_request_key(make_runner) -> None:
    recorder = Recorder()
    analyzer = FakeAnalyzer({"key-1": 123})
    runner = await make_runner(policy=recorder, analyzer=analyzer)
    tags = EngineTags(targets=SLOTargets(RequestKind.BEST_EFFORT), request_key="key-1", output_bound=9)
    h = runner.submit(Submission("r1", 8, 4, 200, tags))
    await _drain(h)
    assert recorder.views["r1"].output_bound == 123


async def test_a_silent_analyzer_means_stock_order_not_a_stall(make_runner) -> None:
    recorder = Recorder()
    runner = await make_runner(policy=recorder, analyzer=FakeAnalyzer(None))
    h = runner.submit(Submission("r1", 8, 4, 4))
    assert (await _drain(h))[:2] == (4, "length")
    assert recorder.calls == 0
    assert runner.policy.degraded_reason == "analyzer unreachable"


async def test_priority_scheduling_orders_the_waiting_queue(make_runner) -> None:
    runner = await make_runner(scheduling_policy="priority", max_num_seqs=1)
    first = runner.submit(Submission("first", 8, 50, 50))
    await first.events.get()  # running now; the next two queue behind it
    low = runner.submit(Submission("low", 8, 3, 3, priority=5))
    high = runner.submit(Submission("high", 8, 3, 3, priority=-1))
    _, _, low_times = await _drain(low)
    _, _, high_times = await _drain(high)
    assert high_times[0] < low_times[0]


async def test_fcfs_ignores_priority(make_runner) -> None:
    runner = await make_runner(max_num_seqs=1)
    first = runner.submit(Submission("first", 8, 50, 50))
    await first.events.get()
    early = runner.submit(Submission("early", 8, 3, 3, priority=5))
    late = runner.submit(Submission("late", 8, 3, 3, priority=-1))
    assert (await _drain(early))[2][0] < (await _drain(late))[2][0]


async def test_stop_ends_every_live_request(make_runner) -> None:
    runner = await make_runner(max_num_seqs=1, speedup=1)
    handles = [runner.submit(Submission(f"r{i}", 8, 4000, 4000)) for i in range(2)]
    await handles[0].events.get()
    await runner.stop()
    assert [(await _drain(h))[1] for h in handles] == ["abort", "abort"]


async def test_registry_policies_run_inside_the_engine(make_runner) -> None:
    runner = await make_runner(policy="gmax")
    tags = decode_xargs(
        EngineTags(targets=SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.1), request_key="a").to_xargs()
    )
    handles = [runner.submit(Submission(f"g{i}", 30, 6, 6, tags if i % 2 else None)) for i in range(6)]
    assert [(await _drain(h))[:2] for h in handles] == [(6, "length")] * 6
    assert runner.policy.name == "gmax" and runner.policy.decisions > 0


async def test_engine_sim_builds_its_policy_with_the_objective(make_runner) -> None:  # type: ignore[no-untyped-def]
    runner = await make_runner(policy="gmax", objective={"goodput": "tdg", "fairness": 0.5})
    inner = runner.policy.inner
    assert inner.params.goodput == "tdg" and inner.params.fairness == 0.5
