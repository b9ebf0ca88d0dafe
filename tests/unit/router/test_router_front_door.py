"""The router's front door (issue 17): what a client may not set, bounded metrics labels, cheap refusals,
the metrics port, and max_tokens defaulting to the context left."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from slo_core.policies.registry import make_router_policy
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.loopback_pods import LoopbackPods, close_all
from slo_router.app import RouterState, create_app, create_metrics_app
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.metrics import RouterMetrics
from slo_router.tenants import KeyStore, Tenant

CHAT = SLOTier("chat", RequestKind.LATENCY, PriorityClass("gold", 3.0), ttft_s=1.0, tbt_s=0.05)
H = {"authorization": "Bearer k"}


@pytest.fixture(autouse=True)
async def _stop_loopback_pods() -> AsyncIterator[None]:
    yield
    await close_all()


def make(
    models: Sequence[str] = ("m",), context: int = 4096, metrics_route: bool = True
) -> tuple[httpx.AsyncClient, RouterState, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def upstream(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"id": "x", "object": "text_completion", "choices": [{"text": "hi"}]})

    state = RouterState(
        config=RouterConfig(
            tiers={"chat": CHAT}, default_tier="chat", tenants={"t": Tenant("t", ("chat",), "chat")}
        ),
        keys=KeyStore({"k": "t"}),
        endpoints={
            "a": EndpointState(
                EndpointSpec("a", "http://a.pod", models=tuple(models), max_context_tokens=context)
            )
        },
        metrics=RouterMetrics(),
        policy=make_router_policy("round-robin", {}),
        client=LoopbackPods(upstream).session(),
    )
    app = create_app(state, metrics_route=metrics_route)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r"), state, seen


async def test_priority_vllm_xargs_and_slo_tags_from_clients_never_reach_the_pod() -> None:
    client, state, seen = make()
    body = {
        "model": "m",
        "prompt": "hi",
        "max_tokens": 4,
        "priority": -100,
        "vllm_xargs": {"slo_priority_weight": 1e9, "slo_kind": "latency"},
        "slo_priority_weight": 1e9,
    }
    r = await client.post("/v1/completions", json=body, headers=H)
    assert r.status_code == 200, r.text
    forwarded = json.loads(seen[0].content)
    assert not {"priority", "vllm_xargs", "slo_priority_weight"} & set(forwarded)
    assert forwarded["prompt"] == "hi" and forwarded["max_tokens"] == 4
    assert state.metrics.stripped.labels("t")._value.get() == 1


async def test_a_client_cannot_make_its_targets_stricter_than_its_tier() -> None:
    client, state, seen = make()
    r = await client.post(
        "/v1/completions",
        json={"model": "m", "prompt": "hi", "max_tokens": 4},
        headers={**H, "x-slo-ttft-s": "0.001", "x-slo-tbt-s": "0.001"},
    )
    assert r.status_code == 200
    assert seen[0].headers["x-slo-ttft-s"] == "0.001"  # what the client asked travels as stated...
    assert state.metrics.stripped.labels("t")._value.get() == 1  # ...but the tier's targets apply


async def test_model_labels_come_only_from_known_models() -> None:
    client, state, _ = make(models=())  # a pod that serves any model: names are the client's
    for name in ("x" * 50, "another-made-up-name"):
        r = await client.post(
            "/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2}, headers=H
        )
        assert r.status_code == 200
    text = (await client.get("/metrics")).text
    assert "made-up" not in text and "xxxxx" not in text
    assert state.metrics.requests.labels("chat", "t", "other", "ok")._value.get() == 2


async def test_unauthenticated_requests_are_refused_before_the_body_is_read() -> None:
    client, _, seen = make()

    async def endless() -> Any:
        for _ in range(10_000):  # 10 GB if anybody read it
            yield b"x" * (1 << 20)

    r = await client.post("/v1/completions", content=endless(), headers={"authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = await client.post("/v1/completions", content=endless(), headers=H)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert not seen


async def test_max_tokens_defaults_to_the_context_left_and_is_bounded_by_it() -> None:
    client, state, _ = make(context=4096)
    views: list[Any] = []
    policy = state.policy
    original = policy.route

    def spy(request: Any, *a: Any, **kw: Any) -> Any:
        views.append(request)
        return original(request, *a, **kw)

    policy.route = spy  # type: ignore[method-assign]
    r = await client.post("/v1/completions", json={"model": "m", "prompt": "hello there"}, headers=H)
    assert r.status_code == 200
    assert views[0].max_tokens == 4096 - views[0].prompt_tokens  # not 256 or 1024
    for value in (1e9, 10**400, 4097):
        raw = json.dumps({"model": "m", "prompt": "hi"})[:-1] + f', "max_tokens": {value}}}'
        r = await client.post("/v1/completions", content=raw.encode(), headers=H)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


async def test_metrics_can_live_on_their_own_port_only() -> None:
    client, state, _ = make(metrics_route=False)
    r = await client.get("/metrics")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    metrics = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_metrics_app(state)), base_url="http://m"
    )
    r = await metrics.get("/metrics")
    assert r.status_code == 200 and "slofleet_router_requests" in r.text
