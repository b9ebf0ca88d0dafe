"""engine-sim's --analyzer: bounds fetched from a real gRPC Analyzer.GetBounds on loopback reach the
policy; when the analyzer goes away the engine degrades to stock order and keeps serving."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags
from slo_lab.engine_sim.runner import EngineRunner, Handle, Submission
from slo_lab.engine_sim.settings import EngineSimSettings
from slo_proto import slofleet_pb2, slofleet_pb2_grpc


class Bounds(slofleet_pb2_grpc.AnalyzerServicer):
    def GetBounds(self, request, context):
        return slofleet_pb2.BoundsReply(
            bounds=[slofleet_pb2.RequestBound(request_key="key-7", output_bound=321)],
            generated_unix_s=time.time(),
        )


class Recorder(BaseEnginePolicy):
    name = "recorder"

    def __init__(self) -> None:
        self.bounds: dict[str, int | None] = {}

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        for v in (*waiting, *running):
            self.bounds[v.request_id] = v.output_bound
        return Decision()


async def _finish(h: Handle) -> str:
    while True:
        _, _, reason = await asyncio.wait_for(h.events.get(), 10)
        if reason is not None:
            return reason


async def _until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_bounds_from_grpc_analyzer_reach_the_policy_and_its_loss_degrades() -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    slofleet_pb2_grpc.add_AnalyzerServicer_to_server(Bounds(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    settings = EngineSimSettings(
        speedup=100, analyzer=f"127.0.0.1:{port}", analyzer_interval_s=0.05, stale_after_s=0.5
    )
    recorder = Recorder()
    runner = EngineRunner(settings, policy=recorder)
    await runner.start()
    try:
        assert await _until(lambda: runner.analyzer.bounds_if_fresh(0.5) is not None)
        tags = EngineTags(targets=SLOTargets(RequestKind.BEST_EFFORT), request_key="key-7", output_bound=5)
        assert await _finish(runner.submit(Submission("r1", 10, 4, 400, tags))) == "stop"
        assert recorder.bounds["r1"] == 321
        assert not runner.policy.degraded_reason

        server.stop(grace=None).wait()
        assert await _until(lambda: runner.analyzer.bounds_if_fresh(0.5) is None)
        assert await _finish(runner.submit(Submission("r2", 10, 4, 4, tags))) == "length"
        assert "r2" not in recorder.bounds  # the policy was not asked: stock order
        assert runner.policy.degraded_reason == "analyzer unreachable"
    finally:
        await runner.stop()
        server.stop(grace=None)
