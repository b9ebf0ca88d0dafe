"""Baseline routers: round-robin cycles, min-load picks the fewest outstanding tokens, p2c samples two."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import builders
import pytest
from builders import request

from slo_core.policies.base import ReplicaView, RequestView, RouterPolicy
from slo_core.policies.registry import make_router_policy
from slo_core.policies.routers import MinLoad, PowerOfTwo, RoundRobin
from slo_core.routing import RoutingPipeline, SnapshotEndpoint
from slo_core.runtime_policy import AdmissionRule


def req(rid: str = "q", **kw: Any) -> RequestView:
    return request(rid, max_tokens=200, **kw)


def replica(rid: str, load: int | None = None, **kw: Any) -> ReplicaView:
    """A replica reporting ``load`` outstanding tokens (None: summed from its queues)."""
    return builders.replica(rid, load=load, kv_total=100, **kw)


def routed(policy: RouterPolicy, view: RequestView, reps: list[ReplicaView]) -> str | None:
    """The replica the core routing pipeline (its filters, then ``policy``) sends ``view`` to."""
    pipe = RoutingPipeline(policy, AdmissionRule("admit"), shuffle=False)
    r = pipe.route(view, [SnapshotEndpoint(v) for v in reps], now_s=0.0, rng=random.Random(0))
    return r.endpoint.endpoint_id if r.endpoint is not None else None


@pytest.mark.parametrize(
    ("name", "cls"), [("round-robin", RoundRobin), ("min-load", MinLoad), ("p2c", PowerOfTwo)]
)
def test_registry_builds_each_router(name: str, cls: type) -> None:
    policy = make_router_policy(name)
    assert type(policy) is cls and isinstance(policy, RouterPolicy) and policy.name == name


def test_round_robin_cycles_in_id_order_over_healthy_replicas() -> None:
    rr = RoundRobin()
    reps = [replica("r2"), replica("r0"), replica("bad", healthy=False), replica("r1")]
    picks = [routed(rr, req(), reps) for _ in range(5)]
    assert picks == ["r0", "r1", "r2", "r0", "r1"]


def test_routers_reject_when_no_replica_can_hold_the_prompt() -> None:
    # the one eligibility rule (slo_core.routing): the context must hold prompt + max output (200 here)
    reps = [replica("small", ctx=512), replica("down", healthy=False)]
    for policy in (RoundRobin(), MinLoad(), PowerOfTwo()):
        assert routed(policy, req(prompt=400), reps) is None
        d = policy.route(req(), [], 0.0, random.Random(0))
        assert d.replica_id is None and d.retry_after_s is not None
    assert routed(MinLoad(), req(prompt=312), reps) == "small"


def test_min_load_picks_fewest_outstanding_tokens() -> None:
    reps = [replica("a", 900), replica("b", 300), replica("c", 300), replica("d", 5, healthy=False)]
    assert routed(MinLoad(), req(), reps) == "b"
    d = MinLoad().route(req(), reps[:3], 0.0, random.Random(0))
    assert d.replica_id == "b"  # tie with c: the first given
    assert dict(d.scores) == {"a": -900.0, "b": -300.0, "c": -300.0}


def test_min_load_counts_tokens_from_snapshots() -> None:
    # x: 100 unprefilled prompt + 200 to generate; y: a running request with 150 tokens still to generate
    busy = replica("x", waiting=(req("w1"),))
    other = replica("y", running=(req("r1", computed_tokens=100, gen=50),))
    assert busy.outstanding_tokens == 300 and other.outstanding_tokens == 150
    assert MinLoad().route(req(), [busy, other], 0.0, random.Random(0)).replica_id == "y"
    bounded = replica("z", running=(req("r2", computed_tokens=100, bound=120, gen=100),))
    assert bounded.outstanding_tokens == 20


def test_p2c_keeps_the_less_loaded_of_two_samples() -> None:
    reps = [replica("light", 10), replica("mid", 500), replica("heavy", 5000)]
    rng = random.Random(42)
    picks = Counter(PowerOfTwo().route(req(), reps, 0.0, rng).replica_id for _ in range(300))
    assert picks["heavy"] == 0  # it always loses its pair
    # light is in 2 of the 3 pairs, mid wins only against heavy
    assert picks["light"] > picks["mid"] > 0
    assert PowerOfTwo().route(req(), [replica("only", 7)], 0.0, rng).replica_id == "only"


def test_p2c_is_reproducible_with_the_injected_rng() -> None:
    reps = [replica(f"r{i}", 10 * i) for i in range(6)]
    a = [PowerOfTwo().route(req(), reps, 0.0, r).replica_id for r in [random.Random(5)] for _ in range(20)]
    b = [PowerOfTwo().route(req(), reps, 0.0, r).replica_id for r in [random.Random(5)] for _ in range(20)]
    assert a == b
