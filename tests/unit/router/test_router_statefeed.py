"""The router's load view from sidecar state streams: conversion, liveness, reconnects, staleness."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from slo_core.policies.go_routing import GoRouting
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.fakepod import FakePod, RunningPod, _Live
from slo_proto import slofleet_pb2
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.podstate import replica_view
from slo_router.statefeed import StateFeed


def pod_state(**kw: object) -> slofleet_pb2.PodState:
    base: dict[str, object] = {
        "pod": "p",
        "snapshot_unix_s": 1000.0,
        "healthy": True,
        "capabilities": slofleet_pb2.Capabilities(models=["m"], max_context_tokens=4096, gpu_class="h100"),
    }
    return slofleet_pb2.PodState(**{**base, **kw})


def test_snapshot_is_placed_on_the_router_clock_by_its_age() -> None:
    msg = pod_state(snapshot_unix_s=999.5)
    view = replica_view(msg, replica_id="a", now_s=50.0, wall_now_s=1000.0)
    assert view.snapshot_s == 49.5
    assert view.capabilities.gpu_class == "h100" and view.capabilities.max_context_tokens == 4096
    # a pod clock ahead of ours never makes a snapshot from the future
    ahead = replica_view(pod_state(snapshot_unix_s=1003.0), replica_id="a", now_s=50.0, wall_now_s=1000.0)
    assert ahead.snapshot_s == 50.0


def test_requests_keep_their_phase_kind_and_deadline() -> None:
    chat = SLOTier("chat", RequestKind.LATENCY, PriorityClass("gold", 3.0), ttft_s=0.5, tbt_s=0.05)
    reqs = [
        slofleet_pb2.RequestState(
            request_id="w",
            kind="deadline",
            phase="waiting",
            prompt_tokens=100,
            output_bound=50,
            arrival_unix_s=990.0,
            deadline_unix_s=1020.0,
            priority_weight=2.0,
        ),
        # decoding: the sidecar reports its measured TTFT/TBT and its next token's due time
        slofleet_pb2.RequestState(
            request_id="d",
            kind="latency",
            tier="chat",
            phase="decode",
            prompt_tokens=10,
            generated_tokens=5,
            arrival_unix_s=995.0,
            ttft_s=0.3,
            tbt_s=0.04,
            deadline_unix_s=995.75,
        ),
        # not started: due time − arrival is its own TTFT target (a client override of the tier's)
        slofleet_pb2.RequestState(
            request_id="q",
            kind="latency",
            tier="chat",
            phase="waiting",
            prompt_tokens=10,
            arrival_unix_s=999.0,
            deadline_unix_s=1001.0,
        ),
    ]
    view = replica_view(
        pod_state(requests=reqs), replica_id="a", now_s=0.0, wall_now_s=1000.0, tiers={"chat": chat}
    )
    (w, q), (d,) = view.waiting, view.running
    assert w.kind is RequestKind.DEADLINE and w.deadline_at_s == 20.0 and w.arrival_s == -10.0
    assert w.slo.deadline_s == 30.0 and w.priority_weight == 2.0 and w.computed_tokens == 0
    assert d.kind is RequestKind.LATENCY and d.deadline_at_s is None
    assert (d.slo.ttft_s, d.slo.tbt_s) == (0.5, 0.05)  # the tier's targets, not the measured values
    assert d.computed_tokens == 15  # decoding: its prompt and output are in the KV cache
    assert q.slo.ttft_s == 2.0
    assert view.outstanding_tokens == 100 + 50 + (256 - 5) + 10 + 256


def test_draining_or_unhealthy_pods_are_not_healthy_replicas() -> None:
    assert not replica_view(pod_state(draining=True), replica_id="a", now_s=0, wall_now_s=1000).healthy
    assert not replica_view(pod_state(healthy=False), replica_id="a", now_s=0, wall_now_s=1000).healthy


def test_go_routing_compensates_for_the_age_of_a_snapshot() -> None:
    busy = [
        slofleet_pb2.RequestState(request_id=f"r{i}", kind="best-effort", phase="waiting", prompt_tokens=4000)
        for i in range(4)
    ]
    fresh = replica_view(
        pod_state(requests=busy, snapshot_unix_s=1000.0), replica_id="a", now_s=10, wall_now_s=1000
    )
    old = replica_view(
        pod_state(requests=busy, snapshot_unix_s=999.9), replica_id="a", now_s=10, wall_now_s=1000
    )
    req = fresh.waiting[0]
    policy = GoRouting()
    assert policy.estimate(req, old, 10.0).exec_s < policy.estimate(req, fresh, 10.0).exec_s


async def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_stream_feeds_the_view_and_loss_marks_the_pod_unusable_until_it_returns() -> None:
    pod = FakePod("a")
    pod.live["r1"] = _Live("r1", "gold", 100, 20, time.time())
    async with RunningPod(pod) as running:
        table = {"a": EndpointState(EndpointSpec("a", running.url, grpc_target=running.grpc_target))}
        assert not table["a"].usable  # a pod with a state stream is not used before its first report
        feed = StateFeed(table, interval_ms=20, backoff_s=(0.05, 0.2))
        task = asyncio.create_task(feed.run(poll_s=0.02))
        try:
            await wait_until(lambda: table["a"].current_view() is not None)
            assert table["a"].usable
            assert [r.request_id for r in table["a"].current_view().waiting] == ["r1"]  # type: ignore[union-attr]
            port = running.grpc_port
            await running.kill()
            await wait_until(lambda: not table["a"].usable)
            async with RunningPod(FakePod("a"), grpc_port=port):  # comes back on the same address
                await wait_until(lambda: table["a"].usable, timeout_s=5)
                view = table["a"].current_view()
                assert view is not None and not view.waiting
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_silent_stream_goes_stale_and_removed_endpoints_stop_being_watched() -> None:
    pod = FakePod("a")
    async with RunningPod(pod) as running:
        table = {"a": EndpointState(EndpointSpec("a", running.url, grpc_target=running.grpc_target))}
        feed = StateFeed(table, interval_ms=20, stale_after_s=0.3)
        task = asyncio.create_task(feed.run(poll_s=0.02))
        try:
            await wait_until(lambda: table["a"].usable)
            feed.interval_ms = 0  # new streams only; the live one keeps its pace
            table["a"].last_state_s = time.monotonic() - 1.0  # as if nothing came for a second
            feed._expire_stale()
            assert not table["a"].usable
            await wait_until(lambda: table["a"].usable)  # the next snapshot revives it
            del table["a"]
            await wait_until(lambda: not feed._tasks)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_requests_sent_since_the_snapshot_count_as_load_until_covered() -> None:
    ep = EndpointState(EndpointSpec("a", "http://a"))
    view = replica_view(pod_state(snapshot_unix_s=1000.0), replica_id="a", now_s=10.0, wall_now_s=1000.0)
    ep.update_view(view, 10.0)
    probe = GoRouting()
    req = replica_view(
        pod_state(
            requests=[
                slofleet_pb2.RequestState(
                    request_id="x", kind="best-effort", phase="waiting", prompt_tokens=2000
                )
            ]
        ),
        replica_id="a",
        now_s=10.0,
        wall_now_s=1000.0,
    ).waiting[0]
    before = probe.estimate(req, ep.replica_view(10.01), 10.01).exec_s
    ep.note_sent(req, 10.01)
    assert probe.estimate(req, ep.replica_view(10.01), 10.01).exec_s > before
    newer = replica_view(pod_state(snapshot_unix_s=1001.0), replica_id="a", now_s=11.0, wall_now_s=1001.0)
    ep.update_view(newer, 11.0)  # the sidecar's snapshot now covers it
    assert not ep.sent


def test_snapshots_are_converted_only_when_a_dispatch_reads_them() -> None:
    ep = EndpointState(EndpointSpec("a", "http://a", grpc_target="a:1"))
    built: list[int] = []

    def build(n: int) -> Callable[[], Any]:
        def make() -> Any:
            built.append(n)
            return replica_view(pod_state(), replica_id="a", now_s=0.0, wall_now_s=1000.0)

        return make

    caps = replica_view(pod_state(), replica_id="a", now_s=0, wall_now_s=1000).capabilities
    for n in range(5):
        ep.update_lazy(build(n), snapshot_s=0.0, healthy=n != 3, capabilities=caps, now_s=0.0)
        assert ep.usable is (n != 3)  # health is known without converting
    assert ep.reported_capabilities() == caps and not built
    assert ep.replica_view(0.0).capabilities.gpu_class == "h100"
    assert built == [4]  # only the newest, once


def test_a_pods_profile_is_slowed_by_the_step_time_correction_it_reports_and_garbage_counts_as_one() -> None:
    from slo_core.perf import load_profile, sped_up

    named = load_profile("h100-llama3-8b-tp1")

    def profile_of(correction: float) -> object:
        msg = pod_state(profile=named.name, step_time_correction=correction)
        return replica_view(msg, replica_id="a", now_s=1.0, wall_now_s=1000.0).profile

    slow = profile_of(4.0)
    assert slow == sped_up(named, 0.25)
    assert slow.iteration_time_s([(512, 512)], [1000]) == pytest.approx(  # type: ignore[attr-defined]
        4 * named.iteration_time_s([(512, 512)], [1000])
    )
    for garbage in (0.0, -2.0, float("nan"), float("inf"), 1e12):
        assert profile_of(garbage) == named
