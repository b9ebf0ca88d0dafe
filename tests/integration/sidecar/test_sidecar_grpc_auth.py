"""The sidecar's gRPC State/Analyzer services take only calls that carry a token made with the tag-key
ring: the router's state feed and the vLLM plugin's analyzer client pass; no token, a wrong key, a
stale token, a token for another method or one made with a key older than the previous one get
UNAUTHENTICATED before any handler runs (no Watch stream is opened) and are counted. Real gRPC servers
on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from slo_core.wire.callauth import ANALYZER_GET_BOUNDS, ANALYZER_REPORT, METADATA_KEY, STATE_WATCH, call_token
from slo_core.wire.keyring import KeyRing
from slo_lab.fake_engine import FakeEngine, serve_fake_engine
from slo_proto import slofleet_pb2, slofleet_pb2_grpc
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.statefeed import StateFeed
from slo_sidecar import grpc_service
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar
from slo_vllm_plugin.analyzer_client import grpc_fetch, grpc_send
from slo_vllm_plugin.report import EngineSnapshot, to_report

OLDEST, PREVIOUS, CURRENT = b"o" * 32, b"p" * 32, b"c" * 32
RING = KeyRing(CURRENT, PREVIOUS, rotated_at_s=time.time() - 3600)


def sidecar(url: str) -> Sidecar:
    sc = Sidecar(
        knobs=SidecarKnobs(drain_timeout_s=3),
        config=PolicyConfig.default(),
        engine_url=url,
        estimator=FallbackEstimator(),
    )
    sc.keys = lambda: RING
    return sc


def refused(sc: Sidecar) -> dict[tuple[str, str], float]:
    out = {}
    for metric in sc.metrics.grpc_unauthenticated.collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                out[(s.labels["method"], s.labels["reason"])] = s.value
    return out


def token(key: bytes, method: str, at_s: float | None = None) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, call_token(key, method, time.time() if at_s is None else at_s)),)


@pytest.fixture
def counted_states(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many snapshots the State service built (a refused call must build none)."""
    calls: list[int] = []
    real = grpc_service.pod_state

    def counting(sc: Sidecar, aggregate_only: bool = False) -> Any:
        calls.append(1)
        return real(sc, aggregate_only)

    monkeypatch.setattr(grpc_service, "pod_state", counting)
    return calls


async def watch_first(channel: grpc.aio.Channel, metadata: Any) -> Any:
    call = slofleet_pb2_grpc.StateStub(channel).Watch(
        slofleet_pb2.WatchRequest(interval_ms=20), metadata=metadata
    )
    async for msg in call:
        call.cancel()
        return msg
    return None


@pytest.mark.parametrize(
    ("make_metadata", "reason"),
    [  # made when the test runs: a token made at collection time may be stale by then
        (lambda: None, "no token"),
        (lambda: token(b"x" * 32, STATE_WATCH), "wrong key"),
        (lambda: token(OLDEST, STATE_WATCH), "wrong key"),  # a key older than the previous one
        (lambda: token(CURRENT, ANALYZER_GET_BOUNDS), "wrong key"),  # a token is bound to its method
        (lambda: token(CURRENT, STATE_WATCH, at_s=time.time() - 3600), "stale token"),
        (lambda: ((METADATA_KEY, "123.abc"),), "malformed token"),
    ],
)
async def test_a_watch_without_a_valid_token_is_refused_before_any_stream_opens(
    counted_states: list[int], make_metadata: Callable[[], Any], reason: str
) -> None:
    metadata = make_metadata()
    async with serve_fake_engine(FakeEngine()) as url:
        sc = sidecar(url)
        async with running_sidecar(sc) as run, grpc.aio.insecure_channel(run.grpc_target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await watch_first(channel, metadata)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert counted_states == [], "no snapshot was built for a refused call"
            assert refused(sc) == {(STATE_WATCH, reason): 1.0}
            # the same channel with a valid token (current or previous key) gets the stream
            for key in (CURRENT, PREVIOUS):
                msg = await watch_first(channel, token(key, STATE_WATCH))
                assert msg is not None and msg.healthy
            assert refused(sc) == {(STATE_WATCH, reason): 1.0}


async def test_snapshot_and_bounds_need_a_token_too_and_the_plugins_client_brings_one() -> None:
    async with serve_fake_engine(FakeEngine()) as url:
        sc = sidecar(url)
        async with running_sidecar(sc) as run, grpc.aio.insecure_channel(run.grpc_target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await slofleet_pb2_grpc.StateStub(channel).Snapshot(slofleet_pb2.WatchRequest())
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await slofleet_pb2_grpc.AnalyzerStub(channel).GetBounds(slofleet_pb2.BoundsRequest())
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            # the vLLM plugin's (synchronous) analyzer client, with and without the key ring
            good = grpc_fetch(run.grpc_target, keys=lambda: RING)
            assert await asyncio.to_thread(good) == {}
            with pytest.raises(grpc.RpcError) as sync_err:
                await asyncio.to_thread(grpc_fetch(run.grpc_target))
            assert sync_err.value.code() is grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
            assert set(refused(sc)) == {
                ("/slofleet.v1.State/Snapshot", "no token"),
                (ANALYZER_GET_BOUNDS, "no token"),
            }
            assert refused(sc)[(ANALYZER_GET_BOUNDS, "no token")] == 2.0


async def test_the_routers_state_feed_follows_an_authenticated_sidecar_and_not_without_the_key() -> None:
    async with serve_fake_engine(FakeEngine()) as url:
        sc = sidecar(url)
        async with running_sidecar(sc) as run:
            spec = EndpointSpec("pod-a", "http://unused", grpc_target=run.grpc_target)
            keyed = {"pod-a": EndpointState(spec)}
            bare = {"pod-a": EndpointState(spec)}
            feeds = [
                StateFeed(keyed, interval_ms=20, backoff_s=(0.05, 0.2), keys=lambda: RING),
                StateFeed(bare, interval_ms=20, backoff_s=(0.05, 0.2)),
            ]
            tasks = [asyncio.create_task(f.run(poll_s=0.02)) for f in feeds]
            try:
                deadline = time.monotonic() + 10
                while not keyed["pod-a"].feed_ok:
                    assert time.monotonic() < deadline, "the keyed feed never got a snapshot"
                    await asyncio.sleep(0.02)
                while refused(sc).get((STATE_WATCH, "no token"), 0) < 2:  # it retried, refused again
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.02)
                assert not bare["pod-a"].feed_ok
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)


async def test_engine_reports_need_a_token_and_the_plugins_sender_brings_one() -> None:
    """Engine mode: the plugin's (and engine-sim's) Analyzer.Report feeds the pod's scheduler and the
    routers' state, so it is authenticated like every other call."""
    snapshot = EngineSnapshot(
        snapshot_unix_s=time.time(), step=1, waiting=0, running=0, kv_usage=0.0, kv_cache_tokens=1024,
        requests=(),
    )  # fmt: skip
    async with serve_fake_engine(FakeEngine()) as url:
        sc = sidecar(url)
        async with running_sidecar(sc) as run:
            good = grpc_send(run.grpc_target, keys=lambda: RING)
            assert await asyncio.to_thread(good, to_report(snapshot, [])) == ({}, {})
            with pytest.raises(grpc.RpcError) as err:
                await asyncio.to_thread(grpc_send(run.grpc_target), to_report(snapshot, []))
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
            assert refused(sc) == {(ANALYZER_REPORT, "no token"): 1.0}
