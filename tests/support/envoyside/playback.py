"""Plays Envoy's side of an ext_proc v3 stream: sends recorded ProcessingRequests, collects answers.

A recording is a JSON list of ProcessingRequest messages in protobuf's JSON form (as
``google.protobuf.json_format`` writes them), in the order Envoy sent them. Envoy never sends the
response phase of a request it was told to answer immediately, so playback stops at an immediate
response.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format
from repo_paths import ROOT

from slo_core.policies.base import BaseRouterPolicy, ReplicaView, RequestView, RouteDecision
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_router.app import RouterState
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.metrics import RouterMetrics
from slo_router.ratelimit import RateLimiter
from slo_router.tenants import KeyStore, Tenant

DATA = ROOT / "tests" / "data" / "extproc"


def load_recording(name: str) -> list[pb.ProcessingRequest]:
    docs = json.loads((DATA / name).read_text())
    return [json_format.ParseDict(d, pb.ProcessingRequest()) for d in docs["requests"]]


def to_json(msgs: Sequence[Any]) -> list[dict[str, Any]]:
    return [json_format.MessageToDict(m) for m in msgs]


async def play(target: str, requests: Sequence[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    """One stream: the requests written in order (as a full-duplex Envoy does), every answer read."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()

        async def write() -> None:
            try:
                for req in requests:
                    await call.write(req)
                await call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                pass  # the picker ended the stream (an immediate response): Envoy stops sending too

        writer = asyncio.create_task(write())
        answers = [resp async for resp in call]
        await writer
        return answers


class FirstReady(BaseRouterPolicy):
    """A deterministic routing policy for protocol tests: the lexically first replica offered."""

    name = "first-ready"

    def __init__(self) -> None:
        self.seen: list[RequestView] = []

    def route(
        self, request: RequestView, replicas: Sequence[ReplicaView], now_s: float, rng: random.Random
    ) -> RouteDecision:
        self.seen.append(request)
        pick = min(replicas, key=lambda r: r.replica_id)
        return RouteDecision(pick.replica_id)


GOLD = PriorityClass("gold", 3.0)
BRONZE = PriorityClass("bronze", 1.0)
TIERS = {
    "chat-gold": SLOTier("chat-gold", RequestKind.LATENCY, GOLD, ttft_s=1.0, tbt_s=0.05),
    "batch": SLOTier("batch", RequestKind.DEADLINE, BRONZE, deadline_s=60.0),
}
KEYS = {"k-acme": "acme", "k-free": "free"}


def router_state(pods: dict[str, str], *, policy: Any = None, **config: Any) -> RouterState:
    """A router state whose pods are ``{endpoint id: http url}`` serving model ``m``."""
    tenants = {
        "acme": Tenant("acme", ("chat-gold", "batch"), "chat-gold"),
        "free": Tenant("free", ("batch",), "batch", requests_per_s=1.0),
    }
    cfg = RouterConfig(tiers=TIERS, default_tier="batch", tenants=tenants, shuffle_ties=False, **config)
    eps = {
        e: EndpointState(EndpointSpec(e, url, models=("m",), max_context_tokens=4096))
        for e, url in pods.items()
    }
    return RouterState(
        config=cfg,
        keys=KeyStore(KEYS),
        endpoints=eps,
        metrics=RouterMetrics(),
        policy=policy or FirstReady(),
        limiter=RateLimiter(burst_s=1.0),
    )
