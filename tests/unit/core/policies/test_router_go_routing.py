"""GoRouting (PROSERVE §4.3): fill the busier replica that still meets the SLO, keep the idle one free."""

from __future__ import annotations

import dataclasses
import random

import builders
import pytest
from builders import SMALL_GPU, latency, request

from slo_core.policies.base import ReplicaView, RequestView
from slo_core.policies.go_routing import GoRouting
from slo_core.policies.seed_estimates import decode_core_s, overhead_s, prefill_core_s
from slo_core.routing import RoutingPipeline, SnapshotEndpoint
from slo_core.runtime_policy import AdmissionRule

NOW = 50.0
RNG = random.Random(0)


def req(
    rid: str, *, ttft_s: float = 5.0, prompt: int = 1000, gen: int = 0, weight: float = 1.0
) -> RequestView:
    """A streaming request of at most 100 tokens; one that has generated is running (all computed)."""
    slo = latency(ttft_s, weight=weight)
    return request(rid, slo, arrival_s=NOW, prompt=prompt, max_tokens=100, gen=gen, prefilled=gen > 0)


def replica(
    rid: str, queued: int, *, decoding: int = 0, snapshot_s: float = NOW, ttft_s: float = 5.0
) -> ReplicaView:
    """A SlideBatching replica with ``queued`` waiting 1000-token prompts and ``decoding`` running."""
    return builders.replica(
        rid,
        snapshot_s=snapshot_s,
        waiting=(req(f"{rid}-w{i}", ttft_s=ttft_s) for i in range(queued)),
        running=(req(f"{rid}-d{i}", gen=5, prompt=500) for i in range(decoding)),
        kv_total=6000,
        kv_free=5000,
        seqs=256,
        profile=SMALL_GPU,
        engine_policy="slide-batching",
    )


NEW = req("new", ttft_s=2.0)


def test_fills_the_busier_replica_that_still_meets_the_slo() -> None:
    light, busy = replica("light", 3), replica("busy", 8)
    d = GoRouting().route(NEW, [light, busy], NOW, RNG)
    assert d.replica_id == "busy"
    assert dict(d.scores)["busy"] == dict(d.scores)["light"] > 0


def test_leaves_an_idle_replica_free_when_mu_is_zero() -> None:
    d = GoRouting(mu=0.0).route(NEW, [replica("idle", 0), replica("busy", 8)], NOW, RNG)
    assert d.replica_id == "busy"


def test_a_replica_below_mu_is_used_first_to_avoid_idling() -> None:
    d = GoRouting(mu=0.1).route(NEW, [replica("idle", 0), replica("busy", 8)], NOW, RNG)
    assert d.replica_id == "idle"


def test_avoids_a_replica_pushed_past_lambda() -> None:
    light, busy = replica("light", 3), replica("busy", 13)  # busy + req ≈ 1.6 s > λ·TTFT = 1.2 s
    d = GoRouting(lam=0.6, queue_order="arrival").route(NEW, [light, busy], NOW, RNG)
    assert d.replica_id == "light"


def test_a_replica_where_the_request_would_make_others_miss_is_no_candidate() -> None:
    # Existing requests on "tight" only just fit their 1.0 s TTFT; adding one more breaks them.
    tight = replica("tight", 8, ttft_s=1.0)
    roomy = replica("roomy", 12)
    g = GoRouting(queue_order="arrival")
    assert g.estimate(NEW, tight, NOW).delta < 0 < g.estimate(NEW, roomy, NOW).delta
    assert g.route(NEW, [tight, roomy], NOW, RNG).replica_id == "roomy"


def test_no_gain_anywhere_falls_back_to_least_loaded() -> None:
    hopeless = req("hopeless", ttft_s=0.01, prompt=4000)
    d = GoRouting(queue_order="arrival").route(hopeless, [replica("a", 6), replica("b", 2)], NOW, RNG)
    assert d.replica_id == "b" and d.reason.startswith("fallback")


def test_on_an_slo_aware_engine_a_request_waits_only_for_the_work_due_before_it() -> None:
    # 13 queued 1000-token prompts due in 5 s take ~1.6 s together. A chat request due in 1.0 s misses
    # behind all of them (the paper's arrival order), but an SLO-aware engine serves it first: it gains
    # there, and still nothing on an FCFS replica in the same state.
    urgent = req("urgent", ttft_s=1.0)
    busy = replica("busy", 13)
    fifo = dataclasses.replace(busy, engine_policy="fcfs")
    g = GoRouting()
    assert GoRouting(queue_order="arrival").estimate(urgent, busy, NOW).delta <= 0
    e = g.estimate(urgent, busy, NOW)
    assert e.delta > 0 and e.exec_with_req_s < 0.2 < e.exec_s
    assert g.estimate(urgent, fifo, NOW) == GoRouting(queue_order="arrival").estimate(urgent, fifo, NOW)
    # served first, it delays everything due later: a queued request it pushes past its due time costs
    # its weight (here as much as the new one gains: no net gain, so no candidate)
    tight = replica("tight", 8, ttft_s=1.0)
    early = req("early", ttft_s=0.5)
    assert g.estimate(early, tight, NOW).delta <= 0 < g.estimate(early, replica("roomy", 8), NOW).delta


def test_a_request_already_past_its_due_time_does_not_shrink_every_other_requests_budget() -> None:
    # t_budget is the tightest time any queued request still has; one whose first token is already late
    # has none left (it gains nothing either way), and counting it set the budget to η, below one step
    # of 200 decodes: the replica looked infinitely slow and every arrival was demoted or refused.
    late = dataclasses.replace(req("late", ttft_s=1.0), arrival_s=NOW - 5.0)
    pod = replica("p", 2, decoding=200)
    with_late = dataclasses.replace(pod, waiting=(*pod.waiting, late))
    g = GoRouting()
    assert g.estimate(NEW, with_late, NOW).delta > 0
    assert g.estimate(NEW, with_late, NOW).exec_with_req_s < float("inf")


