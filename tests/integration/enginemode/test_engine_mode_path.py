"""Engine mode end to end on loopback: router -> engine-sim directly (no sidecar relay), SLO tags signed
by the router and verified by the engine, the engine's view reported to its sidecar (bounds back) and
served from there to the router's state stream."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from slo_core.slo import PriorityClass, RequestKind, SLOTargets, SLOTier
from slo_core.wire.keyring import KeyRing
from slo_core.wire.signing import sign
from slo_core.wire.tags import EngineTags
from slo_lab.engine_sim.server import serve_engine_sim
from slo_lab.fakepod import ServedApp
from slo_router.app import build_state, create_app
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.statefeed import StateFeed
from slo_router.tenants import KeyStore, Tenant
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.grpc_service import pod_state
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar

CHAT = SLOTier("chat", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=5.0, tbt_s=1.0)
BATCH = SLOTier("batch", RequestKind.DEADLINE, PriorityClass("low", 1.0), deadline_s=600.0)
KEY = "k" * 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Seen:
    """Records the tags each request reached the engine's scheduler with."""

    def __init__(self) -> None:
        self.tags: dict[str, EngineTags | None] = {}

    def on_tokens(self, h: Any, n: int, t: float) -> None:
        self.tags[h.request_id] = h.sub.tags

    def on_finish(self, h: Any, reason: str, t: float) -> None:
        self.tags.setdefault(h.request_id, h.sub.tags)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    keys = tmp_path / "tag-keys"
    keys.write_text(KEY + "\n")
    grpc_port = _free_port()
    async with serve_engine_sim(
        speedup=50,
        policy="gmax",
        analyzer=f"127.0.0.1:{grpc_port}",
        analyzer_interval_s=0.02,
        report_interval_s=0.02,
        tag_key_file=str(keys),
    ) as sim:
        seen = Seen()
        sim.runner.listeners.append(seen)
        config = PolicyConfig(tiers={"chat": CHAT, "batch": BATCH}, default_tier="chat", max_wait_s=10)
        sc = Sidecar(
            knobs=SidecarKnobs(mode="engine", refine_every_tokens=5),
            config=config,
            engine_url=sim.url,
            estimator=FallbackEstimator(),
        )
        async with running_sidecar(sc, grpc_port=grpc_port) as run:
            ep = EndpointState(
                EndpointSpec("p0", sim.url, grpc_target=run.grpc_target, models=(sim.model,), mode="engine")
            )
            rconfig = RouterConfig(
                tiers={"chat": CHAT, "batch": BATCH},
                default_tier="chat",
                tenants={"t": Tenant("t", ("chat", "batch"), "chat")},
            )
            state = build_state(rconfig, KeyStore({"sk": "t"}), {"p0": ep})
            state.tag_keys = lambda: KeyRing(KEY.encode())
            feed = StateFeed(state.endpoints, interval_ms=50)
            async with ServedApp(create_app(state, background=[lambda s: feed.run(poll_s=0.05)])) as router:
                for _ in range(200):
                    if ep.usable and sc.mirror.seen:
                        break
                    await asyncio.sleep(0.05)
                assert ep.usable and sc.mirror.seen, "the engine reports and the router follows the pod"
                yield {"sim": sim, "sc": sc, "router": router.url, "seen": seen, "ep": ep}


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], **extra}


async def test_the_router_streams_from_the_engine_with_signed_tags_and_no_sidecar_relay(
    fleet: dict[str, Any],
) -> None:
    sim, sc, seen = fleet["sim"], fleet["sc"], fleet["seen"]
    async with httpx.AsyncClient(timeout=30) as client:
        body = _chat(sim.model, max_tokens=12, stream=True, ignore_eos=True)
        headers = {"authorization": "Bearer sk", "x-request-id": "req-chat-1"}
        url = fleet["router"] + "/v1/chat/completions"
        async with client.stream("POST", url, json=body, headers=headers) as r:
            assert r.status_code == 200
            text = (await r.aread()).decode()
        assert text.rstrip().endswith("data: [DONE]")
        assert text.count('"content"') >= 12
    (tags,) = [v for k, v in seen.tags.items() if k.endswith("req-chat-1")]
    assert tags is not None, "signed tags are honoured"
    assert tags.tier == "chat" and tags.request_key == "req-chat-1" and tags.tenant == "t"
    assert tags.targets.kind is RequestKind.LATENCY and tags.targets.ttft_s == 5.0
    assert sim.runner.unsigned_tags == 0
    assert not sc.jobs and sc.history.total_rows == 0, "the sidecar relayed nothing"
    # the engine's report of the finished request reached the sidecar
    for _ in range(100):
        if sc.metrics.requests.labels("chat", "-", "ok")._value.get() >= 1:
            break
        await asyncio.sleep(0.02)
    assert sc.metrics.requests.labels("chat", "-", "ok")._value.get() >= 1


