"""The sidecar's gRPC services (proto/slofleet.proto): Analyzer.GetBounds for the engine-side scheduler
and State.Watch / State.Snapshot for routers, served with grpc.aio on the sidecar's event loop.

Both only read the tracker's current values: an engine step that asks for bounds never waits on a
computation (refinements happen off the loop and land in the tracker when done).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.keepalive import SERVER_OPTIONS
from slo_proto import slofleet_pb2, slofleet_pb2_grpc
from slo_sidecar.grpc_auth import CallAuth
from slo_sidecar.service import Sidecar

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 100
MIN_INTERVAL_MS = 10
# engine mode: an engine whose reports stopped this long ago is shown unhealthy (its load is unknown)
REPORT_STALE_S = 5.0


def pod_state(sc: Sidecar, aggregate_only: bool = False) -> Any:
    """One PodState snapshot of this sidecar and its engine (engine mode: as the engine reported it)."""
    if sc.knobs.mode == "engine" and sc.mirror.seen:
        return reported_state(sc, aggregate_only)
    tr, s = sc.tracker, sc.scheduler
    requests = []
    for job in [] if aggregate_only else list(sc.jobs.values()):
        live = job.live
        due = live.deadline_at_s
        if live.targets.kind is RequestKind.LATENCY:
            due = live.arrival_s + live.targets.token_deadline_s(live.generated_tokens)
        requests.append(
            slofleet_pb2.RequestState(
                request_id=live.request_id,
                kind=live.targets.kind.value,
                tier=live.tier.name,
                priority_weight=live.targets.priority_weight,
                phase=live.phase,
                prompt_tokens=live.prompt_tokens,
                generated_tokens=live.generated_tokens,
                output_bound=live.bound,
                deadline_unix_s=tr.unix(due),
                arrival_unix_s=tr.unix(live.arrival_s),
                ttft_s=live.ttft_s(),
                tbt_s=live.mean_tbt_s(),
                program_id=live.program_id or "",
                stage=live.stage or 0,
            )
        )
    engine = sc.engine
    return slofleet_pb2.PodState(
        pod=sc.knobs.pod,
        snapshot_unix_s=tr.unix(sc.now()),
        healthy=engine.healthy,
        draining=sc.draining,
        waiting=sc.waiting(),
        running=len(s.running) if sc.knobs.mode == "proxy" else engine.running or len(s.running),
        kv_usage=engine.kv_usage,
        kv_cache_tokens=sc.knobs.kv_cache_tokens,
        outstanding_tokens=sc.outstanding_tokens(),
        profile=sc.knobs.profile,
        engine_policy=sc.config.policy_name,
        capabilities=slofleet_pb2.Capabilities(
            models=engine.models or ([sc.knobs.model_name] if sc.knobs.model_name else []),
            max_context_tokens=engine.max_model_len or sc.knobs.max_context_tokens,
            gpu_class="",
        ),
        requests=requests,
        step_time_correction=sc.knobs.step_time_correction,
    )


def _reported_due_unix_s(r: Any) -> float:
    """A reported request's due time: a latency request's next token, else its deadline (0: none)."""
    if r.kind != RequestKind.LATENCY.value or r.ttft_s <= 0 or r.tbt_s <= 0:
        return float(r.deadline_unix_s)
    try:
        targets = SLOTargets(RequestKind.LATENCY, ttft_s=r.ttft_s, tbt_s=r.tbt_s)
    except ValueError:
        return 0.0
    return float(r.arrival_unix_s + targets.token_deadline_s(int(r.generated_tokens)))


def reported_state(sc: Sidecar, aggregate_only: bool = False) -> Any:
    """The PodState of an engine that reports itself (engine mode): its requests, load and KV use."""
    mirror, report = sc.mirror, sc.mirror.report
    fresh = mirror.fresh(REPORT_STALE_S)
    requests = []
    outstanding = 0
    for r in report.requests:
        bound = mirror.bound_of(r.request_key, int(r.max_tokens))
        outstanding += max(0, bound - int(r.generated_tokens)) + (
            int(r.prompt_tokens) if r.phase == "waiting" else 0
        )
        if aggregate_only:
            continue
        ttft = r.first_token_unix_s - r.arrival_unix_s if r.first_token_unix_s > 0 else 0.0
        requests.append(
            slofleet_pb2.RequestState(
                request_id=r.request_key,
                kind=r.kind or RequestKind.BEST_EFFORT.value,
                tier=r.tier,
                priority_weight=r.priority_weight or 1.0,
                phase=r.phase,
                prompt_tokens=r.prompt_tokens,
                generated_tokens=r.generated_tokens,
                output_bound=bound,
                deadline_unix_s=mirror.deadline_of(r.request_key) or _reported_due_unix_s(r),
                arrival_unix_s=r.arrival_unix_s,
                ttft_s=max(0.0, ttft),
                program_id=r.program_id,
                stage=r.stage,
            )
        )
    engine = sc.engine
    models = list(report.models) or engine.models or ([sc.knobs.model_name] if sc.knobs.model_name else [])
    return slofleet_pb2.PodState(
        pod=sc.knobs.pod,
        snapshot_unix_s=report.snapshot_unix_s,
        healthy=engine.healthy and fresh,
        draining=sc.draining,
        waiting=report.waiting,
        running=report.running,
        kv_usage=report.kv_usage,
        kv_cache_tokens=report.kv_cache_tokens or sc.knobs.kv_cache_tokens,
        outstanding_tokens=outstanding,
        profile=sc.knobs.profile,
        engine_policy=report.policy or sc.config.policy_name,
        capabilities=slofleet_pb2.Capabilities(
            models=models,
            max_context_tokens=report.max_model_len or engine.max_model_len or sc.knobs.max_context_tokens,
            gpu_class="",
        ),
        requests=requests,
        step_time_correction=sc.knobs.step_time_correction,
    )


class AnalyzerService(slofleet_pb2_grpc.AnalyzerServicer):
    def __init__(self, sc: Sidecar) -> None:
        self.sc = sc

    async def GetBounds(self, request: Any, context: Any) -> Any:
        sc = self.sc
        keys = set(request.request_keys)
        bounds = []
        for rid, job in list(sc.jobs.items()):
            if keys and rid not in keys:
                continue
            live = job.live
            bounds.append(
                slofleet_pb2.RequestBound(
                    request_key=rid,
                    output_bound=live.bound,
                    priority=live.priority,
                    deadline_unix_s=sc.tracker.unix(live.deadline_at_s),
                )
            )
        return slofleet_pb2.BoundsReply(bounds=bounds, generated_unix_s=sc.tracker.unix(sc.now()))

    async def Report(self, request: Any, context: Any) -> Any:
        """Engine mode: the engine's view in, the bounds of its live requests out."""
        sc = self.sc
        bounds = await sc.mirror.take(request)
        return slofleet_pb2.BoundsReply(
            bounds=[
                slofleet_pb2.RequestBound(request_key=k, output_bound=b, deadline_unix_s=d)
                for k, b, d in bounds
            ],
            generated_unix_s=sc.tracker.unix(sc.now()),
        )


