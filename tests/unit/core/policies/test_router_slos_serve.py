"""SLOs-Serve re-routing (§4.2): round-robin first pick, sequential re-route by attainability, backup."""

from __future__ import annotations

import random

import builders
from builders import FAST_GPU, latency, request

from slo_core.policies.base import ReplicaView, RequestView
from slo_core.policies.registry import make_router_policy
from slo_core.policies.slos_serve_router import SLOsServeReroute

NOW = 5.0
RNG = random.Random(0)


def lat(rid: str, prompt: int = 1000) -> RequestView:
    return request(rid, latency(1.0, 0.05), arrival_s=NOW, prompt=prompt, max_tokens=200, bound=200)


def replica(rid: str, queued: int) -> ReplicaView:
    """An SLOs-Serve replica with ``queued`` waiting 2500-token prompts."""
    return builders.replica(
        rid,
        snapshot_s=NOW,
        waiting=(lat(f"{rid}-{i}", prompt=2500) for i in range(queued)),
        seqs=128,
        batched=4096,
        profile=FAST_GPU,
        engine_policy="slos-serve",
    )


FULL, FREE = 4, 0  # four queued 2500-token prompts with 1 s TTFT leave no prefill budget


def test_full_replica_reroutes_to_the_next_one_that_can_attain_the_slo() -> None:
    router = SLOsServeReroute()
    assert not router.attainable(lat("x"), replica("a", FULL), NOW)
    assert router.attainable(lat("x"), replica("b", FREE), NOW)
    d = router.route(lat("x"), [replica("a", FULL), replica("b", FREE)], NOW, RNG)
    assert d.replica_id == "b" and "1 re-route" in d.reason and not d.to_best_effort


def test_first_pick_is_round_robin() -> None:
    router = SLOsServeReroute()
    reps = [replica("a", FREE), replica("b", FREE), replica("c", FREE)]
    assert [router.route(lat(f"q{i}"), reps, NOW, RNG).replica_id for i in range(4)] == ["a", "b", "c", "a"]


def test_routing_limit_then_backup_policy() -> None:
    reps = [replica("a", FULL), replica("b", FULL + 2), replica("c", FREE)]
    best_effort = SLOsServeReroute(routing_limit=2).route(lat("x"), reps, NOW, RNG)
    assert best_effort.replica_id == "a" and best_effort.to_best_effort  # least outstanding of those tried
    declined = SLOsServeReroute(routing_limit=2, fallback="decline").route(lat("x"), reps, NOW, RNG)
    assert declined.replica_id is None and declined.retry_after_s == 1.0
    assert SLOsServeReroute(routing_limit=3).route(lat("x"), reps, NOW, RNG).replica_id == "c"


def test_registry_builds_it_with_nested_scheduler_params() -> None:
    router = make_router_policy("slos-serve-reroute", {"routing_limit": 1, "scheduler": {"memory_units": 64}})
    assert isinstance(router, SLOsServeReroute)
    assert router.params.scheduler.memory_units == 64
