"""The openai client's ``tools`` call through router and sidecar to engine-sim, streamed and not: the
engine's tool call must arrive intact (issue 17); in engine mode (router -> engine, issue 14) also the
non-streamed answer, which the proxy-mode sidecar still rebuilds from text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.engine_sim.server import serve_engine_sim
from slo_lab.fakepod import ServedApp
from slo_router.app import build_state, create_app
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.statefeed import StateFeed
from slo_router.tenants import KeyStore, Tenant
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar

CHAT = SLOTier("chat", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=5.0, tbt_s=1.0)
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
CHOICE: Any = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
async def urls() -> AsyncIterator[dict[str, str]]:
    async with serve_engine_sim(speedup=50) as sim:
        config = PolicyConfig(tiers={"chat": CHAT}, default_tier="chat", max_wait_s=10)
        sc = Sidecar(knobs=SidecarKnobs(), config=config, engine_url=sim.url, estimator=FallbackEstimator())
        async with running_sidecar(sc, grpc_port=0) as run:
            ep = EndpointState(
                EndpointSpec("p0", run.http_url, grpc_target=run.grpc_target, models=(sim.model,))
            )
            rconfig = RouterConfig(
                tiers={"chat": CHAT}, default_tier="chat", tenants={"t": Tenant("t", ("chat",), "chat")}
            )
            state = build_state(rconfig, KeyStore({"sk": "t"}), {"p0": ep})
            feed = StateFeed(state.endpoints, interval_ms=50)
            # engine mode: a second router sends to the engine itself (the sidecar only serves state)
            direct = EndpointState(
                EndpointSpec("p0", sim.url, grpc_target=run.grpc_target, models=(sim.model,), mode="engine")
            )
            estate = build_state(rconfig, KeyStore({"sk": "t"}), {"p0": direct})
            efeed = StateFeed(estate.endpoints, interval_ms=50)
            async with (
                ServedApp(create_app(state, background=[lambda s: feed.run(poll_s=0.05)])) as router,
                ServedApp(create_app(estate, background=[lambda s: efeed.run(poll_s=0.05)])) as erouter,
            ):
                for _ in range(200):
                    if ep.usable and direct.usable:
                        break
                    await asyncio.sleep(0.05)
                yield {
                    "engine": sim.url,
                    "sidecar": run.http_url,
                    "router": router.url,
                    "router-engine-mode": erouter.url,
                    "model": sim.model,
                }


async def _tool_call(url: str, model: str, *, stream: bool) -> tuple[str, str, str]:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="sk", max_retries=0, timeout=30)
    try:
        if not stream:
            out = await client.chat.completions.create(
                model=model, messages=MESSAGES, tools=TOOLS, tool_choice=CHOICE, max_tokens=16
            )
            calls = out.choices[0].message.tool_calls or []
            assert len(calls) == 1, out
            fn = calls[0].function  # type: ignore[union-attr]
            return calls[0].id, fn.name, fn.arguments
        chunks = await client.chat.completions.create(
            model=model, messages=MESSAGES, tools=TOOLS, tool_choice=CHOICE, max_tokens=16, stream=True
        )
        call_id, name, args = "", "", ""
        async for chunk in chunks:
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or []:
                    call_id = tc.id or call_id
                    if tc.function is not None:
                        name = tc.function.name or name
                        args += tc.function.arguments or ""
        return call_id, name, args
    finally:
        await client.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_sim_answers_a_named_tool_choice_with_a_tool_call(
    urls: dict[str, str], stream: bool
) -> None:
    call_id, name, args = await _tool_call(urls["engine"], urls["model"], stream=stream)
    assert call_id and name == "get_weather"
    assert set(json.loads(args)) == {"city", "days"}


@pytest.mark.parametrize(
    ("door", "stream"),
    [
        ("sidecar", False),
        ("router", False),
        ("sidecar", True),
        ("router", True),
        # engine mode: no sidecar in the path, the engine's own response passes through
        ("router-engine-mode", False),
        ("router-engine-mode", True),
    ],
)
async def test_the_tool_call_arrives_intact_through_the_front_doors(
    urls: dict[str, str], door: str, stream: bool
) -> None:
    direct = await _tool_call(urls["engine"], urls["model"], stream=stream)
    through = await _tool_call(urls[door], urls["model"], stream=stream)
    assert through[1:] == direct[1:]  # the same function and arguments (ids are per response)
    assert through[0]


async def test_a_non_streamed_answer_is_the_engines_body_and_is_accounted(urls: dict[str, str]) -> None:
    """The sidecar passes the engine's non-streamed body through (every field it sent) and still counts
    the request's tokens from the body's usage."""
    import httpx

    body = {"model": urls["model"], "messages": MESSAGES, "tools": TOOLS, "tool_choice": CHOICE,
            "max_tokens": 16, "logprobs": True}  # fmt: skip
    async with httpx.AsyncClient(timeout=30) as http:
        direct = (await http.post(urls["engine"] + "/v1/chat/completions", json=body)).json()
        got = (await http.post(urls["sidecar"] + "/v1/chat/completions", json=body)).json()
        metrics = (await http.get(urls["sidecar"] + "/metrics")).text
    assert got.keys() == direct.keys() and got["choices"][0].keys() == direct["choices"][0].keys()
    assert got["choices"][0]["message"] == direct["choices"][0]["message"] | {
        "tool_calls": got["choices"][0]["message"]["tool_calls"]  # call ids are per response
    }
    assert got["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    n = got["usage"]["completion_tokens"]
    assert n > 0
    assert f'slofleet_sidecar_output_tokens_total{{priority_class="high",tier="chat"}} {float(n)}' in metrics