async def test_a_caller_that_skips_the_router_gets_no_priority(fleet: dict[str, Any]) -> None:
    sim, seen = fleet["sim"], fleet["seen"]
    gold = EngineTags(SLOTargets(RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.05), request_key="x", tier="chat")
    forged = sign(gold.to_xargs(), b"not-the-fleet-key-at-all", 0.0)
    async with httpx.AsyncClient(timeout=30) as client:
        for i, xargs in enumerate([gold.to_xargs(), forged]):
            body = _chat(sim.model, max_tokens=2, vllm_xargs=xargs)
            headers = {"x-request-id": f"d{i}"}
            r = await client.post(sim.url + "/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text  # served, not refused: only its priority is gone
    direct = [v for k, v in seen.tags.items() if k.endswith(("-d0", "-d1"))]
    assert direct == [None, None]
    assert sim.runner.unsigned_tags == 2


async def test_the_state_stream_shows_what_the_engine_reports_with_the_analyzers_bounds(
    fleet: dict[str, Any],
) -> None:
    sim, sc, ep = fleet["sim"], fleet["sc"], fleet["ep"]
    async with httpx.AsyncClient(timeout=60) as client:
        body = {"model": sim.model, "prompt": "a long one", "max_tokens": 3000, "ignore_eos": True}
        headers = {"authorization": "Bearer sk", "x-request-id": "req-long", "x-slo-tier": "batch"}
        url = fleet["router"] + "/v1/completions"
        task = asyncio.create_task(client.post(url, json=body, headers=headers))
        row = None
        for _ in range(300):
            snap = pod_state(sc)
            row = next((r for r in snap.requests if r.request_id == "req-long"), None)
            if row is not None and row.phase == "decode" and row.generated_tokens > 20:
                break
            await asyncio.sleep(0.02)
        assert row is not None and row.tier == "batch" and row.kind == "deadline"
        assert row.output_bound > row.generated_tokens
        # the analyzer's bound reached the engine's scheduler asynchronously (no step waited for it)
        h = next(h for rid, h in sim.runner.live.items() if rid.endswith("req-long"))
        for _ in range(100):
            if h.sim.output_bound == sc.mirror.bound_of("req-long", -1):
                break
            await asyncio.sleep(0.02)
        assert h.sim.output_bound == sc.mirror.bound_of("req-long", -1) > 0
        # ... and the router's view of the pod is the engine's (the state stream's next update)
        for _ in range(250):
            if any(r.request_id == "req-long" for r in ep.replica_view(0.0).running):
                break
            await asyncio.sleep(0.02)
        assert any(r.request_id == "req-long" for r in ep.replica_view(0.0).running)
        sim.runner.abort(h.request_id)
        r = await task
        assert r.status_code == 200


async def test_a_draining_pod_is_left_by_the_router_with_retry_after(fleet: dict[str, Any]) -> None:
    sim, sc, ep = fleet["sim"], fleet["sc"], fleet["ep"]
    sc.draining = True
    for _ in range(100):
        if not ep.usable:
            break
        await asyncio.sleep(0.02)
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(
            fleet["router"] + "/v1/chat/completions",
            json=_chat(sim.model, max_tokens=2),
            headers={"authorization": "Bearer sk"},
        )
    assert r.status_code == 503 and r.headers.get("retry-after")
    assert r.json()["error"]["code"] == "no_capacity"
