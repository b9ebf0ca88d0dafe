"""SlideBatching (PROSERVE §4.2): the URGENT set slides with load; the order flips to density-first."""

from __future__ import annotations

import random

import builders
import pytest
from builders import SMALL_GPU, latency, request

from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.seed_estimates import prefill_core_s
from slo_core.policies.slide_batching import SlideBatching, SlideBatchingParams

PROFILE = SMALL_GPU
NOW = 100.0


def req(
    rid: str, *, ttft_s: float, prompt: int = 500, weight: float = 1.0, arrival: float = NOW, gen: int = 0
) -> RequestView:
    """A streaming request bounded at 200 tokens; one that has generated is running (all computed)."""
    slo = latency(ttft_s, weight=weight)
    return request(
        rid, slo, arrival_s=arrival, prompt=prompt, max_tokens=200, gen=gen, prefilled=gen > 0, bound=200
    )


def engine(*, seqs: int = 256, kv_free: int | None = None) -> EngineView:
    return builders.engine(NOW, seqs=seqs, kv_total=6000, kv_free=kv_free, profile=PROFILE)


# A: tight deadline but low value (long prompt, low priority) -> low density.
# B: loose deadline, high value (short prompt, priority 4) -> high density.
A = req("A", ttft_s=1.0, prompt=2000, weight=1.0)
B = req("B", ttft_s=3.0, prompt=100, weight=4.0)


def fillers(n: int) -> list[RequestView]:
    return [req(f"f{i}", ttft_s=5.0 + i * 0.01, prompt=1500) for i in range(n)]


def test_low_load_is_deadline_first_and_nothing_is_urgent() -> None:
    plan = SlideBatching().plan([B, A], [], engine())
    assert plan.urgent == frozenset()
    assert plan.order == ("A", "B")


def test_high_load_marks_more_urgent_and_flips_to_density_first() -> None:
    policy = SlideBatching()
    low = policy.plan([A, B, *fillers(2)], [], engine())
    high = policy.plan([A, B, *fillers(40)], [], engine())
    assert len(high.urgent) > len(low.urgent)
    assert {"A", "B"} <= high.urgent
    assert high.order.index("B") < high.order.index("A")


def test_gamma_and_load_judgment_slide_the_boundary() -> None:
    queue = [A, B, *fillers(12)]
    counts = [len(SlideBatching(gamma=g).plan(queue, [], engine()).urgent) for g in (0.25, 1.0, 4.0)]
    assert counts[0] <= counts[1] <= counts[2] and counts[0] < counts[2]
    aggressive = SlideBatching(load_judgment="aggressive").plan(queue, [], engine())
    conservative = SlideBatching(load_judgment="conservative").plan(queue, [], engine())
    assert conservative.urgent <= aggressive.urgent
    assert len(conservative.urgent) < len(aggressive.urgent)


def test_budget_is_smallest_remaining_deadline_with_lower_bound_eta() -> None:
    plan = SlideBatching(eta_s=0.02).plan([req("x", ttft_s=0.5), req("y", ttft_s=0.3)], [], engine())
    assert plan.t_budget_s == pytest.approx(0.3)
    late = req("late", ttft_s=0.01, arrival=NOW - 1.0)  # its deadline has passed: budget falls to η
    assert SlideBatching(eta_s=0.02).plan([late], [], engine()).t_budget_s == pytest.approx(0.02)


def test_batch_fills_the_budget_with_a_partial_prefill_chunk() -> None:
    big = req("big", ttft_s=0.2, prompt=6000)
    plan = SlideBatching().plan([big], [], engine())
    assert plan.batch == ("big",)
    chunk = plan.chunks["big"]
    assert 0 < chunk < 6000
    assert 0.005 + prefill_core_s(PROFILE, chunk, 0) <= plan.t_budget_s + 1e-9
    assert 0.005 + prefill_core_s(PROFILE, chunk + 50, 0) > plan.t_budget_s


def test_decide_admits_only_the_batch_and_holds_the_rest() -> None:
    queue = [A, B, *fillers(40)]
    policy = SlideBatching()
    plan = policy.plan(queue, [], engine())
    d = policy.decide(queue, [], engine(), random.Random(0))
    assert d.hold_unlisted
    assert d.admit == plan.batch
    assert 0 < len(d.admit) < len(queue)


def test_running_decodes_are_ordered_before_running_requests_outside_the_batch() -> None:
    decoding = [req(f"d{i}", ttft_s=0.05, prompt=100, gen=3, arrival=NOW - 0.1) for i in range(3)]
    d = SlideBatching().decide([], decoding, engine(), random.Random(0))
    assert d.running_order is not None and set(d.running_order) == {"d0", "d1", "d2"}


def test_kv_and_sequence_limits_bound_the_batch() -> None:
    queue = [req(f"s{i}", ttft_s=2.0, prompt=20) for i in range(10)]
    assert len(SlideBatching().plan(queue, [], engine(seqs=4)).batch) == 4
    plan = SlideBatching().plan([req("k", ttft_s=2.0, prompt=3000)], [], engine(kv_free=10))
    assert plan.chunks["k"] <= 160


def test_online_correction_shrinks_the_batch_when_batches_run_slow() -> None:
    queue = [A, B, *fillers(40)]
    fast, slow = SlideBatching(), SlideBatching(correction_momentum=0.0)
    slow.observe_batch(estimated_s=0.05, measured_s=0.15)
    assert slow.correction.factor == pytest.approx(3.0)
    before = sum(fast.plan(queue, [], engine()).chunks.values())
    after = sum(slow.plan(queue, [], engine()).chunks.values())
    assert after < before


def test_params_reject_unknown_fields() -> None:
    with pytest.raises(ValueError, match="extra"):
        SlideBatchingParams(foo=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        SlideBatching(load_judgment="nope")
