"""engine-sim over loopback: clear 4xx errors, /metrics counters, client-disconnect aborts, queueing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slo_lab.engine_sim import EngineSimServer, serve_engine_sim


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))
            out[(s.name, labels)] = s.value
    return out


async def _metrics(sim: EngineSimServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        return _samples((await http.get("/metrics")).text)


async def _until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.fixture
async def sim() -> AsyncIterator[EngineSimServer]:
    async with serve_engine_sim(speedup=50, max_model_len=256) as server:
        yield server


LONG = " ".join(["word"] * 300)


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("/v1/completions", {"prompt": LONG, "max_tokens": 3}, 400, "maximum context length"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 300}, 400, "cannot be greater than max_model_len"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 255}, 400, "Reduce max_tokens to at most 254"),
        ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n=1"),
        ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream=True"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "one prompt per request"),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404, "does not exist"),
        ("/v1/completions", {"prompt": "hi", "vllm_xargs": {"slo_kind": "urgent"}}, 400, "vllm_xargs"),
        ("/v1/completions", {"prompt": "hi", "vllm_xargs": {"slo_kind": "latency"}}, 400, "ttft_s"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
         "content parts"),
        ("/tokenize", {"prompt": 5}, 400, "string"),
        ("/tokenize", {}, 400, "exactly one of"),
    ],
)  # fmt: skip
async def test_bad_input_gets_openai_shaped_error(sim, path, body, status, says) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        if isinstance(body, bytes):
            reply = await http.post(path, content=body, headers={"content-type": "application/json"})
        else:
            reply = await http.post(path, json=body)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert says in error["message"]
    assert error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert set(error) == {"message", "type", "param", "code"}


async def test_openai_client_raises_bad_request_with_the_message(sim) -> None:
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await client.completions.create(model=sim.model, prompt=LONG, max_tokens=3)


async def test_metrics_count_tokens_and_finished_requests(sim) -> None:
    before = await _metrics(sim)
    # every finish reason is exported from the start (as vLLM does), so a reader sees zeros, not gaps
    assert before[("vllm:request_success_total", (("finished_reason", "abort"),))] == 0
    usages = []
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as client:
        for n in (5, 9):
            out = await client.completions.create(
                model=sim.model, prompt=f"count to {n}", max_tokens=n, extra_body={"ignore_eos": True}
            )
            usages.append(out.usage)
    m = await _metrics(sim)
    assert m[("vllm:prompt_tokens_total", ())] - before.get(("vllm:prompt_tokens_total", ()), 0) == sum(
        u.prompt_tokens for u in usages
    )
    assert m[("vllm:generation_tokens_total", ())] == 14
    assert m[("vllm:request_success_total", (("finished_reason", "length"),))] == 2
    assert m[("vllm:time_to_first_token_seconds_count", ())] == 2
    assert m[("vllm:e2e_request_latency_seconds_count", ())] == 2
    assert m[("vllm:inter_token_latency_seconds_count", ())] == 4 + 8
    assert m[("vllm:request_decode_time_seconds_count", ())] == 2
    assert m[("vllm:num_requests_running", ())] == 0
    assert m[("vllm:num_requests_waiting", ())] == 0
    assert m[("vllm:kv_cache_usage_perc", ())] == 0.0
    blocks = sim.runner.engine.kv_blocks_total
    assert m[("vllm:cache_config_info", (("block_size", "16"), ("num_gpu_blocks", str(blocks))))] == 1


async def test_stream_disconnect_aborts_and_frees_kv() -> None:
    async with serve_engine_sim(speedup=2) as sim, httpx.AsyncClient(base_url=sim.url) as http:
        body = {"prompt": "tell me everything", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as reply:
            seen = 0
            async for line in reply.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    break
            mid = await _metrics(sim)
            assert mid[("vllm:num_requests_running", ())] == 1
            assert mid[("vllm:kv_cache_usage_perc", ())] > 0

        async def gone() -> bool:
            m = await _metrics(sim)
            return m[("vllm:num_requests_running", ())] == 0 and m[("vllm:kv_cache_usage_perc", ())] == 0

        assert await _until(gone)
        m = await _metrics(sim)
        assert m[("vllm:request_success_total", (("finished_reason", "abort"),))] == 1
        assert m[("slofleet_engine_sim_client_aborts_total", ())] == 1
        assert m[("vllm:generation_tokens_total", ())] < 200
        assert sim.runner.engine.free_blocks == sim.runner.engine.kv_blocks_total


async def test_queued_and_non_streaming_disconnects_leave_the_engine() -> None:
    async with (
        serve_engine_sim(speedup=2, max_num_seqs=1) as sim,
        httpx.AsyncClient(base_url=sim.url) as http,
    ):
        long = {"prompt": "first", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        async with http.stream("POST", "/v1/completions", json=long) as first:
            lines = first.aiter_lines()  # keep a reference: a collected iterator closes the stream
            await lines.__anext__()
            # a second, non-streaming request queues behind the first; its client gives up
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/completions", json={**long, "stream": False}, timeout=0.3)

            async def one_waiting_gone() -> bool:
                m = await _metrics(sim)
                return m[("vllm:num_requests_waiting", ())] == 0

            assert await _until(one_waiting_gone)
            m = await _metrics(sim)
            assert m[("vllm:num_requests_running", ())] == 1  # the first one is untouched
            assert m[("vllm:request_success_total", (("finished_reason", "abort"),))] == 1
        assert await _until(lambda: _no_live(sim))


async def _no_live(sim: EngineSimServer) -> bool:
    return not sim.runner.live


async def test_ttft_grows_with_the_queue() -> None:
    """One sequence at a time: each request waits for the ones before it (a timing sanity check)."""
    async with (
        serve_engine_sim(speedup=2, max_num_seqs=1) as sim,
        openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as client,
    ):

        async def ttft() -> float:
            t0 = time.perf_counter()
            stream = await client.completions.create(
                model=sim.model, prompt="q", max_tokens=40, stream=True, extra_body={"ignore_eos": True}
            )
            first = None
            async for _chunk in stream:
                first = first or time.perf_counter() - t0
            assert first is not None
            return first

        ttfts = sorted(await asyncio.gather(*(ttft() for _ in range(4))))
        # 40 decode steps of ~8 ms / 2 per request: the last waits for three whole requests
        per_request_s = 40 * sim.runner.profile.iteration_time_s([], [60])
        assert ttfts[-1] - ttfts[0] > 2 * per_request_s, (ttfts, per_request_s)


async def test_a_dead_engine_ends_live_requests_and_answers_503() -> None:
    async with serve_engine_sim(speedup=2) as sim, httpx.AsyncClient(base_url=sim.url) as http:
        body = {"prompt": "long", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as reply:
            lines = reply.aiter_lines()
            await lines.__anext__()

            def broken(now_s: float) -> float | None:
                raise RuntimeError("simulated engine crash")

            sim.runner.engine.plan = broken  # type: ignore[method-assign]
            rest = [line async for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][len("data: ") :])["choices"][0]["finish_reason"] == "abort"
        health = await http.get("/health")
        assert health.status_code == 503 and "simulated engine crash" in health.json()["error"]["message"]
        again = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert again.status_code == 503 and again.json()["error"]["type"] == "ServiceUnavailableError"
