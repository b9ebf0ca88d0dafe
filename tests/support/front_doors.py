"""Both front doors on loopback for the fuzz tests: engine-sim, a sidecar and a router in their own
thread and event loop (hypothesis and schemathesis are synchronous), started once per test module."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass

import httpx

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.engine_sim.server import serve_engine_sim
from slo_lab.fakepod import ServedApp
from slo_lab.fuzzcases import is_openai_error, valid_body
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
TIERS = ("chat", "batch")
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


@contextmanager
def front_doors() -> Iterator[Front]:
    ready: Future[Front] = Future()
    stop = threading.Event()
    thread = threading.Thread(target=_serve_stack, args=(ready, stop), daemon=True)
    thread.start()
    yield ready.result(timeout=60)
    stop.set()
    thread.join(20)


def check_answer(resp: httpx.Response, what: str) -> None:
    assert resp.status_code < 500, f"{what}: {resp.status_code} {resp.text[:300]}"
    if resp.status_code >= 400:
        assert is_openai_error(resp.json()), f"{what}: {resp.text[:300]}"


def assert_still_serves(http: httpx.Client, url: str, model: str, headers: dict[str, str]) -> None:
    resp = http.post(url + "/v1/chat/completions", json=valid_body(model), headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]