@pytest.mark.parametrize("due_in_s", [0.001, 0.02, 0.036])
def test_a_request_due_sooner_than_one_decode_iteration_does_not_shrink_the_budget_either(
    due_in_s: float,
) -> None:
    # Not yet past due, but due sooner than one iteration of the pod's 200 decodes plus its own prefill:
    # it cannot get its first token in time whatever is routed there. Counted, it set the budget below
    # that iteration and every arrival looked infinitely slow (the live demo demoted each call routed
    # in such a moment; which moments those were depended on how stale the router's snapshot was).
    g = GoRouting()
    pod = replica("p", 2, decoding=200)
    prof = pod.profile
    assert prof is not None
    step_s = overhead_s(prof) + 200 * decode_core_s(prof, 505)  # 35 ms
    assert due_in_s < step_s + prefill_core_s(prof, 1000, 0), "due sooner than it can be served"
    soon = dataclasses.replace(req("soon", ttft_s=1.0), arrival_s=NOW - 1.0 + due_in_s)
    with_soon = dataclasses.replace(pod, waiting=(*pod.waiting, soon))
    est = g.estimate(NEW, with_soon, NOW)
    assert est.delta > 0 and est.exec_with_req_s < float("inf")
    # the budget is what the other requests leave: the same estimate as without the hopeless one, but
    # for its own prefill queued before the new request
    without = g.estimate(NEW, pod, NOW)
    assert without.delta == est.delta and est.exec_with_req_s >= without.exec_with_req_s


def test_a_request_that_can_still_make_it_sets_the_budget() -> None:
    # due in 1 s on a pod whose decode iteration takes a few ms: it can still get its first token, so
    # it is the tightest budget, and the estimate is the paper's (a smaller budget, a larger EXEC)
    g = GoRouting()
    pod = replica("p", 2, decoding=20)
    tight = dataclasses.replace(req("tight", ttft_s=1.0), arrival_s=NOW)
    relaxed = g.estimate(NEW, pod, NOW)
    with_tight = g.estimate(NEW, dataclasses.replace(pod, waiting=(*pod.waiting, tight)), NOW)
    assert with_tight.exec_with_req_s > relaxed.exec_with_req_s


def test_decode_term_and_snapshot_age_change_the_estimate() -> None:
    g = GoRouting()
    base = g.estimate(NEW, replica("r", 4), NOW).exec_s
    with_decodes = g.estimate(NEW, replica("r", 4, decoding=100), NOW).exec_s
    stale = g.estimate(NEW, replica("r", 4, snapshot_s=NOW - 0.2), NOW).exec_s
    assert with_decodes > base
    assert abs(stale - (base - 0.2)) < 1e-9


def test_unhealthy_replicas_are_skipped_and_none_left_rejects() -> None:
    sick = dataclasses.replace(replica("sick", 0), healthy=False)
    # the core pipeline filters; GoRouting only ever sees usable replicas
    pipe = RoutingPipeline(GoRouting(), AdmissionRule("admit"), shuffle=False)
    r = pipe.route(NEW, [SnapshotEndpoint(sick), SnapshotEndpoint(replica("ok", 20))], now_s=NOW, rng=RNG)
    assert r.endpoint is not None and r.endpoint.endpoint_id == "ok"
    r = pipe.route(NEW, [SnapshotEndpoint(sick)], now_s=NOW, rng=RNG)
    assert r.endpoint is None and r.filtered["unhealthy"] == 1 and r.outcome == "no-replica"
    assert GoRouting().route(NEW, [], NOW, RNG).replica_id is None


def test_a_decoding_request_counts_as_decoding_however_the_engine_counts_its_last_token() -> None:
    # An engine counts a decoding request's newest sampled token as not yet computed (vLLM's
    # num_computed_tokens = num_tokens - 1, the simulator's engine alike); the router's state stream
    # reports a decode as all computed. Both are the same engine state and must give the same estimate:
    # decoding chat whose first-token deadline passed long ago is decode load, not a prefill queue
    # member that makes every arrival look hopeless.
    def decoding(rid: str, computed_less: int) -> RequestView:
        r = request(rid, latency(2.0), arrival_s=NOW - 30.0, prompt=500, max_tokens=100, gen=40)
        return dataclasses.replace(r, computed_tokens=500 + 40 - computed_less)

    def pod(computed_less: int) -> ReplicaView:
        return builders.replica(
            "p",
            snapshot_s=NOW,
            waiting=(req(f"w{i}") for i in range(3)),
            running=(decoding(f"d{i}", computed_less) for i in range(20)),
            kv_total=60000,
            kv_free=40000,
            seqs=256,
            profile=SMALL_GPU,
            engine_policy="gmax",
        )

    g = GoRouting()
    engine_counted, stream_counted = g.estimate(NEW, pod(1), NOW), g.estimate(NEW, pod(0), NOW)
    assert engine_counted.delta == stream_counted.delta
    assert engine_counted.exec_s == pytest.approx(stream_counted.exec_s, rel=1e-3)  # KV differs by a token
    assert engine_counted.delta > 0, "a request that fits in time must gain"
    preempted = dataclasses.replace(decoding("x", 0), computed_tokens=0)  # must recompute: a prefill again
    with_preempted = dataclasses.replace(pod(1), running=(*pod(1).running, preempted))
    assert g.estimate(NEW, with_preempted, NOW).exec_s > engine_counted.exec_s
