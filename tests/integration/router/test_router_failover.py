"""Failover through the router with the openai client: a pod killed mid-load.

Pods are fake (slo_lab.fakepod) on loopback; the router runs in-process with its state feed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.fakepod import FakePod, PodBehaviour, RunningPod, ServedApp
from slo_router.app import build_state, create_app
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.statefeed import StateFeed
from slo_router.tenants import KeyStore, Tenant

TIER = SLOTier("std", RequestKind.DEADLINE, PriorityClass("p", 1.0), deadline_s=600.0)
HANG_LIMIT_S = 15.0


async def until(cond: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def start(pods: list[FakePod], **cfg: Any) -> tuple[ServedApp, Any, list[RunningPod]]:
    running = [RunningPod(p) for p in pods]
    for r in running:
        await r.__aenter__()
    eps = {
        r.pod.name: EndpointState(EndpointSpec(r.pod.name, r.url, grpc_target=r.grpc_target)) for r in running
    }
    config = RouterConfig(
        tiers={"std": TIER}, default_tier="std", tenants={"t": Tenant("t", ("std",), "std")}, **cfg
    )
    state = build_state(config, KeyStore({"sk": "t"}), eps)
    feed = StateFeed(state.endpoints, interval_ms=20, backoff_s=(0.05, 0.2))
    router = ServedApp(create_app(state, background=[lambda s: feed.run(poll_s=0.02)]))
    await router.start()
    await until(lambda: all(e.usable for e in state.endpoints.values()))
    return router, state, running


async def stream_text(c: openai.AsyncOpenAI, max_tokens: int) -> str:
    stream = await c.completions.create(model="m", prompt="hello", max_tokens=max_tokens, stream=True)
    return "".join([ch.choices[0].text async for ch in stream if ch.choices])


async def outcome(c: openai.AsyncOpenAI, max_tokens: int) -> str:
    try:
        text = await asyncio.wait_for(stream_text(c, max_tokens), HANG_LIMIT_S)
    except TimeoutError:
        return "hung"
    except openai.APIError as exc:
        return "error" if "serving pod" in str(exc) else f"other: {exc}"
    return "ok" if text == "x" * max_tokens else f"short: {len(text)}"


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_pod_killed_mid_load_errors_only_its_inflight_streams() -> None:
    pods = [FakePod(n, behaviour=PodBehaviour(ttft_s=0.02, tbt_s=0.01)) for n in ("a", "b", "c")]
    router, state, running = await start(pods, routing_policy="round-robin")
    try:
        c = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk", max_retries=0)
        first = [asyncio.create_task(outcome(c, 80)) for _ in range(18)]
        await until(lambda: sum(len(p.live) for p in pods) == 18 and all(p.live for p in pods))
        await until(
            lambda: all(r.generated for p in pods for r in p.live.values())
        )  # all past the first byte
        doomed = len(pods[0].live)
        await running[0].kill()
        later = [asyncio.create_task(outcome(c, 10)) for _ in range(18)]  # not started when it died
        first_done, later_done = await asyncio.gather(*first), await asyncio.gather(*later)

        assert "hung" not in first_done + later_done
        assert later_done == ["ok"] * 18
        assert sorted(set(first_done)) == ["error", "ok"]
        assert first_done.count("error") == doomed
        assert not state.endpoints["a"].usable
        async with httpx.AsyncClient() as h:
            prom = (await h.get(router.url + "/metrics")).text
        ok = metric(prom, "slofleet_router_requests_total", outcome="ok")
        err = metric(prom, "slofleet_router_requests_total", outcome="error")
        assert (ok, err) == (36 - doomed, doomed)  # every request counted once, as the client saw it
        assert pods[1].served + pods[2].served == 36 - doomed
    finally:
        await router.stop()
        for r in running:
            await r.kill()