class StateService(slofleet_pb2_grpc.StateServicer):
    def __init__(self, sc: Sidecar) -> None:
        self.sc = sc

    async def Snapshot(self, request: Any, context: Any) -> Any:
        return pod_state(self.sc, request.aggregate_only)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        interval_ms = max(MIN_INTERVAL_MS, request.interval_ms or DEFAULT_INTERVAL_MS)
        while True:
            yield pod_state(self.sc, request.aggregate_only)
            await asyncio.sleep(interval_ms / 1000)


async def start_grpc(sc: Sidecar, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start both services on ``host:port`` (0: any free port); returns the server and its port.

    With a key ring (``--tag-key-file``) every call must carry a valid token (``grpc_auth``)."""
    interceptors = []
    if sc.keys is not None:
        keys = sc.keys
        refused = sc.metrics.grpc_unauthenticated
        interceptors.append(
            CallAuth(lambda: keys().verify_keys, on_refused=lambda m, why: refused.labels(m, why).inc())
        )
    server = grpc.aio.server(options=list(SERVER_OPTIONS), interceptors=interceptors)
    slofleet_pb2_grpc.add_AnalyzerServicer_to_server(AnalyzerService(sc), server)
    slofleet_pb2_grpc.add_StateServicer_to_server(StateService(sc), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    await server.start()
    return server, bound
