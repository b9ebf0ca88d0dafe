"""The router in-process: tenants and tiers, spoofing, rate limits, retries, streaming errors, models."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import pytest

from slo_core.policies.base import BaseRouterPolicy, ReplicaView, RequestView, RouteDecision
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.loopback_pods import LoopbackPods, close_all
from slo_router.app import RouterState, create_app
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.metrics import RouterMetrics
from slo_router.ratelimit import RateLimiter
from slo_router.tenants import KeyStore, Tenant

GOLD = PriorityClass("gold", 3.0)
BRONZE = PriorityClass("bronze", 1.0)
TIERS = {
    "chat-gold": SLOTier("chat-gold", RequestKind.LATENCY, GOLD, ttft_s=1.0, tbt_s=0.05),
    "batch": SLOTier("batch", RequestKind.DEADLINE, BRONZE, deadline_s=60.0),
}


@pytest.fixture(autouse=True)
async def _stop_loopback_pods() -> AsyncIterator[None]:
    yield
    await close_all()


class FirstListed(BaseRouterPolicy):
    """Routes to the first replica offered (the test controls the order)."""

    name = "first"

    def __init__(self) -> None:
        self.seen: list[RequestView] = []

    def route(
        self, request: RequestView, replicas: Sequence[ReplicaView], now_s: float, rng: random.Random
    ) -> RouteDecision:
        self.seen.append(request)
        return RouteDecision(replicas[0].replica_id)


def config(**kw: Any) -> RouterConfig:
    tenants = {
        "acme": Tenant("acme", ("chat-gold", "batch"), "chat-gold"),
        "free": Tenant("free", ("batch",), "batch", requests_per_s=1.0),
    }
    return RouterConfig(tiers=TIERS, default_tier="batch", tenants=tenants, shuffle_ties=False, **kw)


def make(
    upstream: Callable[[httpx.Request], httpx.Response], endpoints: Sequence[str] = ("a", "b"), **kw: Any
) -> tuple[httpx.AsyncClient, RouterState, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return upstream(req)

    eps = {
        e: EndpointState(EndpointSpec(e, f"http://{e}.pod", models=("m",), max_context_tokens=4096))
        for e in endpoints
    }
    state = RouterState(
        config=config(**kw),
        keys=KeyStore({"k-acme": "acme", "k-free": "free"}),
        endpoints=eps,
        metrics=RouterMetrics(),
        policy=FirstListed(),
        limiter=RateLimiter(burst_s=1.0),
        client=LoopbackPods(handler).session(),
    )
    app = create_app(state)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router")
    return client, state, seen


def ok_completion(req: httpx.Request) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "x",
            "object": "text_completion",
            "choices": [{"text": "hi"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        },
    )


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


BODY = {"model": "m", "prompt": "hello", "max_tokens": 8}


async def test_key_binds_tenant_default_tier_and_forwards_slo_as_headers() -> None:
    client, state, seen = make(ok_completion)
    r = await client.post("/v1/completions", json={**BODY, "slo": {"deadline_s": 30}}, headers=auth("k-acme"))
    assert r.status_code == 200
    fwd = seen[0]
    assert fwd.headers["x-slo-tier"] == "chat-gold"
    assert fwd.headers["x-slo-deadline-s"] == "30.0"
    assert fwd.headers["x-slofleet-tenant"] == "acme"
    assert "slo" not in json.loads(fwd.content)  # SLO fields travel as headers only
    assert state.policy.seen[0].slo.priority_weight == 3.0  # type: ignore[attr-defined]


async def test_spoofed_tier_and_internal_headers_are_stripped_and_counted() -> None:
    client, state, seen = make(ok_completion)
    headers = {**auth("k-free"), "x-slo-tier": "chat-gold", "x-slofleet-tenant": "acme"}
    r = await client.post("/v1/completions", json=BODY, headers=headers)
    assert r.status_code == 200
    assert seen[0].headers["x-slo-tier"] == "batch"
    assert seen[0].headers["x-slofleet-tenant"] == "free"
    assert state.metrics.stripped.labels("free")._value.get() == 1


async def test_a_body_with_nothing_to_strip_is_forwarded_as_sent_and_one_with_something_is_reencoded() -> (
    None
):
    client, _, seen = make(ok_completion)
    sent = b'{ "model" : "m",\n "prompt": "caf\\u00e9 \\"quoted\\" {[", "max_tokens": 8 }\n'
    r = await client.post("/v1/completions", content=sent, headers=auth("k-acme"))
    assert r.status_code == 200
    assert seen[0].content == sent  # byte for byte: a relay does not decode and encode what it passes on
    stripped = {**BODY, "priority": -100, "slo": {"tier": "batch"}}
    r = await client.post("/v1/completions", json=stripped, headers=auth("k-acme"))
    assert r.status_code == 200
    assert json.loads(seen[1].content) == BODY  # the client's engine tag and SLO fields are gone
    utf16 = json.dumps(BODY).encode("utf-16")  # valid JSON (RFC 8259 readers may accept it): sent as UTF-8
    r = await client.post("/v1/completions", content=utf16, headers=auth("k-acme"))
    assert r.status_code == 200
    assert json.loads(seen[2].content.decode("utf-8")) == BODY


async def test_an_engine_mode_pod_gets_the_clients_bytes_plus_signed_tags_and_no_slo_headers() -> None:
    import time

    from slo_core.wire.keyring import KeyRing
    from slo_core.wire.tags import trusted_tags

    key = b"router-key-0123456789abcdef"
    client, state, seen = make(ok_completion, endpoints=("a",))
    state.endpoints["a"] = EndpointState(
        EndpointSpec("a", "http://a.pod", models=("m",), max_context_tokens=4096, mode="engine")
    )
    state.tag_keys = lambda: KeyRing(key)
    sent = b'{"model": "m", "prompt": "hi", "max_tokens": 8}'
    r = await client.post("/v1/completions", content=sent, headers={**auth("k-acme"), "x-slo-tier": "batch"})
    assert r.status_code == 200
    got = seen[0].content
    assert got.startswith(sent[:-1]) and got.endswith(b"}")
    body = json.loads(got)
    tags, why = trusted_tags(body["vllm_xargs"], [key], time.time())
    assert why is None and tags is not None and (tags.tier, tags.tenant) == ("batch", "acme")
    assert {k: body[k] for k in ("model", "prompt", "max_tokens")} == json.loads(sent)
    assert not [h for h in seen[0].headers if h.startswith("x-slo")]  # the SLO rides in the signed tags
    assert seen[0].headers["x-request-id"] == tags.request_key


@pytest.mark.parametrize(("headers", "status"), [({}, 401), (auth("wrong"), 401)])
async def test_missing_or_unknown_key_is_401(headers: dict[str, str], status: int) -> None:
    client, _, seen = make(ok_completion)
    r = await client.post("/v1/completions", json=BODY, headers=headers)
    assert r.status_code == status
    assert r.json()["error"]["type"] == "authentication_error"
    assert "wrong" not in r.text and not seen


async def test_rate_limit_gives_429_with_retry_after() -> None:
    client, _, _ = make(ok_completion)
    assert (await client.post("/v1/completions", json=BODY, headers=auth("k-free"))).status_code == 200
    r = await client.post("/v1/completions", json=BODY, headers=auth("k-free"))
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limited"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x"}, "model"),
        ({**BODY, "slo": {"deadline_s": -5}}, "body field 'slo.deadline_s'"),
        ({**BODY, "max_tokens": 0}, "max_tokens"),
    ],
)
async def test_bad_input_is_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    client, _, seen = make(ok_completion)
    r = await client.post("/v1/completions", json=body, headers=auth("k-acme"))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    assert not seen


async def test_malformed_json_is_400() -> None:
    client, _, _ = make(ok_completion)
    r = await client.post("/v1/completions", content=b"{not json", headers=auth("k-acme"))
    assert r.status_code == 400
    assert "not valid JSON" in r.json()["error"]["message"]


async def test_connect_error_and_5xx_before_first_byte_retry_on_another_pod() -> None:
    def upstream(req: httpx.Request) -> httpx.Response:
        if req.url.host == "a.pod":
            raise httpx.ConnectError("refused", request=req)
        return ok_completion(req)

    client, state, seen = make(upstream)
    r = await client.post("/v1/completions", json=BODY, headers=auth("k-acme"))
    assert r.status_code == 200
    assert [q.url.host for q in seen] == ["a.pod", "b.pod"]
    assert state.endpoints["a"].breaker.failures == 1


async def test_no_pod_left_is_an_honest_503_with_retry_after() -> None:
    def upstream(req: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"retry-after": "4"}, json={"error": {"message": "full"}})

    client, _, seen = make(upstream)
    r = await client.post("/v1/completions", json=BODY, headers=auth("k-acme"))
    assert r.status_code == 503
    assert r.headers["retry-after"] == "4"
    assert len(seen) == 2  # tried each pod once


async def test_request_for_unknown_model_is_404_model_not_found() -> None:
    """Not 503 + Retry-After, which the openai SDK retries (issue 17)."""
    client, _, _ = make(ok_completion)
    r = await client.post("/v1/completions", json={**BODY, "model": "nope"}, headers=auth("k-acme"))
    assert r.status_code == 404 and "retry-after" not in r.headers
    assert r.json()["error"]["code"] == "model_not_found" and r.json()["error"]["param"] == "model"


async def test_stream_failure_after_first_byte_ends_with_an_error_event() -> None:
    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[override]
            yield b'data: {"choices": [{"text": "a"}]}\n\n'
            raise httpx.ReadError("pod died")

    def upstream(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken())

    client, state, seen = make(upstream)
    r = await client.post("/v1/completions", json={**BODY, "stream": True}, headers=auth("k-acme"))
    assert r.status_code == 200
    assert 'data: {"choices": [{"text": "a"}]}' in r.text
    events = [json.loads(e[len("data: ") :]) for e in r.text.split("\n\n") if e.startswith("data: {")]
    assert events[-1]["error"]["type"] == "upstream_error" and r.text.rstrip().endswith("data: [DONE]")
    assert len(seen) == 1  # never retried once bytes flowed
    assert state.metrics.requests.labels("chat-gold", "acme", "m", "error")._value.get() == 1


async def test_models_are_listed_from_endpoints() -> None:
    client, _, _ = make(ok_completion)
    r = await client.get("/v1/models", headers=auth("k-acme"))
    assert [m["id"] for m in r.json()["data"]] == ["m"]


async def test_when_every_pod_is_busy_a_request_with_slack_goes_round_again() -> None:
    calls: list[str] = []

    def upstream(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.host)
        if len(calls) <= 2:  # both pods busy at first
            return httpx.Response(503, headers={"retry-after": "0"}, json={"error": {"message": "busy"}})
        return ok_completion(req)

    client, state, _ = make(upstream)
    body = {**BODY, "slo": {"tier": "batch"}}  # a 60 s deadline leaves room to wait
    r = await client.post("/v1/completions", json=body, headers=auth("k-acme"))
    assert r.status_code == 200 and len(calls) == 3
    assert not state.endpoints["a"].breaker.failures  # busy is not broken
    # a chat request's 1 s TTFT leaves no room: the pods' answer stands
    calls.clear()
    r = await client.post("/v1/completions", json=BODY, headers=auth("k-acme"))
    assert r.status_code == 503 and len(calls) == 2


async def test_before_its_key_secrets_are_read_a_valid_key_gets_retry_later_not_401() -> None:
    client, state, seen = make(ok_completion)
    state.keys_loaded = False  # as Kubernetes discovery starts: the policy's key Secrets not read yet
    for key in ("k-acme", "wrong"):  # a valid key cannot be told from an unknown one yet
        r = await client.post("/v1/completions", json=BODY, headers=auth(key))
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "keys_not_loaded" and r.headers["retry-after"] == "5"
    assert not seen
    assert (await client.get("/ready?engines=optional")).json()["keys_loaded"] is False
    state.keys_loaded = True
    assert (await client.post("/v1/completions", json=BODY, headers=auth("k-acme"))).status_code == 200
    assert (await client.post("/v1/completions", json=BODY, headers=auth("wrong"))).status_code == 401


def test_discovery_opens_the_key_gate_only_with_a_read_of_the_policy_in_force() -> None:
    from slo_router.kube import KubeDiscovery

    state = RouterState(
        config=config(),
        keys=KeyStore({}),
        endpoints={},
        metrics=RouterMetrics(),
        policy=FirstListed(),
    )
    discovery = KubeDiscovery(state, namespace="default", api_client=object(), policy_name="p")
    assert (state.policy_loaded, state.keys_loaded, state.endpoints_listed) == (False, False, False)
    discovery._set_keys({}, {})  # read for the config before the policy: not the policy's tenants
    assert not state.keys_loaded
    policy = config(key_secrets={"acme": ("acme-keys", "keys")})
    state.apply_config(policy, "default/p")
    discovery._set_keys({}, {})  # a read made before the policy arrived, delivered after it
    assert not state.keys_loaded
    discovery._set_keys({"k-acme": "acme"}, {"acme": ("acme-keys", "keys")})
    assert state.keys_loaded and state.keys.tenant_of("k-acme") == "acme"
    discovery._pods_listed([])
    assert state.endpoints_listed
    state.apply_config(config(key_secrets={}), "default/p")  # later edits do not close it again
    assert state.keys_loaded
