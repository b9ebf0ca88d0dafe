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

from slo_core.slo import RequestKind
from slo_core.wire.keepalive import SERVER_OPTIONS
from slo_proto import slofleet_pb2, slofleet_pb2_grpc
from slo_sidecar.grpc_auth import CallAuth
from slo_sidecar.service import Sidecar

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 100
MIN_INTERVAL_MS = 10


def pod_state(sc: Sidecar, aggregate_only: bool = False) -> Any:
    """One PodState snapshot of this sidecar and its engine."""
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
        step_time_correction=1.0,
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
