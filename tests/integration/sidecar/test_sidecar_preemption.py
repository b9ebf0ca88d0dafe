"""Proxy-mode scheduling against a live engine: the policy's order decides release, and a preempted
request is aborted upstream and resumed as a continuation (prompt + generated text), unseen by its client."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence

import httpx

from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView
from slo_core.policies.registry import engine_policy_names, make_engine_policy
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.fake_engine import FakeEngine, serve_fake_engine
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar

HIGH = SLOTier("high", RequestKind.LATENCY, PriorityClass("high", 8.0), ttft_s=1.0, tbt_s=0.5)
LOW = SLOTier("low", RequestKind.BEST_EFFORT, PriorityClass("low", 1.0))


class HeaviestFirst(BaseEnginePolicy):
    """Admit by priority weight; preempt a running request once a heavier one waits (test policy)."""

    name = "heaviest-first"

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        order = sorted(waiting, key=lambda r: (-r.priority_weight, r.arrival_s))
        heaviest = order[0].priority_weight if order else 0.0
        preempt = tuple(r.request_id for r in running if r.priority_weight < heaviest)
        return Decision(admit=tuple(r.request_id for r in order), preempt=preempt)


async def test_preempted_request_resumes_as_a_continuation_and_its_client_sees_one_answer() -> None:
    eng = FakeEngine(ttft_s=0.005, tbt_s=0.02)
    async with serve_fake_engine(eng) as url:
        config = PolicyConfig(tiers={"high": HIGH, "low": LOW}, default_tier="low")
        knobs = SidecarKnobs(max_running=1, engine_priority=True)
        sc = Sidecar(knobs=knobs, config=config, engine_url=url, estimator=FallbackEstimator())
        sc.scheduler.set_policy(HeaviestFirst())
        async with running_sidecar(sc, grpc_port=None) as run, httpx.AsyncClient(timeout=30) as http:

            async def ask(tier: str, prompt: str, n: int) -> httpx.Response:
                body = {"model": eng.model, "prompt": prompt, "max_tokens": n, "ignore_eos": True}
                return await http.post(
                    run.http_url + "/v1/completions", json=body, headers={"x-slo-tier": tier}
                )

            async def stream(tier: str, prompt: str, n: int) -> list[dict[str, object]]:
                body = {"model": eng.model, "prompt": prompt, "max_tokens": n, "ignore_eos": True,
                        "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
                url, hdrs = run.http_url + "/v1/completions", {"x-slo-tier": tier}
                async with http.stream("POST", url, json=body, headers=hdrs) as r:
                    assert r.status_code == 200
                    lines = [line async for line in r.aiter_lines() if line.startswith("data: {")]
                return [json.loads(line[6:]) for line in lines]

            # a streamed request is preempted and resumed (a non-streamed one gets the engine's own
            # body passed through, so it is never spliced: it keeps its seat)
            low = asyncio.create_task(stream("low", "a long low priority story", 30))
            while not sc.jobs or next(iter(sc.jobs.values())).live.generated_tokens < 3:
                await asyncio.sleep(0.01)
            high = asyncio.create_task(ask("high", "urgent", 5))
            high_answer, low_chunks = await asyncio.wait_for(asyncio.gather(high, low), timeout=20)

    assert high_answer.status_code == 200
    assert low_chunks[-1]["usage"]["completion_tokens"] == 30  # type: ignore[index]
    text = "".join(str(c["text"]) for ch in low_chunks for c in ch["choices"])  # type: ignore[attr-defined]
    assert len(text.split()) == 30
    assert len({ch["id"] for ch in low_chunks}) == 1  # one stream id across the preemption
    assert eng.started == 3 and eng.aborted == 1 and eng.finished == 2  # low: aborted once, then resumed
    first, urgent, resumed = eng.bodies
    assert urgent["prompt"] == "urgent" and urgent["priority"] == 0
    done = 30 - resumed["max_tokens"]
    assert done >= 3 and resumed["prompt"].startswith(first["prompt"] + " w0 w1 w2")
    assert len(resumed["prompt"].split()) == len(first["prompt"].split()) + done
    assert sc.history.rows[-1]["preemptions"] == 1


async def test_every_registered_engine_policy_serves_mixed_tiers_in_proxy_mode() -> None:
    tiers = {
        "gold": SLOTier("gold", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=1.0, tbt_s=0.05),
        "silver": SLOTier("silver", RequestKind.DEADLINE, PriorityClass("mid", 2.0), deadline_s=5.0),
        "flow": SLOTier("flow", RequestKind.COMPOUND, PriorityClass("low", 1.0), deadline_s=20.0),
        "bronze": LOW,
    }
    eng = FakeEngine(ttft_s=0.002, tbt_s=0.002)
    async with serve_fake_engine(eng) as url:
        sc = Sidecar(
            knobs=SidecarKnobs(max_running=3),
            config=PolicyConfig(tiers=tiers, default_tier="bronze"),
            engine_url=url,
            estimator=FallbackEstimator(),
        )
        async with running_sidecar(sc, grpc_port=None) as run, httpx.AsyncClient(timeout=30) as http:

            async def ask(i: int) -> int:
                tier = list(tiers)[i % 4]
                slo: dict[str, object] = {"tier": tier}
                if tier == "flow":
                    slo.update(program_id=f"p{i % 2}", stage=i // 8)
                body = {
                    "model": eng.model,
                    "prompt": f"q{i}",
                    "max_tokens": 8,
                    "ignore_eos": True,
                    "slo": slo,
                }
                r = await http.post(run.http_url + "/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return int(r.json()["usage"]["completion_tokens"])

            for name in engine_policy_names():
                sc.scheduler.set_policy(make_engine_policy(name))
                tokens = await asyncio.wait_for(asyncio.gather(*(ask(i) for i in range(12))), timeout=30)
                assert tokens == [8] * 12, name
                assert sc.scheduler.policy_errors == 0, name
