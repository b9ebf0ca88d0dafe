"""Hostile input at both front doors (router and sidecar, engine-sim behind them) over loopback (issue 17).

Hand-written cases (a 64 MB body, max_tokens 1e9 and 10**400, unknown model, deep JSON without a key,
an infinite deadline, a non-ASCII header, ...) and hypothesis-generated mutations of a valid body. Every
answer must be below 500 and, when an error, an OpenAI error object; no connection may be dropped;
a valid request must still succeed afterwards, and the process's memory must stay bounded.
"""

from __future__ import annotations

import asyncio
import resource
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.engine_sim.server import serve_engine_sim
from slo_lab.fakepod import ServedApp
from slo_lab.fuzzcases import chunks, hostile_cases, is_openai_error, valid_body
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
BATCH = SLOTier("batch", RequestKind.DEADLINE, PriorityClass("low", 1.0), deadline_s=60.0)
KEY = "sk-fuzz"
AUTH = {"authorization": f"Bearer {KEY}"}


@dataclass
class Front:
    router: str
    sidecar: str
    model: str
    loop: asyncio.AbstractEventLoop


def _serve_stack(ready: Future[Front], stop: threading.Event) -> None:
    """Engine-sim, a sidecar and a router on loopback, in their own event loop (hypothesis is sync)."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            sim = await stack.enter_async_context(serve_engine_sim(speedup=50))
            config = PolicyConfig(tiers={"chat": CHAT, "batch": BATCH}, default_tier="chat", max_wait_s=10)
            sc = Sidecar(
                knobs=SidecarKnobs(), config=config, engine_url=sim.url, estimator=FallbackEstimator()
            )
            run = await stack.enter_async_context(running_sidecar(sc, grpc_port=0))
            endpoints = {
                "p0": EndpointState(
                    EndpointSpec("p0", run.http_url, grpc_target=run.grpc_target, models=(sim.model,))
                )
            }
            rconfig = RouterConfig(
                tiers={"chat": CHAT, "batch": BATCH},
                default_tier="chat",
                tenants={"t": Tenant("t", ("chat", "batch"), "chat")},
            )
            state = build_state(rconfig, KeyStore({KEY: "t"}), endpoints)
            feed = StateFeed(state.endpoints, interval_ms=50)
            router = await stack.enter_async_context(
                ServedApp(create_app(state, background=[lambda s: feed.run(poll_s=0.05)]))
            )
            for _ in range(200):
                if state.endpoints["p0"].usable:
                    break
                await asyncio.sleep(0.05)
            ready.set_result(Front(router.url, run.http_url, sim.model, asyncio.get_running_loop()))
            while not stop.is_set():
                await asyncio.sleep(0.05)

    try:
        asyncio.run(main())
    except BaseException as exc:  # surface start-up failures in the test, not in a thread
        if not ready.done():
            ready.set_exception(exc)


@pytest.fixture(scope="module")
def front() -> Iterator[Front]:
    ready: Future[Front] = Future()
    stop = threading.Event()
    thread = threading.Thread(target=_serve_stack, args=(ready, stop), daemon=True)
    thread.start()
    yield ready.result(timeout=60)
    stop.set()
    thread.join(20)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check_answer(resp: httpx.Response, what: str) -> None:
    assert resp.status_code < 500, f"{what}: {resp.status_code} {resp.text[:300]}"
    if resp.status_code >= 400:
        assert is_openai_error(resp.json()), f"{what}: {resp.text[:300]}"


def assert_still_serves(http: httpx.Client, url: str, model: str, headers: dict[str, str]) -> None:
    resp = http.post(url + "/v1/chat/completions", json=valid_body(model), headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("door", ["router", "sidecar"])
def test_hand_written_hostile_requests_get_clear_4xx(front: Front, door: str) -> None:
    url = front.router if door == "router" else front.sidecar
    with httpx.Client(timeout=30) as http:
        assert_still_serves(http, url, front.model, AUTH)
        before = rss_mb()
        for name, kwargs in hostile_cases(front.model):
            headers = {**AUTH, "content-type": "application/json", **kwargs.pop("headers", {})}
            try:
                resp = http.post(url + "/v1/chat/completions", headers=headers, **kwargs)
            except httpx.TransportError as exc:
                pytest.fail(f"{door}: {name}: connection dropped ({exc!r})")
            check_answer(resp, f"{door}: {name}")
            assert_still_serves(http, url, front.model, AUTH)
        assert rss_mb() - before < 150, "memory grew while refusing hostile requests"


def test_router_refuses_unauthenticated_requests_without_reading_the_body(front: Front) -> None:
    with httpx.Client(timeout=30) as http:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            resp = http.post(front.router + "/v1/chat/completions", headers=headers, content=b"[" * 1_000_000)
            assert resp.status_code == 401, resp.text
            check_answer(resp, "unauthenticated")
        resp = http.post(front.router + "/v1/chat/completions", headers=AUTH, content=chunks(64 << 20))
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("door", ["router", "sidecar"])
def test_unknown_routes_and_methods_answer_openai_errors(front: Front, door: str) -> None:
    url = front.router if door == "router" else front.sidecar
    with httpx.Client(timeout=10) as http:
        for method, path, status in [
            ("GET", "/v1/nope", 404),
            ("GET", "/v1/chat/completions", 405),
            ("DELETE", "/v1/models", 405),
        ]:
            resp = http.request(method, url + path, headers=AUTH)
            assert resp.status_code == status
            check_answer(resp, f"{door} {method} {path}")


def test_unknown_model_is_404_model_not_found_without_retry_after(front: Front) -> None:
    with httpx.Client(timeout=10) as http:
        resp = http.post(front.router + "/v1/chat/completions", headers=AUTH, json=valid_body("gpt-nope"))
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    assert "retry-after" not in resp.headers


def test_max_tokens_is_bounded_by_the_models_context_and_defaults_to_what_is_left(front: Front) -> None:
    with httpx.Client(timeout=60) as http:
        too_many = {**valid_body(front.model), "max_tokens": 10**6}
        for url in (front.router, front.sidecar):
            resp = http.post(url + "/v1/chat/completions", headers=AUTH, json=too_many)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["code"] == "context_length_exceeded"
        body = {**valid_body(front.model), "ignore_eos": True}
        del body["max_tokens"]
        resp = http.post(front.router + "/v1/chat/completions", headers=AUTH, json=body)
        assert resp.status_code == 200, resp.text
        usage = resp.json()["usage"]
        # without max_tokens the engine generates until the context is full (vLLM), never just 256
        assert usage["completion_tokens"] > 256
        models = http.get(front.sidecar + "/v1/models").json()["data"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == models[0]["max_model_len"]


_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_fields = st.sampled_from(
    ["model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n", "slo",
     "deadline", "target_ttft", "vllm_xargs", "priority", "temperature", "tools", "tool_choice", "prompt"]
)  # fmt: skip
_headers = st.dictionaries(
    st.sampled_from(
        ["x-slo-tier", "x-slo-ttft-s", "x-slo-deadline-s", "x-slo-stage", "x-request-id", "x-slo-x"]
    ),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12),
    max_size=3,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(mutations=st.dictionaries(_fields, _json, max_size=4), headers=_headers, door=st.sampled_from([0, 1]))
def test_generated_mutations_of_a_valid_body(
    front: Front, mutations: dict[str, Any], headers: dict[str, str], door: int
) -> None:
    url = (front.router, front.sidecar)[door]
    body = {**valid_body(front.model), **mutations}
    with httpx.Client(timeout=30) as http:
        try:
            resp = http.post(url + "/v1/chat/completions", json=body, headers={**AUTH, **headers})
        except httpx.TransportError as exc:
            pytest.fail(f"connection dropped on {body!r}: {exc!r}")
        check_answer(resp, repr(body)[:300])
