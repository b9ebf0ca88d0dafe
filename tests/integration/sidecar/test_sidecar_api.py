"""The sidecar's OpenAI front driven by the official openai client over loopback: answers, SLO fields,
metrics, and every kind of bad input or failure ending in a clear error (never a hang)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.fake_engine import FakeEngine, serve_fake_engine
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import Running, running_sidecar
from slo_sidecar.service import Sidecar

GOLD = SLOTier("gold", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=2.0, tbt_s=0.5)
BATCH = SLOTier("batch", RequestKind.DEADLINE, PriorityClass("low", 1.0), deadline_s=30.0)
CONFIG = PolicyConfig(tiers={"gold": GOLD, "batch": BATCH}, default_tier="gold", max_wait_s=5.0)


@dataclass
class Stack:
    eng: FakeEngine
    run: Running
    client: AsyncOpenAI
    http: httpx.AsyncClient

    async def metric(self, name: str, **labels: str) -> float:
        text = (await self.http.get(self.run.http_url + "/metrics")).text
        total = 0.0
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    eng = FakeEngine()
    async with serve_fake_engine(eng) as url:
        knobs = SidecarKnobs(max_prompt_tokens=200, max_context_tokens=1000, drain_timeout_s=2)
        sc = Sidecar(knobs=knobs, config=CONFIG, engine_url=url, estimator=FallbackEstimator())
        async with running_sidecar(sc, grpc_port=None) as run, httpx.AsyncClient(timeout=10) as http:
            client = AsyncOpenAI(base_url=run.http_url + "/v1", api_key="unused", max_retries=0, timeout=10)
            yield Stack(eng, run, client, http)
            await client.close()


async def test_completions_and_chat_stream_and_not_with_slo_fields(stack: Stack) -> None:
    c, model = stack.client, stack.eng.model
    done = await c.completions.create(
        model=model,
        prompt="tell me a story",
        max_tokens=12,
        extra_body={"ignore_eos": True, "slo": {"tier": "batch"}},
    )
    assert done.usage is not None and done.usage.completion_tokens == 12
    assert done.choices[0].text.split() == [f"w{i}" for i in range(12)]
    assert done.choices[0].finish_reason == "length"

    chat = await c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        extra_body={"ignore_eos": True, "target_ttft": 1.5, "target_tbt": 0.2},
    )  # fmt: skip
    assert chat.choices[0].message.content is not None and len(chat.choices[0].message.content.split()) == 5
    assert chat.usage is not None and chat.usage.completion_tokens == 5

    stream = await c.completions.create(
        model=model, prompt="stream it", max_tokens=8, stream=True, stream_options={"include_usage": True},
        extra_headers={"x-slo-tier": "gold", "x-slo-ttft-s": "1"}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    texts, usage = [], None
    async for chunk in stream:
        texts += [ch.text for ch in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(texts).split() == [f"w{i}" for i in range(8)]
    assert usage is not None and usage.completion_tokens == 8

    chat_stream = await c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=6, stream=True,
        extra_body={"ignore_eos": True, "slo": {"tier": "batch", "deadline_s": 20}},
    )  # fmt: skip
    pieces = [ch.choices[0].delta.content or "" async for ch in chat_stream if ch.choices]
    assert "".join(pieces).split() == [f"w{i}" for i in range(6)]

    # the SLO fields never reach the engine; streamed calls stream with usage for the tracker, and
    # non-streamed ones are sent non-streamed (the engine's body is passed through)
    assert all("slo" not in b and "target_ttft" not in b for b in stack.eng.bodies)
    streamed = [b for b in stack.eng.bodies if b["stream"]]
    assert streamed and all(b["stream_options"]["include_usage"] is True for b in streamed)
    assert any(not b["stream"] and "stream_options" not in b for b in stack.eng.bodies)

    assert await stack.metric("slofleet_sidecar_requests_total", tier="batch", outcome="ok") == 2
    assert await stack.metric("slofleet_sidecar_requests_total", tier="gold", outcome="ok") == 2
    assert await stack.metric("slofleet_sidecar_output_tokens_total") == 12 + 5 + 8 + 6
    assert await stack.metric("slofleet_sidecar_ttft_seconds_count", tier="gold", priority_class="high") == 2
    assert await stack.metric("slofleet_sidecar_slo_met_total", tier="batch") == 2
    assert await stack.metric("slofleet_sidecar_goodput_earned_tokens_total", tier="gold") > 0
    assert await stack.metric("slofleet_sidecar_predictor_bound_ratio_count") == 4
    health = (await stack.http.get(stack.run.http_url + "/health")).json()
    assert health["history_rows"] == 4 and health["config_error"] is None


BAD_INPUTS = [
    (b'{"model": "fake-model", "prompt": "x",', {}, None, "not valid JSON"),
    (b'{"model": "fake-model", "prompt": "x", "max_tokens": "ten"}', {}, "max_tokens", "positive integer"),
    (b'{"model": "fake-model", "prompt": "x", "stream": "yes"}', {}, "stream", "true or false"),
    (b'{"model": 7, "prompt": "x"}', {}, "model", "'model' is required"),
    (b'{"model": "fake-model", "prompt": "x", "deadline": -3}', {}, "body field 'deadline'",
     "greater than 0"),
    (b'{"model": "fake-model", "prompt": "x"}', {"x-slo-deadline-s": "soon"}, "header x-slo-deadline-s",
     "valid number"),
    (b'{"model": "fake-model", "prompt": "x", "slo": {"tier": "platinum"}}', {}, "tier", "choose one of"),
    (b'{"model": "fake-model", "prompt": "x", "slo": {"priority": 1}}', {}, "body field 'slo.priority'",
     "unknown SLO field"),
    (b'{"model": "fake-model", "prompt": "' + b"word " * 300 + b'"}', {}, "prompt", "shorten the prompt"),
    (b'{"model": "fake-model", "prompt": "x", "max_tokens": 5000}', {}, "max_tokens", "lower max_tokens"),
    (b'{"model": "fake-model", "prompt": "x", "n": 3}', {}, "n", "'n' must be 1"),
]  # fmt: skip


async def test_bad_input_gets_a_400_saying_what_to_change(stack: Stack) -> None:
    for body, headers, param, says in BAD_INPUTS:
        r = await stack.http.post(
            stack.run.http_url + "/v1/completions",
            content=body,
            headers={"content-type": "application/json", **headers},
        )
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert says in err["message"] and err["type"] == "invalid_request_error", err
        if param is not None:
            assert err["param"] == param
    assert stack.eng.started == 0
    assert await stack.metric("slofleet_sidecar_rejects_total") == len(BAD_INPUTS)


async def test_engine_errors_reach_the_client_as_the_engine_said_them(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await stack.client.completions.create(model="other-model", prompt="x", max_tokens=3)


async def test_client_disconnect_mid_stream_aborts_upstream(stack: Stack) -> None:
    stack.eng.tbt_s = 0.05
    body = {
        "model": stack.eng.model,
        "prompt": "long one",
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    async with stack.http.stream("POST", stack.run.http_url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                break
    for _ in range(500):
        if stack.eng.aborted == 1:
            break
        await asyncio.sleep(0.02)
    assert stack.eng.aborted == 1 and stack.eng.finished == 0
    assert stack.eng.generated_tokens < 500
    for _ in range(500):
        if await stack.metric("slofleet_sidecar_requests_total", outcome="aborted") == 1:
            break
        await asyncio.sleep(0.02)
    assert await stack.metric("slofleet_sidecar_requests_total", outcome="aborted") == 1
    assert not stack.run.sidecar.jobs


async def test_engine_dying_mid_stream_ends_the_stream_with_an_error_event(stack: Stack) -> None:
    stack.eng.fail_after_tokens = 3
    stream = await stack.client.completions.create(
        model=stack.eng.model, prompt="x", max_tokens=10, stream=True, extra_body={"ignore_eos": True}
    )
    got = []
    with pytest.raises(openai.APIError, match="engine failed"):
        async for chunk in stream:
            got += [ch.text for ch in chunk.choices]
    assert len(got) == 3
    with pytest.raises(openai.APIStatusError) as info:  # before the first token: a 503 with Retry-After
        stack.eng.fail_after_tokens = 0
        await stack.client.completions.create(model=stack.eng.model, prompt="y", max_tokens=10)
    assert info.value.status_code == 503 and info.value.response.headers["retry-after"]
    assert await stack.metric("slofleet_sidecar_requests_total", outcome="error") == 1
    assert await stack.metric("slofleet_sidecar_requests_total", outcome="rejected") == 1


async def test_engine_down_means_503_with_retry_after_and_not_ready(stack: Stack) -> None:
    stack.eng.healthy = False
    for _ in range(300):
        if not stack.run.sidecar.engine.healthy:
            break
        await asyncio.sleep(0.05)
    ready = await stack.http.get(stack.run.http_url + "/ready")
    assert ready.status_code == 503
    r = await stack.http.post(
        stack.run.http_url + "/v1/completions", json={"model": stack.eng.model, "prompt": "x"}
    )
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "engine_unavailable"


async def test_vllms_own_metrics_are_relayed_and_a_dead_engine_is_a_clear_502(stack: Stack) -> None:
    resp = await stack.http.get(stack.run.http_url + "/metrics/engine")
    assert resp.status_code == 200
    names = {s.name for fam in text_string_to_metric_families(resp.text) for s in fam.samples}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting"} <= names
    stack.run.sidecar.engine_url = "http://127.0.0.1:9"  # nothing listens there
    resp = await stack.http.get(stack.run.http_url + "/metrics/engine")
    assert resp.status_code == 502 and "engine metrics unavailable" in resp.text


async def test_a_non_streamed_answer_may_take_longer_than_the_silence_timeout() -> None:
    """The engine says nothing until a non-streamed answer is whole: the read timeout (silence between
    streamed chunks) must not cut it (it did, live: 503s the simulator never gives)."""
    eng = FakeEngine(ttft_s=0.3, tbt_s=0.1)
    async with serve_fake_engine(eng) as url:
        knobs = SidecarKnobs(upstream_read_timeout_s=0.5)
        sc = Sidecar(knobs=knobs, config=CONFIG, engine_url=url, estimator=FallbackEstimator())
        async with running_sidecar(sc, grpc_port=None) as run:
            client = AsyncOpenAI(base_url=run.http_url + "/v1", api_key="unused", max_retries=0, timeout=30)
            done = await client.completions.create(
                model=eng.model, prompt="x", max_tokens=8, extra_body={"ignore_eos": True}
            )
            await client.close()
    assert done.usage is not None and done.usage.completion_tokens == 8
