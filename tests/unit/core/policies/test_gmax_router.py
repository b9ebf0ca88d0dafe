"""Power-of-K routing (JITServe §4.3): a request goes where its GMAX priority is highest."""

from __future__ import annotations

import random

import builders
from builders import profile, request

from slo_core.policies.base import ReplicaView, RequestView
from slo_core.policies.power_of_k import PowerOfK
from slo_core.routing import RoutingPipeline, SnapshotEndpoint
from slo_core.runtime_policy import AdmissionRule


def req(rid: str, bound: int = 100) -> RequestView:
    return request(rid, max_tokens=4096, bound=bound)


def replica(rid: str, *, step_ms: float = 20.0, waiting: int = 0, healthy: bool = True) -> ReplicaView:
    """A replica whose every step takes ``step_ms``, with ``waiting`` queued 1000-token requests."""
    return builders.replica(
        rid,
        waiting=(req(f"{rid}-w{i}", bound=1000) for i in range(waiting)),
        profile=profile(t_c_ms=step_ms, floor_ms=0.0),
        healthy=healthy,
    )


def test_prefers_the_faster_replica() -> None:
    d = PowerOfK().route(
        req("r"), [replica("slow", step_ms=80), replica("fast", step_ms=10)], 0.0, random.Random(0)
    )
    assert d.replica_id == "fast"
    scores = dict(d.scores)
    assert scores["fast"] > scores["slow"]


def test_avoids_a_replica_whose_queue_would_make_the_request_miss_its_deadline() -> None:
    # 40 queued requests × 1000 tokens over 8 slots at 20 ms: ~100 s of queue → the deadline is lost
    d = PowerOfK().route(req("r"), [replica("busy", waiting=40), replica("idle")], 0.0, random.Random(0))
    assert d.replica_id == "idle"
    assert dict(d.scores)["busy"] == 0.0


def test_k_samples_replicas_with_the_injected_generator() -> None:
    reps = [replica(f"r{i}", step_ms=10.0 + i) for i in range(6)]
    picks = {PowerOfK(k=1).route(req("r"), reps, 0.0, random.Random(seed)).replica_id for seed in range(20)}
    assert len(picks) > 1  # K = 1 is a random pick
    same = [PowerOfK(k=2).route(req("r"), reps, 0.0, random.Random(7)).replica_id for _ in range(3)]
    assert len(set(same)) == 1  # same seed, same answer
    assert PowerOfK().route(req("r"), reps, 0.0, random.Random(0)).replica_id == "r0"  # K = M sees all


def test_unhealthy_replicas_are_skipped_and_none_left_rejects() -> None:
    # the core pipeline filters; PowerOfK only ever sees usable replicas
    reps = [replica("down", step_ms=1.0, healthy=False), replica("up", step_ms=50.0)]
    pipe = RoutingPipeline(PowerOfK(), AdmissionRule("admit"), shuffle=False)
    r = pipe.route(req("r"), [SnapshotEndpoint(v) for v in reps], now_s=0.0, rng=random.Random(0))
    assert r.endpoint is not None and r.endpoint.endpoint_id == "up"
    d = PowerOfK().route(req("r"), [], 0.0, random.Random(0))
    assert d.replica_id is None and d.retry_after_s is not None
