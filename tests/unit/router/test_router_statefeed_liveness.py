"""State streams that hang are cut and reconnected; the feed reads snapshots with the current tiers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_core.wire.keepalive import SERVER_OPTIONS
from slo_lab.fakepod import FakePod
from slo_proto import slofleet_pb2_grpc
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.statefeed import StateFeed


class HangingState(slofleet_pb2_grpc.StateServicer):
    """Sends one snapshot per Watch call, then keeps the stream open and silent."""

    def __init__(self, pod: FakePod) -> None:
        self.pod, self.calls = pod, 0

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls += 1
        yield self.pod.pod_state()
        await asyncio.Event().wait()


async def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_silent_stream_is_cancelled_and_reconnected_with_backoff() -> None:
    servicer = HangingState(FakePod("a"))
    server = grpc.aio.server(options=list(SERVER_OPTIONS))
    slofleet_pb2_grpc.add_StateServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    table = {"a": EndpointState(EndpointSpec("a", "http://unused", grpc_target=f"127.0.0.1:{port}"))}
    feed = StateFeed(table, interval_ms=20, stale_after_s=0.2, backoff_s=(0.05, 0.4))
    task = asyncio.create_task(feed.run(poll_s=0.02))
    try:
        await wait_until(lambda: servicer.calls >= 3)  # each hang is cut and a new stream is opened
        started = time.monotonic()
        await wait_until(lambda: servicer.calls >= 5)
        # later reconnects wait longer (0.1, 0.2, 0.4 s after 0.2 s of silence each): never a tight loop
        assert time.monotonic() - started >= 2 * 0.2 + 0.1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(grace=None)


def test_snapshots_are_read_with_the_tiers_in_force_now() -> None:
    chat = SLOTier("chat", RequestKind.LATENCY, PriorityClass("gold", 3.0), ttft_s=0.5, tbt_s=0.05)
    current: dict[str, dict[str, SLOTier]] = {"tiers": {}}
    feed = StateFeed({}, tiers=lambda: current["tiers"])
    assert feed._tiers() == {}
    current["tiers"] = {"chat": chat}  # the followed SLOPolicy changed
    assert feed._tiers() == {"chat": chat}
    fixed = StateFeed({}, tiers={"chat": chat})
    assert fixed._tiers() == {"chat": chat}
