"""The official openai client through the router to pods on loopback: tiers, spoofing, limits, streams.

Pods are fake (OpenAI answers and a State stream, see slo_lab.fakepod); the router runs in-process
under uvicorn with its state-stream follower, as ``slofleet router`` runs it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.fakepod import FakePod, PodBehaviour, RunningPod, ServedApp
from slo_router.app import build_state, create_app
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.statefeed import StateFeed
from slo_router.tenants import KeyStore, Tenant

TIERS = {
    "chat": SLOTier("chat", RequestKind.LATENCY, PriorityClass("gold", 3.0), ttft_s=5.0, tbt_s=1.0),
    "batch": SLOTier("batch", RequestKind.DEADLINE, PriorityClass("bronze", 1.0), deadline_s=600.0),
}
TENANTS = {
    "product": Tenant("product", ("chat", "batch"), "chat"),
    "research": Tenant("research", ("batch",), "batch", requests_per_s=2.0),
}
KEYS = {"sk-product": "product", "sk-research": "research"}


async def until(cond: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def fleet(pods: list[FakePod], **cfg: Any) -> AsyncIterator[tuple[str, Any, list[RunningPod]]]:
    """Pods on loopback and a router over them; yields (router URL, router state, running pods)."""
    running = [RunningPod(p) for p in pods]
    for r in running:
        await r.__aenter__()
    endpoints = {
        r.pod.name: EndpointState(
            EndpointSpec(r.pod.name, r.url, grpc_target=r.grpc_target, models=r.pod.models)
        )
        for r in running
    }
    config = RouterConfig(tiers=TIERS, default_tier="batch", tenants=TENANTS, **cfg)
    state = build_state(config, KeyStore(KEYS), endpoints)
    feed = StateFeed(state.endpoints, interval_ms=20, backoff_s=(0.05, 0.2))
    try:
        async with ServedApp(create_app(state, background=[lambda s: feed.run(poll_s=0.02)])) as router:
            await until(lambda: all(e.usable for e in state.endpoints.values()))
            yield router.url, state, running
    finally:
        for r in running:
            await r.kill()


def client(url: str, key: str = "sk-product", **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, **kw)


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_tier_binding_spoofing_models_and_streaming() -> None:
    pods = [FakePod("a"), FakePod("b")]
    async with fleet(pods) as (url, _, _):
        product, research = client(url), client(url, "sk-research")
        out = await product.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert out.choices[0].message.content == "xxxx"
        # the research tenant asks for chat (not allowed) and spoofs internal headers: batch it stays
        await research.completions.create(
            model="m",
            prompt="hi",
            max_tokens=2,
            extra_headers={"x-slo-tier": "chat", "x-slofleet-tenant": "product"},
        )
        seen = [h for p in pods for h in p.seen_headers]
        assert [h["x-slo-tier"] for h in seen] == ["chat", "batch"]
        assert [h["x-slofleet-tenant"] for h in seen] == ["product", "research"]
        # a tier the tenant is allowed is honoured, from the body too
        await product.completions.create(
            model="m", prompt="x", max_tokens=1, extra_body={"slo": {"tier": "batch"}}
        )
        assert [h["x-slo-tier"] for p in pods for h in p.seen_headers][-1] == "batch"

        chunks = [
            c
            async for c in await product.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
            )
        ]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "xxxxx"
        text = "".join(
            [
                c.choices[0].text
                async for c in await product.completions.create(
                    model="m", prompt="x", max_tokens=3, stream=True
                )
            ]
        )
        assert text == "xxx"

        assert [m.id for m in (await product.models.list()).data] == ["m"]
        with pytest.raises(openai.AuthenticationError):
            await client(url, "sk-wrong").completions.create(model="m", prompt="x", max_tokens=1)
        async with httpx.AsyncClient() as h:
            prom = (await h.get(url + "/metrics")).text
        assert metric(prom, "slofleet_router_stripped_total", tenant="research") == 1
        assert (
            metric(prom, "slofleet_router_requests_total", tier="chat", tenant="product", outcome="ok") == 3
        )
        assert metric(prom, "slofleet_router_goodput_tokens_total", tier="chat", tenant="product") > 0


async def test_rate_limit_answers_429_with_retry_after() -> None:
    async with fleet([FakePod("a")]) as (url, _, _):
        research = client(url, "sk-research")
        codes = []
        for _ in range(6):
            try:
                await research.completions.create(model="m", prompt="x", max_tokens=1)
                codes.append(200)
            except openai.RateLimitError as exc:
                codes.append(429)
                assert int(exc.response.headers["retry-after"]) >= 1
                assert exc.body["code"] == "rate_limited"  # type: ignore[index]
        assert codes[:4] == [200] * 4 and codes[4:] == [429, 429]  # burst of 2 s at 2 requests/s


async def test_client_disconnect_cancels_the_upstream_request() -> None:
    pod = FakePod("a", behaviour=PodBehaviour(tbt_s=0.02))
    async with fleet([pod]) as (url, state, _):
        stream = await client(url).completions.create(model="m", prompt="x", max_tokens=1000, stream=True)
        async for _ in stream:
            break
        assert pod.live  # the pod is generating
        await stream.close()
        await until(lambda: not pod.live, timeout_s=3)
        await until(
            lambda: state.metrics.requests.labels("chat", "product", "m", "cancelled")._value.get() == 1
        )
        assert pod.served == 0


async def test_client_gone_before_the_pod_answers_cancels_the_upstream_request() -> None:
    """The router waits for the pod's answer in the request's own task, with a watcher that cancels
    it when the client hangs up: the request is accounted as cancelled and no longer counted as
    in flight on the pod (the upstream connection is closed; this fake pod does not abort on it)."""
    pod = FakePod("a", behaviour=PodBehaviour(ttft_s=30.0))
    async with fleet([pod]) as (url, state, _):
        body = {"model": "m", "prompt": "x", "max_tokens": 1}
        headers = {"authorization": "Bearer sk-product"}
        async with httpx.AsyncClient() as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(url + "/v1/completions", json=body, headers=headers, timeout=0.5)
        assert pod.live  # the pod had the request
        await until(
            lambda: state.metrics.requests.labels("chat", "product", "m", "cancelled")._value.get() == 1
        )
        assert all(not e.sent for e in state.endpoints.values())  # nothing left counted in flight


async def test_pod_errors_before_the_first_byte_are_retried_elsewhere_and_trip_its_breaker() -> None:
    bad = FakePod("bad", behaviour=PodBehaviour(fail_status=500))
    good = FakePod("good")
    async with fleet([bad, good], routing_policy="round-robin") as (url, state, _):
        c = client(url)
        for _ in range(8):
            assert (await c.completions.create(model="m", prompt="x", max_tokens=1)).choices
        assert good.served == 8
        assert state.endpoints["bad"].breaker.is_open
        assert len(bad.seen_headers) == 3  # threshold: then the breaker keeps traffic away
