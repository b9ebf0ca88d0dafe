"""Dispatch through the app: capability filters, GoRouting's infeasibility → 503 or best effort, affinity."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from builders import BE, replica, request

from slo_core.policies.base import ReplicaView
from slo_core.policies.go_routing import GoRouting
from slo_core.policies.registry import make_router_policy
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_core.wire.tokens import estimate_body_prompt_tokens
from slo_lab.loopback_pods import LoopbackPods, close_all
from slo_router.app import RouterState, create_app
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.metrics import RouterMetrics
from slo_router.tenants import KeyStore, Tenant

TIERS = {
    "gold": SLOTier("gold", RequestKind.LATENCY, PriorityClass("gold", 3.0), ttft_s=1.0, tbt_s=0.05),
    "spare": SLOTier("spare", RequestKind.BEST_EFFORT, PriorityClass("spare", 0.1)),
}
BODY = {"model": "m", "prompt": "hello", "max_tokens": 8}


@pytest.fixture(autouse=True)
async def _stop_loopback_pods() -> AsyncIterator[None]:
    yield
    await close_all()


def ok(req: httpx.Request) -> httpx.Response:
    usage = {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": usage})


def busy_view(ep_id: str, now_s: float, n: int = 3, prompt_tokens: int = 20_000) -> ReplicaView:
    """Pod ``ep_id`` serving model m with ``n`` long best-effort prompts queued."""
    waiting = (
        request(f"{ep_id}-{i}", BE, arrival_s=now_s, prompt=prompt_tokens, max_tokens=10) for i in range(n)
    )
    return replica(ep_id, snapshot_s=now_s, waiting=waiting, kv_total=1000, seqs=256, models=("m",))


def make(
    endpoints: Sequence[EndpointState], policy: Any = None, **cfg: Any
) -> tuple[httpx.AsyncClient, RouterState, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return ok(req)

    clock = cfg.pop("clock", None)
    config = RouterConfig(
        tiers=TIERS,
        default_tier="gold",
        tenants={"t": Tenant("t", ("gold", "spare"), "gold")},
        best_effort_tier="spare",
        **cfg,
    )
    state = RouterState(
        config=config,
        keys=KeyStore({"k": "t"}),
        endpoints={ep.spec.endpoint_id: ep for ep in endpoints},
        metrics=RouterMetrics(),
        policy=policy or GoRouting(),
        client=LoopbackPods(handler).session(),
    )
    if clock is not None:
        state.clock = clock
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://r")
    return client, state, seen


H = {"authorization": "Bearer k"}


def ep(ep_id: str, **spec: Any) -> EndpointState:
    return EndpointState(EndpointSpec(ep_id, f"http://{ep_id}.pod", models=("m",), **spec))


async def test_gpu_class_and_context_filters_leave_only_capable_pods() -> None:
    eps = [
        ep("small", gpu_class="h100", max_context_tokens=64),
        ep("a100", gpu_class="a100"),
        ep("big", gpu_class="h100", max_context_tokens=4096),
    ]
    client, state, seen = make(eps, tier_gpu_classes={"gold": frozenset({"h100"})})
    for _ in range(3):
        r = await client.post("/v1/completions", json={**BODY, "max_tokens": 1000}, headers=H)
        assert r.status_code == 200
    assert {q.url.host for q in seen} == {"big.pod"}
    r = await client.post("/v1/completions", json={**BODY, "max_tokens": 4096}, headers=H)
    prompt = estimate_body_prompt_tokens(BODY)  # what the sidecar will count
    assert r.status_code == 503 and f"context of {prompt + 4096} tokens" in r.json()["error"]["message"]
    # beyond every pod's context: the client's mistake, a 400 saying so (no retry can help)
    r = await client.post("/v1/completions", json={**BODY, "max_tokens": 10_000}, headers=H)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert state.metrics.requests.labels("gold", "t", "m", "ok")._value.get() == 3


async def test_capabilities_reported_by_the_sidecar_override_discovery() -> None:
    a = ep("a")
    a.view = replica("a", kv_total=10, models=("other",))
    client, _, seen = make([a, ep("b")])
    r = await client.post("/v1/completions", json=BODY, headers=H)
    assert r.status_code == 200 and seen[0].url.host == "b.pod"


async def test_request_no_pod_can_serve_in_time_gets_an_early_503_with_retry_after() -> None:
    a, b = ep("a"), ep("b")
    client, state, seen = make([a, b], clock=lambda: 100.0)
    a.view, b.view = busy_view("a", 100.0), busy_view("b", 100.0)
    r = await client.post("/v1/completions", json=BODY, headers=H)
    assert r.status_code == 503 and not seen
    assert r.json()["error"]["code"] == "no_capacity" and "SLO" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) >= 1
    assert state.metrics.rejects.labels("gold", "t", "m", "no_capacity")._value.get() == 1
    b.view = busy_view("b", 100.0, n=0)  # one pod frees up: served again
    assert (await client.post("/v1/completions", json=BODY, headers=H)).status_code == 200
    assert seen[0].url.host == "b.pod"


async def test_policy_may_move_infeasible_requests_to_the_best_effort_tier() -> None:
    a = ep("a")
    client, state, seen = make([a], overload_to_best_effort=True, clock=lambda: 100.0)
    a.view = busy_view("a", 100.0)
    r = await client.post("/v1/completions", json=BODY, headers=H)
    assert r.status_code == 200
    assert seen[0].headers["x-slo-tier"] == "spare"
    assert r.headers["x-slo-tier"] == "spare"  # the client sees the demotion on the answer
    assert state.metrics.downgraded.labels("gold", "t", "m")._value.get() == 1
    assert state.metrics.requests.labels("spare", "t", "m", "ok")._value.get() == 1
    a.view = busy_view("a", 100.0, n=0)  # room again: served in the tier it asked for, and told so
    r = await client.post("/v1/completions", json={**BODY, "stream": True}, headers=H)
    assert r.status_code == 200 and r.headers["x-slo-tier"] == "gold"


async def test_session_affinity_sticks_and_prefix_affinity_agrees_across_routers() -> None:
    eps = [ep(x) for x in "abcd"]
    client, _, seen = make(eps, policy=make_router_policy("round-robin"), affinity=("session",))
    for _ in range(4):
        r = await client.post("/v1/completions", json=BODY, headers={**H, "x-session-id": "s1"})
        assert r.status_code == 200
    assert len({q.url.host for q in seen}) == 1
    prompt = {"model": "m", "prompt": "a shared system prompt " * 10, "max_tokens": 4}
    picks = []
    for _ in range(2):  # two independent routers, same pods
        c, _, s = make(
            [ep(x) for x in "abcd"], policy=make_router_policy("round-robin"), affinity=("prefix",)
        )
        for _ in range(3):
            assert (await c.post("/v1/completions", json=prompt, headers=H)).status_code == 200
        picks.append({q.url.host for q in s})
    assert picks[0] == picks[1] and len(picks[0]) == 1


async def test_sent_requests_are_forgotten_when_they_finish() -> None:
    a = ep("a")
    client, _, _ = make([a])
    assert (await client.post("/v1/completions", json=BODY, headers=H)).status_code == 200
    assert not a.sent
    r = await client.get("/metrics")
    assert 'slofleet_router_chosen_total{endpoint="a"} 1.0' in r.text
    assert "slofleet_router_dispatch_seconds_count" in r.text
    assert json.loads((await client.get("/v1/models", headers=H)).text)["data"][0]["id"] == "m"


async def test_policies_that_score_load_not_gain_never_make_a_request_infeasible() -> None:
    a, b = ep("a"), ep("b")
    client, _, seen = make([a, b], policy=make_router_policy("min-load"), clock=lambda: 100.0)
    a.view, b.view = busy_view("a", 100.0), busy_view("b", 100.0, n=1)
    r = await client.post("/v1/completions", json=BODY, headers=H)
    assert r.status_code == 200 and seen[0].url.host == "b.pod"  # the lighter one, not a 503
