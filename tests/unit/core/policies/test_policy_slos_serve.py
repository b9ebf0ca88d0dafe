"""SLOs-Serve engine policy (§3.1, §4.1): soft admission, guaranteed admitted set, best-effort tier."""

from __future__ import annotations

import random

import builders
from builders import BE, FAST_GPU, latency, request

from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.slos_serve import SLOsServe, SLOsServeParams, dp_view, to_item
from slo_core.policies.slos_serve_dp import schedule_feasible

PROFILE = FAST_GPU
NOW = 20.0
RNG = random.Random(0)


def lat(
    rid: str,
    *,
    prompt: int = 1000,
    ttft_s: float = 1.0,
    arrival: float = NOW,
    gen: int = 0,
    weight: float = 1.0,
) -> RequestView:
    """A streaming request bounded at 200 tokens; one that has generated is running (all computed)."""
    slo = latency(ttft_s, 0.05, weight=weight)
    return request(
        rid, slo, arrival_s=arrival, prompt=prompt, max_tokens=200, gen=gen, prefilled=gen > 0, bound=200
    )


def be(rid: str, arrival: float = NOW, gen: int = 0) -> RequestView:
    """A best-effort request of 300 tokens in, bounded at 100 out; running once it has generated."""
    return request(
        rid, BE, arrival_s=arrival, prompt=300, max_tokens=100, gen=gen, prefilled=gen > 0, bound=100
    )


def engine(*, seqs: int = 128) -> EngineView:
    return builders.engine(NOW, seqs=seqs, batched=4096, kv_total=10_000, profile=PROFILE)


BURST = [lat(f"b{i:02d}", arrival=NOW - 0.001 * (50 - i)) for i in range(50)]


def test_a_burst_is_split_into_a_feasible_admitted_set_and_a_best_effort_tier() -> None:
    policy = SLOsServe(max_new_per_call=64)
    d = policy.decide(BURST, [], engine(), RNG)
    assert 0 < len(policy.admitted) < 50
    assert policy.admitted | policy.best_effort == {r.request_id for r in BURST}
    # admitted first (earliest prefill deadline first), best-effort after in arrival order
    n = len(policy.admitted)
    assert set(d.admit[:n]) == policy.admitted
    assert list(d.admit[n:]) == sorted(policy.best_effort)
    assert d.hold_unlisted and d.reject == ()
    view = dp_view(
        [],
        NOW,
        PROFILE,
        policy.params,
        kv_tokens_total=160_000,
        max_num_seqs=128,
        max_num_batched_tokens=4096,
    )
    items = [
        to_item(r, NOW, PROFILE, policy.params, view.unit_tokens, forced=False)
        for r in BURST
        if r.request_id in policy.admitted
    ]
    assert schedule_feasible(items, NOW, view.capacity)


def test_without_the_best_effort_tier_declined_requests_are_rejected() -> None:
    policy = SLOsServe(best_effort_tier=False, max_new_per_call=64)
    d = policy.decide(BURST, [], engine(), RNG)
    assert set(d.reject) == {r.request_id for r in BURST} - policy.admitted
    assert set(d.admit) == policy.admitted


def test_admitted_requests_stay_guaranteed_and_block_infeasible_newcomers() -> None:
    policy = SLOsServe()
    first = [lat(f"a{i}", prompt=2500, ttft_s=1.0) for i in range(3)]
    policy.decide(first, [], engine(), RNG)
    assert policy.admitted == {"a0", "a1", "a2"}
    newcomer = lat("late", prompt=2500, ttft_s=0.9, arrival=NOW)
    policy.decide([*first, newcomer], [], engine(), RNG)
    assert "late" in policy.best_effort and {"a0", "a1", "a2"} <= policy.admitted


def test_best_effort_running_requests_are_preempted_for_admitted_ones() -> None:
    policy = SLOsServe()
    running = [be(f"be{i}", NOW - 5 + i, gen=10) for i in range(4)]
    d = policy.decide([lat("slo")], running, engine(seqs=4), RNG)
    assert d.preempt == ("be3",)
    assert "slo" in d.admit and policy.best_effort >= {"be0", "be1", "be2"}
    assert set(d.running_order or ()) == {"be0", "be1", "be2"}


def test_running_decodes_are_forced_and_ordered_by_next_token_due() -> None:
    policy = SLOsServe()
    running = [lat("r-late", gen=30, arrival=NOW - 2.5), lat("r-early", gen=5, arrival=NOW - 2.5)]
    d = policy.decide([], running, engine(), RNG)
    assert policy.admitted == {"r-late", "r-early"}
    assert d.running_order == ("r-early", "r-late")


def test_value_by_priority_prefers_heavier_requests_under_contention() -> None:
    reqs = [lat(f"lo{i}", prompt=3000, weight=1.0) for i in range(3)] + [lat("hi", prompt=3000, weight=5.0)]
    policy = SLOsServe(value="request")
    policy.decide(reqs, [], engine(), RNG)
    assert "hi" in policy.admitted and len(policy.admitted) < 4
    assert SLOsServeParams().best_effort_tier
