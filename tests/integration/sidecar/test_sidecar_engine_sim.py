"""The sidecar in front of engine-sim, driven by the unchanged openai client: proxy mode (answers, usage,
SLO metrics, engine-side counts agree) and engine mode (SLO tags in vllm_xargs, bounds over gRPC)."""

from __future__ import annotations

import asyncio
import socket

import httpx
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.engine_sim.server import serve_engine_sim
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar

CHAT = SLOTier("chat", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=2.0, tbt_s=0.2)
BATCH = SLOTier("batch", RequestKind.DEADLINE, PriorityClass("low", 1.0), deadline_s=60.0)
CONFIG = PolicyConfig(tiers={"chat": CHAT, "batch": BATCH}, default_tier="chat", max_wait_s=30)


def metric(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def test_openai_client_through_the_sidecar_to_engine_sim() -> None:
    async with serve_engine_sim(speedup=20) as sim:
        sc = Sidecar(knobs=SidecarKnobs(), config=CONFIG, engine_url=sim.url, estimator=FallbackEstimator())
        async with running_sidecar(sc, grpc_port=None) as run, httpx.AsyncClient() as http:
            client = AsyncOpenAI(base_url=run.http_url + "/v1", api_key="unused", max_retries=0, timeout=30)
            models = await client.models.list()
            assert [m.id for m in models.data] == [sim.model]

            done = await client.completions.create(
                model=sim.model, prompt="Explain KV caches.", max_tokens=24,
                extra_body={"ignore_eos": True, "slo": {"tier": "batch", "deadline_s": 30}},
            )  # fmt: skip
            assert done.usage is not None and done.usage.completion_tokens == 24
            assert len(done.choices[0].text.split()) == 24

            chat = await client.chat.completions.create(
                model=sim.model, messages=[{"role": "user", "content": "Hi there"}], max_tokens=16,
                extra_headers={"x-slo-ttft-s": "1.5"}, extra_body={"ignore_eos": True},
            )  # fmt: skip
            assert chat.usage is not None and chat.usage.completion_tokens == 16

            stream = await client.chat.completions.create(
                model=sim.model, messages=[{"role": "user", "content": "Stream please"}], max_tokens=20,
                stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True, "target_tbt": 0.5},
            )  # fmt: skip
            pieces, usage = [], None
            async for chunk in stream:
                pieces += [c.delta.content or "" for c in chunk.choices]
                usage = chunk.usage or usage
            assert usage is not None and usage.completion_tokens == 20
            assert len("".join(pieces).split()) == 20

            natural = await client.completions.create(
                model=sim.model, prompt="Tell me anything.", max_tokens=300
            )
            assert natural.usage is not None and 1 <= natural.usage.completion_tokens <= 300
            await client.close()

            mine = (await http.get(run.http_url + "/metrics")).text
            engine = (await http.get(sim.url + "/metrics")).text
    tokens = 24 + 16 + 20 + natural.usage.completion_tokens
    assert metric(mine, "slofleet_sidecar_requests_total", outcome="ok") == 4
    assert metric(mine, "slofleet_sidecar_output_tokens_total") == tokens
    assert metric(engine, "vllm:generation_tokens_total") == tokens
    assert metric(engine, "vllm:request_success_total") == 4
    assert metric(mine, "slofleet_sidecar_ttft_seconds_count", tier="chat") == 3
    assert metric(mine, "slofleet_sidecar_tbt_seconds_count", tier="chat") == 3
    assert metric(mine, "slofleet_sidecar_e2e_seconds_count", tier="batch", priority_class="low") == 1
    assert (
        metric(mine, "slofleet_sidecar_slo_met_total") + metric(mine, "slofleet_sidecar_slo_missed_total")
        == 4
    )
    assert metric(mine, "slofleet_sidecar_goodput_earned_tokens_total", tier="batch") > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_engine_mode_tags_requests_and_serves_their_bounds_to_the_engine() -> None:
    grpc_port = _free_port()
    async with serve_engine_sim(
        speedup=0.5, policy="edf", analyzer=f"127.0.0.1:{grpc_port}", analyzer_interval_s=0.05
    ) as sim:
        sc = Sidecar(
            knobs=SidecarKnobs(mode="engine"),
            config=CONFIG,
            engine_url=sim.url,
            estimator=FallbackEstimator(),
        )
        async with running_sidecar(sc, grpc_port=grpc_port) as run, httpx.AsyncClient(timeout=30) as http:
            body = {"model": sim.model, "prompt": "a long one", "max_tokens": 120, "ignore_eos": True}
            call = asyncio.create_task(
                http.post(run.http_url + "/v1/completions", json=body, headers={"x-slo-tier": "batch"})
            )
            while not sim.runner.live:
                await asyncio.sleep(0.01)
            handle = next(iter(sim.runner.live.values()))
            tags = handle.sub.tags
            assert tags is not None and tags.targets.kind is RequestKind.DEADLINE
            key = next(iter(sc.jobs))
            bound = sc.jobs[key].live.bound  # 120: the cap (refinement cannot move it)
            assert tags.request_key == key and tags.targets.priority_weight == 1.0
            assert (
                tags.deadline_at_s is not None
                and abs(tags.deadline_at_s - sc.tracker.unix(sc.jobs[key].live.deadline_at_s)) < 1e-3
            )
            fresh = None
            for _ in range(500):
                fresh = sim.runner.analyzer.bounds_if_fresh(5.0)
                if fresh and key in fresh:
                    break
                await asyncio.sleep(0.02)
            assert fresh is not None and fresh[key] == bound == 120
            answer = await call
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 120
