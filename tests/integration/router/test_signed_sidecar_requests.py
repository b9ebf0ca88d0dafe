"""Proxy mode with tag signing (what the operator renders): the sidecar takes a request's SLO, tier and
tenant only when the router signed them. Through the router the request is served at its tier; sent
straight to the sidecar (a caller inside the cluster that skipped the router) with a tier of its choice,
with the router's headers altered, or with a signature by a key the pod does not hold, it gets a 403
OpenAI error before admission, counted. Real sockets on loopback."""

from __future__ import annotations

import asyncio
import time

import httpx

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_core.wire.headers import SIGNATURE_HEADER, sign_headers, verify_headers
from slo_core.wire.keyring import KeyRing
from slo_lab.engine_sim.server import serve_engine_sim
from slo_lab.fakepod import ServedApp
from slo_lab.fuzzcases import is_openai_error
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
RING = KeyRing(b"c" * 32, b"p" * 32, rotated_at_s=time.time() - 3600)
OTHER = b"x" * 32


def refused(sc: Sidecar) -> dict[str, float]:
    return {
        s.labels["reason"]: s.value
        for m in sc.metrics.unsigned_requests.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


def test_the_signature_covers_tier_tenant_slo_and_request_id() -> None:
    headers = {"x-slo-tier": "batch", "x-slofleet-tenant": "t", "x-request-id": "r1", "accept": "*/*"}
    signed = sign_headers(headers, RING.current, 1000.0)
    assert verify_headers(signed, RING.verify_keys, 1001.0) is None
    for name, value in (("x-slo-tier", "chat"), ("x-slofleet-tenant", "root"), ("x-request-id", "r2")):
        assert verify_headers({**signed, name: value}, RING.verify_keys, 1001.0) == "forged signature"
    assert verify_headers({**signed, "x-slo-ttft-s": "0.01"}, RING.verify_keys, 1001.0) == "forged signature"
    assert verify_headers({**signed, "accept": "text/plain"}, RING.verify_keys, 1001.0) is None
    assert verify_headers(headers, RING.verify_keys, 1001.0) == "unsigned"
    assert verify_headers(signed, [OTHER], 1001.0) == "forged signature"
    # hostile signature values: refused with a reason, never an exception
    for bad in ("", "abc", "1000.", ".ff", "9" * 40 + ".ab", "1000." + "z" * 64, "nan.00", "-5.00"):
        assert verify_headers({**signed, SIGNATURE_HEADER: bad}, RING.verify_keys, 1001.0) is not None, bad


async def test_only_requests_the_router_signed_reach_the_engine() -> None:
    async with serve_engine_sim(speedup=50) as sim:
        config = PolicyConfig(tiers={"chat": CHAT, "batch": BATCH}, default_tier="batch", max_wait_s=10)
        sc = Sidecar(
            knobs=SidecarKnobs(signed_requests=True),
            config=config,
            engine_url=sim.url,
            estimator=FallbackEstimator(),
        )
        sc.keys = lambda: RING
        async with running_sidecar(sc, grpc_port=0) as run:
            ep = EndpointState(
                EndpointSpec("p0", run.http_url, grpc_target=run.grpc_target, models=(sim.model,))
            )
            rconfig = RouterConfig(
                tiers={"chat": CHAT, "batch": BATCH},
                default_tier="batch",
                tenants={"t": Tenant("t", ("batch",), "batch")},
            )
            state = build_state(rconfig, KeyStore({"sk": "t"}), {"p0": ep})
            state.tag_keys = lambda: RING
            feed = StateFeed(state.endpoints, interval_ms=50, keys=lambda: RING)
            async with ServedApp(create_app(state, background=[lambda s: feed.run(poll_s=0.05)])) as router:
                for _ in range(200):
                    if ep.usable:
                        break
                    await asyncio.sleep(0.05)
                body = {"model": sim.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                async with httpx.AsyncClient(timeout=30) as http:
                    ok = await http.post(
                        router.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk"}
                    )
                    assert ok.status_code == 200, ok.text
                    # straight to the sidecar: a tier of the caller's choice, a forged signature, another key
                    direct = {"x-slo-tier": "chat", "x-slofleet-tenant": "t", "x-request-id": "d1"}
                    forged = {**sign_headers({**direct, "x-slo-tier": "batch"}, RING.current, time.time())}
                    forged["x-slo-tier"] = "chat"  # the router's signature over another tier
                    other_key = sign_headers(direct, OTHER, time.time())
                    for headers in (direct, forged, other_key):
                        resp = await http.post(
                            run.http_url + "/v1/chat/completions", json=body, headers=headers
                        )
                        assert resp.status_code == 403, resp.text
                        assert (
                            is_openai_error(resp.json())
                            and resp.json()["error"]["code"] == "unsigned_request"
                        )
                    assert SIGNATURE_HEADER not in direct
        assert refused(sc) == {"unsigned": 1.0, "forged signature": 2.0}
