"""SLOs-Serve admission DP and batch formation (§3.2): never admits what it finds infeasible; optimal."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from builders import profile
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from slo_core.policies.slos_serve_dp import (
    Capacity,
    DPItem,
    _Decoders,
    batch_tokens,
    dp_item,
    form_batches,
    plan_admission,
    prefill_rate,
    schedule_feasible,
)

# 1 ms overhead + 0.5 ms/token, no KV term: 198 tokens per 100 ms batch (1980 tokens/s) when idle.
PROFILE = profile(t_c_ms=1.0, floor_ms=2.0, a_ms_per_token=0.5, kv_cache_tokens=100_000, max_model_len=8192)
CAP = Capacity(PROFILE, max_batch_tokens=100_000, memory_units=100, max_seqs=64, idle_batch_s=0.1)


def item(
    rid: str,
    pddl: float,
    prefill: int,
    *,
    tpot: float | None = 0.05,
    value: float = 1.0,
    mem: int = 1,
    forced: bool = False,
) -> DPItem:
    return DPItem(
        rid, pddl_s=pddl, prefill_tokens=prefill, memory_units=mem, tpot_s=tpot, value=value, forced=forced
    )


def test_batch_size_follows_the_tightest_tpot() -> None:
    loose = form_batches(CAP, 1.0, [(0.1, 0), (0.1, 0)])
    tight = form_batches(CAP, 1.0, [(0.1, 0), (0.02, 0)])
    assert loose[0].tokens == batch_tokens(CAP, 0.1, 0) == 198
    assert tight[0].tokens == batch_tokens(CAP, 0.02, 0) < loose[0].tokens
    assert len(tight) == 50 and len(loose) == 10
    # the 100 ms decoder gets a token every fifth 20 ms batch, the 20 ms one every batch
    assert sum(b.decode_tokens for b in tight) == 50 + 10
    assert sum(b.prefill_budget for b in tight) == 50 * tight[0].tokens - 60


def test_prefill_rate_matches_the_batches_and_goes_negative_when_decodes_cannot_keep_up() -> None:
    rate = prefill_rate(CAP, 0.02, 1 / 0.1 + 1 / 0.02, 0.0)
    budget = sum(b.prefill_budget for b in form_batches(CAP, 1.0, [(0.1, 0), (0.02, 0)]))
    assert abs(rate * 1.0 - budget) < 1e-6
    assert prefill_rate(CAP, 0.004, 500 / 0.004, 0.0) < 0


def test_a_request_whose_prefill_cannot_fit_before_its_deadline_is_declined() -> None:
    plan = plan_admission([], [item("big", 0.5, 5000), item("ok", 0.5, 500)], 0.0, CAP)
    assert plan.admitted == ("ok",) and plan.declined == ("big",)


def test_picks_the_best_subset_when_all_together_are_infeasible() -> None:
    # SLOs-Serve Fig. 5: admitting R1..R3 overruns the budget before R3's deadline; any two fit.
    r1, r2, r3 = item("R1", 0.5, 800), item("R2", 0.8, 700), item("R3", 1.0, 1100, value=2.0)
    assert not schedule_feasible([r1, r2, r3], 0.0, CAP)
    plan = plan_admission([], [r1, r2, r3], 0.0, CAP)
    assert len(plan.admitted) == 2 and "R3" in plan.admitted and plan.value == 3.0
    assert schedule_feasible([i for i in (r1, r2, r3) if i.request_id in plan.admitted], 0.0, CAP)
    weighted = plan_admission([], [r1, item("R2", 0.8, 700, value=5.0), r3], 0.0, CAP)
    assert set(weighted.admitted) == {"R2", "R3"}


def test_forced_requests_keep_their_budget() -> None:
    forced = [item("run", 1.0, 1900, forced=True)]
    plan = plan_admission(forced, [item("new", 0.5, 500)], 0.0, CAP)
    assert plan.admitted == () and plan.forced_feasible
    assert plan_admission(forced, [item("later", 2.0, 500)], 0.0, CAP).admitted == ("later",)


def test_memory_seats_and_decode_pace_limit_admission() -> None:
    small = Capacity(PROFILE, 100_000, memory_units=3, max_seqs=64)
    assert plan_admission([], [item("a", 1, 10, mem=2), item("b", 1, 10, mem=2)], 0.0, small).value == 1.0
    seats = Capacity(PROFILE, 100_000, memory_units=100, max_seqs=1)
    assert len(plan_admission([], [item("a", 1, 10), item("b", 1, 10)], 0.0, seats).admitted) == 1
    # a 2.5 ms TPOT cannot be met at all: the smallest batch takes 3 ms
    assert plan_admission([], [item("fast", 1, 10, tpot=0.0025)], 0.0, CAP).admitted == ()


def brute_force(forced: list[DPItem], cands: list[DPItem], cap: Capacity) -> float:
    best = 0.0
    for k in range(len(cands) + 1):
        for sub in itertools.combinations(cands, k):
            if schedule_feasible([*forced, *sub], 0.0, cap):
                best = max(best, sum(c.value for c in sub))
    return best


items = st.builds(
    item,
    rid=st.uuids().map(str),
    pddl=st.floats(0.05, 2.0),
    prefill=st.integers(10, 1500),
    tpot=st.sampled_from([None, 0.03, 0.1]),
    value=st.sampled_from([1.0, 2.0, 3.5]),
    mem=st.integers(1, 40),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cands=st.lists(items, min_size=1, max_size=6), forced=st.lists(items, max_size=2))
def test_dp_admits_only_feasible_sets_and_matches_brute_force(
    cands: list[DPItem], forced: list[DPItem]
) -> None:
    forced = [DPItem(**{**_fields(f), "forced": True}) for f in forced]
    assume(schedule_feasible(forced, 0.0, CAP))
    plan = plan_admission(forced, cands, 0.0, CAP, front_size=64)
    chosen = [c for c in cands if c.request_id in plan.admitted]
    assert schedule_feasible([*forced, *chosen], 0.0, CAP)
    assert abs(plan.value - brute_force(forced, cands, CAP)) < 1e-9


def _fields(x: DPItem) -> dict[str, object]:
    return {f: getattr(x, f) for f in x.__slots__}  # type: ignore[attr-defined]


def test_a_forced_decoder_lowers_the_prefill_rate_for_every_later_candidate() -> None:
    """The DP keeps each key's prefill rate between forced events; a forced request that starts
    decoding at 0.1 s must slow the budget a candidate due at 1 s sees (a rate kept from before it
    would admit a prompt that no longer fits)."""
    before = prefill_rate(CAP, math.inf, 0.0, 0.0)
    after = prefill_rate(CAP, 0.01, 1.0 / 0.01, 0.0)
    assert after < before
    forced = item("f", 0.1, 10, tpot=0.01, forced=True)
    budget = before * 0.1 - 10 + after * 0.9  # what the candidate's prefill may take
    stale = before * 1.0 - 10
    assert budget + 2 < stale
    fits = item("c", 1.0, int(budget) - 1, tpot=None)
    too_big = item("c", 1.0, int((budget + stale) / 2), tpot=None)
    assert plan_admission([forced], [fits], 0.0, CAP).admitted == ("c",)
    assert plan_admission([forced], [too_big], 0.0, CAP).admitted == ()


@given(items)
@settings(max_examples=30, deadline=None)
def test_the_fast_item_builder_builds_the_dataclass(it: DPItem) -> None:
    fields = _fields(it)
    built = dp_item(*fields.values())  # type: ignore[arg-type]
    assert type(built) is DPItem
    assert built == it == DPItem(**fields)  # type: ignore[arg-type]
    assert hash(built) == hash(it)


@pytest.mark.parametrize("seed", range(5))
def test_the_decoders_aggregate_of_a_list_is_plus_one_by_one(seed: int) -> None:
    # _Decoders.of sums a replica's running decoders without an object each: the same floats
    rng = random.Random(seed)
    decoders = [
        (rng.choice([None, 0.02, 0.05, 0.1, rng.uniform(0.01, 0.3)]), rng.randint(1, 9000))
        for _ in range(300)
    ]
    one_by_one = _Decoders()
    for tpot, kv in decoders:
        one_by_one = one_by_one.plus(tpot, kv)
    assert _Decoders.of(decoders) == one_by_one
    assert _Decoders.of([]) == _Decoders()
