"""engine-sim over loopback, driven by the official openai client and raw HTTP: shapes, usage, lengths."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from slo_lab.engine_sim import EngineSimServer, EngineSimThread, serve_engine_sim

PROMPT = "Explain, in two short sentences, why batching helps GPU throughput."


@pytest.fixture
async def sim() -> AsyncIterator[EngineSimServer]:
    async with serve_engine_sim(speedup=50) as server:
        yield server


@pytest.fixture
async def client(sim: EngineSimServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="unused", max_retries=0, timeout=20) as c:
        yield c


async def _count(sim: EngineSimServer, **body: object) -> int:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        reply = await http.post("/tokenize", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["count"] == len(data["tokens"])
    return int(data["count"])


async def test_completion_with_ignore_eos_has_exactly_max_tokens(sim, client) -> None:
    out = await client.completions.create(
        model=sim.model, prompt=PROMPT, max_tokens=37, extra_body={"ignore_eos": True}
    )
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert out.usage is not None
    assert out.usage.completion_tokens == 37
    assert out.usage.prompt_tokens == await _count(sim, prompt=PROMPT)
    assert out.usage.total_tokens == out.usage.prompt_tokens + 37
    # the generated text re-counts to the number of tokens generated
    assert await _count(sim, prompt=choice.text, add_special_tokens=False) == 37


async def test_streamed_chat_ends_with_usage_chunk_and_matches_non_streamed(sim, client) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    stream = await client.chat.completions.create(
        model=sim.model,
        messages=messages,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    # one chunk per token while the client keeps up (tokens that pile up are merged, as vLLM does)
    assert 1 <= sum(1 for text in content if text) <= 12
    assert await _count(sim, prompt="".join(content), add_special_tokens=False) == 12
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == 12
    assert usage.prompt_tokens == await _count(sim, messages=messages)
    whole = await client.chat.completions.create(
        model=sim.model, messages=messages, max_tokens=12, extra_body={"ignore_eos": True}
    )
    assert whole.choices[0].message.content == "".join(content)
    assert whole.usage is not None and whole.usage.prompt_tokens == usage.prompt_tokens


async def test_raw_sse_is_data_lines_ending_in_done(sim) -> None:
    body = {"model": sim.model, "prompt": PROMPT, "max_tokens": 3, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with (
        httpx.AsyncClient(base_url=sim.url) as http,
        http.stream("POST", "/v1/completions", json=body) as reply,
    ):
        assert reply.headers["content-type"].startswith("text/event-stream")
        raw = (await reply.aread()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert [p["object"] for p in payloads] == ["text_completion"] * 4
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 3
    assert payloads[2]["choices"][0]["finish_reason"] == "length"


async def test_natural_length_is_deterministic_and_capped(sim, client) -> None:
    lengths = []
    for _ in range(2):
        out = await client.completions.create(
            model=sim.model, prompt="Write a poem about queues.", max_tokens=4000
        )
        assert out.usage is not None
        lengths.append(out.usage.completion_tokens)
    assert lengths[0] == lengths[1] >= 1
    assert out.choices[0].finish_reason == ("length" if lengths[0] == 4000 else "stop")
    capped = await client.completions.create(
        model=sim.model, prompt="Write a poem about queues.", max_tokens=1
    )
    assert capped.usage is not None and capped.usage.completion_tokens == 1
    assert capped.choices[0].finish_reason == "length"


async def test_token_id_prompts_count_one_token_per_id(sim, client) -> None:
    out = await client.completions.create(
        model=sim.model, prompt=[1, 500, 501, 502], max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.prompt_tokens == 4


async def test_models_and_health(sim) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        models = (await http.get("/v1/models")).json()
        health = await http.get("/health")
    assert [m["id"] for m in models["data"]] == [sim.model]
    assert models["data"][0]["max_model_len"] == sim.runner.max_model_len
    assert health.status_code == 200


def test_engine_sim_in_a_thread_serves_a_sync_client() -> None:
    with EngineSimThread(speedup=50, max_num_seqs=4) as sim:
        with openai.OpenAI(base_url=sim.base_url, api_key="unused", max_retries=0, timeout=20) as client:
            out = client.completions.create(
                model=sim.model, prompt=PROMPT, max_tokens=5, extra_body={"ignore_eos": True}
            )
        assert out.usage is not None and out.usage.completion_tokens == 5
        assert httpx.get(sim.url + "/health").status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(sim.url + "/health", timeout=1)
