"""Goodput functions: hand-worked examples from the papers' definitions, and PROSERVE §2 properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.gain import (
    _ON_TIME_NUMPY_FROM,
    GOODPUT_FUNCTIONS,
    Delivery,
    GainParams,
    SLOWatch,
    _on_time_tokens,
    goodput_function,
    ideal_gain,
    latency_token_outcome,
    request_goodput,
    tdg_gain,
    tempo_gain,
    token_goodput,
)
from slo_core.slo import DEFAULT_BEST_EFFORT_DEADLINE_S, RequestKind, SLOTargets

LAT = SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1)
DL = SLOTargets(RequestKind.DEADLINE, deadline_s=20.0)


def lat(times: list[float], *, weight: float = 1.0, completed: bool = True, inp: int = 10) -> Delivery:
    slo = SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1, priority_weight=weight)
    return Delivery(
        slo=slo,
        arrival_s=100.0,
        input_tokens=inp,
        token_times_s=[100.0 + t for t in times],
        completed=completed,
    )


def test_token_latency_counts_tokens_by_ttft_plus_i_tbt() -> None:
    # deadlines (relative): 2.0, 2.1, 2.2, 2.3
    d = lat([1.0, 2.1, 2.25, 2.5])
    # token 0 on time, token 1 exactly at its deadline (counts), tokens 2 and 3 late
    assert token_goodput(d) == 2
    assert token_goodput(lat([1.0, 2.1, 2.2, 2.3])) == 4


def test_token_deadline_all_or_nothing_counts_input_and_output() -> None:
    on_time = Delivery(DL, arrival_s=0.0, input_tokens=100, token_times_s=[5.0, 10.0, 19.9])
    late = Delivery(DL, arrival_s=0.0, input_tokens=100, token_times_s=[5.0, 10.0, 20.1])
    assert token_goodput(on_time) == 103
    assert token_goodput(late) == 0


def test_unfinished_deadline_request_earns_nothing() -> None:
    d = Delivery(DL, arrival_s=0.0, input_tokens=100, token_times_s=[1.0, 2.0], completed=False)
    assert token_goodput(d) == 0
    assert tempo_gain(d) == 0
    assert request_goodput(d) == 0


def test_best_effort_uses_default_deadline() -> None:
    be = SLOTargets(RequestKind.BEST_EFFORT)
    ok = Delivery(be, arrival_s=0.0, input_tokens=1, token_times_s=[DEFAULT_BEST_EFFORT_DEADLINE_S - 1])
    late = Delivery(be, arrival_s=0.0, input_tokens=1, token_times_s=[DEFAULT_BEST_EFFORT_DEADLINE_S + 1])
    assert token_goodput(ok) == 2
    assert token_goodput(late) == 0


def test_request_goodput_latency_needs_every_token_on_time() -> None:
    assert request_goodput(lat([1.0, 1.5, 2.2])) == 1
    assert request_goodput(lat([1.0, 1.5, 2.3])) == 0
    assert request_goodput(lat([1.0, 1.5, 2.2], weight=2.0)) == 2


def test_tempo_deadline_divisive_decay() -> None:
    # (w_i·L_i + w_o·L_o)·min(1, SLO/TTLT): (1·100 + 2·4)·(20/40) = 54
    d = Delivery(DL, arrival_s=0.0, input_tokens=100, token_times_s=[10.0, 20.0, 30.0, 40.0])
    assert tempo_gain(d) == pytest.approx(54.0)
    # met deadline → no extra gain for finishing early
    early = Delivery(DL, arrival_s=0.0, input_tokens=100, token_times_s=[1.0, 2.0, 3.0, 4.0])
    assert tempo_gain(early) == pytest.approx(108.0)
    # α = 2 squares the decay
    assert tempo_gain(d, GainParams(alpha=2.0)) == pytest.approx(27.0)


def test_tempo_latency_decays_first_token_and_lagging_tokens() -> None:
    # TTFT 4 s against 2 s: input gain 10·1·0.5 = 5; token 0 due 2.0 at 4.0 → 2·0.5 = 1;
    # token 1 due 2.1 at 4.2 → 2·0.5 = 1. Total 7.
    d = lat([4.0, 4.2])
    assert tempo_gain(d) == pytest.approx(7.0)
    assert tempo_gain(lat([1.0, 1.1])) == pytest.approx(10 + 2 + 2)


def test_tdg_first_and_decode_weights_and_priority() -> None:
    p = GainParams(first_token_weight=3.0, decode_token_weight=1.0)
    # due 2.0, 2.1, 2.2: token 0 on time (3), token 1 late, token 2 on time (1) → 4, ×2 priority = 8
    assert tdg_gain(lat([1.0, 2.15, 2.19], weight=2.0), p) == pytest.approx(8.0)
    # TDG uses strict "<": a token exactly at its deadline does not count
    assert tdg_gain(lat([2.0]), p) == 0.0


def test_priority_weight_multiplies_every_function() -> None:
    for name, fn in GOODPUT_FUNCTIONS.items():
        base = fn(lat([1.0, 1.5, 3.0]), GainParams())
        doubled = fn(lat([1.0, 1.5, 3.0], weight=2.0), GainParams())
        assert doubled == pytest.approx(2 * base), name


def test_ideal_gain_is_an_upper_bound() -> None:
    d = Delivery(DL, arrival_s=0.0, input_tokens=100, token_times_s=[30.0] * 5)
    for name in GOODPUT_FUNCTIONS:
        assert ideal_gain(d, name) >= goodput_function(name)(d, GainParams())
    assert ideal_gain(d, "token") == 105


def test_unknown_function_names_the_choices() -> None:
    with pytest.raises(ValueError, match="request, tdg, tempo, token"):
        goodput_function("tokens")


# ---- PROSERVE §2 properties, for every function and every kind -----------------------------------

KINDS = [
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.DEADLINE, deadline_s=3.0),
    SLOTargets(RequestKind.COMPOUND, deadline_s=5.0),
    SLOTargets(RequestKind.BEST_EFFORT),
]

gaps = st.lists(st.floats(min_value=0.0, max_value=2.0, allow_nan=False), min_size=1, max_size=30)


def _times(gap_list: list[float]) -> list[float]:
    out, t = [], 0.0
    for g in gap_list:
        t += g
        out.append(t)
    return out


@settings(max_examples=150, deadline=None)
@given(
    gap_list=gaps,
    slo_idx=st.integers(0, 3),
    idx=st.integers(0, 29),
    shift=st.floats(0.0, 5.0),
    name=st.sampled_from(sorted(GOODPUT_FUNCTIONS)),
)
def test_earlier_delivery_never_lowers_gain_and_delay_never_raises(
    gap_list: list[float], slo_idx: int, idx: int, shift: float, name: str
) -> None:
    fn = goodput_function(name)
    times = _times(gap_list)
    i = idx % len(times)
    slo = KINDS[slo_idx]
    base = fn(Delivery(slo, 0.0, 50, times), GainParams())
    # delay token i (and keep order: every later token is at least as late)
    delayed = [t + shift if j >= i else t for j, t in enumerate(times)]
    assert fn(Delivery(slo, 0.0, 50, delayed), GainParams()) <= base + 1e-9
    # deliver token i earlier (not before its predecessor)
    floor = times[i - 1] if i > 0 else 0.0
    earlier = list(times)
    earlier[i] = max(floor, times[i] - shift)
    assert fn(Delivery(slo, 0.0, 50, earlier), GainParams()) >= base - 1e-9


@settings(max_examples=150, deadline=None)
@given(
    gap_list=gaps,
    slo_idx=st.integers(0, 3),
    cut=st.integers(0, 29),
    name=st.sampled_from(sorted(GOODPUT_FUNCTIONS)),
)
def test_discarding_forfeits_future_gain(gap_list: list[float], slo_idx: int, cut: int, name: str) -> None:
    fn = goodput_function(name)
    times = _times(gap_list)
    slo = KINDS[slo_idx]
    full = fn(Delivery(slo, 0.0, 50, times), GainParams())
    k = cut % (len(times) + 1)
    dropped = fn(Delivery(slo, 0.0, 50, times[:k], completed=False), GainParams())
    assert dropped <= full + 1e-9
    assert fn(Delivery(slo, 0.0, 50, [], completed=False), GainParams()) == 0.0
    assert math.isfinite(full)


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 0.5), max_size=40),
    start=st.floats(0.0, 5.0),
    weight=st.sampled_from([0.5, 1.0, 3.0]),
    completed=st.booleans(),
    extra=st.integers(0, 20),
)
def test_latency_token_outcome_equals_the_three_functions(
    gaps: list[float], start: float, weight: float, completed: bool, extra: int
) -> None:
    times = [start + sum(gaps[: i + 1]) for i in range(len(gaps))]
    d = lat(times, weight=weight, completed=completed)
    n = len(times) + extra
    expected = (token_goodput(d), ideal_gain(d, "token", output_tokens=n), request_goodput(d))
    assert latency_token_outcome(d, n) == expected


def _on_time_reference(d: Delivery) -> int:
    """The on-time count as numpy wrote it before the plain-loop path: rel <= TTFT + i·TBT + ε."""
    assert d.slo.ttft_s is not None and d.slo.tbt_s is not None
    rel = np.asarray(d.token_times_s, dtype=float) - d.arrival_s
    return int(np.count_nonzero(rel <= d.slo.ttft_s + np.arange(len(rel)) * d.slo.tbt_s + 1e-9))


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 2 * _ON_TIME_NUMPY_FROM),
    arrival=st.floats(0.0, 5_000.0),
    ttft=st.floats(0.01, 5.0),
    tbt=st.floats(0.001, 0.5),
    jitter=st.lists(st.sampled_from([-1e-9, -5e-10, 0.0, 5e-10, 1e-9, 2e-9, -0.01, 0.01]), min_size=1),
    completed=st.booleans(),
)
def test_on_time_count_is_the_numpy_rule_on_both_paths_at_the_deadlines_edge(
    n: int, arrival: float, ttft: float, tbt: float, jitter: list[float], completed: bool
) -> None:
    """Tokens placed on, just inside and just past their deadlines (where ε and rounding decide),
    below and above the length where the count switches from a plain loop to numpy."""
    times = [arrival + (ttft + i * tbt) + jitter[i % len(jitter)] for i in range(n)]
    times = list(np.maximum.accumulate(times)) if times else []  # delivery times never go back
    slo = SLOTargets(RequestKind.LATENCY, ttft_s=ttft, tbt_s=tbt, priority_weight=2.0)
    d = Delivery(slo, arrival, 10, [float(t) for t in times], completed)
    expected = _on_time_reference(d)
    assert _on_time_tokens(d) == expected
    assert token_goodput(d) == 2.0 * expected
    assert latency_token_outcome(d, n) == (
        2.0 * expected,
        2.0 * n,
        2.0 if completed and n > 0 and expected == n else 0.0,
    )
    assert request_goodput(d) == (2.0 if completed and n > 0 and expected == n else 0.0)


@settings(max_examples=300, deadline=None)
@given(
    gap_list=st.lists(st.floats(0.0, 1.5), max_size=30),
    batch=st.lists(st.integers(1, 4), min_size=1, max_size=30),
    slo_idx=st.integers(0, 3),
    arrival=st.floats(0.0, 1.7e9),
    completed=st.booleans(),
)
def test_the_running_watch_judges_as_request_goodput(
    gap_list: list[float], batch: list[int], slo_idx: int, arrival: float, completed: bool
) -> None:
    """Steps that each make one or more tokens at one time, fed as counts (what an engine keeps):
    the watch's verdict is request_goodput's on every token's time."""
    slo, watch = KINDS[slo_idx], SLOWatch(KINDS[slo_idx], arrival)
    times: list[float] = []
    t = arrival
    for k, gap in enumerate(gap_list):
        t += gap
        times += [t] * batch[k % len(batch)]
        watch.tokens(len(times), t)
        watch.tokens(len(times), t + 1.0)  # a step that made no token for it changes nothing
    expected = request_goodput(Delivery(slo, arrival, 50, times, completed=completed)) > 0
    assert watch.met(completed) is expected


def test_the_watch_takes_a_gap_early_tokens_made_up_for_and_an_absolute_deadline() -> None:
    """The rule is the token deadlines TTFT + i·TBT, not the longest gap: a 0.3 s stall after ten fast
    tokens is on time; a first token after TTFT is not; a tag's absolute deadline replaces arrival + D."""
    w = SLOWatch(LAT, 100.0)  # TTFT 2 s, TBT 0.1 s
    w.tokens(10, 100.5)
    w.tokens(11, 100.8)
    assert w.met(True) and not w.met(False)
    slow = SLOWatch(LAT, 100.0)
    slow.tokens(1, 102.5)
    assert not slow.met(True)
    tagged = SLOWatch(DL, 100.0, deadline_at_s=105.0)
    tagged.tokens(3, 106.0)
    assert not tagged.met(True)
    assert not SLOWatch(DL, 100.0).met(True), "no token: not met"


@settings(max_examples=400, deadline=None)
@given(
    n=st.integers(0, 400),
    arrival=st.floats(0.0, 5_000.0),
    ttft=st.sampled_from([0.25, 2.0]) | st.floats(0.001, 5.0),
    tbt=st.sampled_from([0.001, 0.1]) | st.floats(0.001, 0.5),
    start=st.floats(-1.0, 6.0),
    steps=st.lists(st.sampled_from([0.0, 1e-12, 0.02, 0.05, 0.1, 0.3, 1.5]), min_size=1, max_size=40),
    snap=st.lists(st.sampled_from([None, -2e-9, -1e-9, 0.0, 5e-10, 1e-9, 2e-9]), min_size=1, max_size=40),
    completed=st.booleans(),
)
def test_in_order_times_are_counted_from_a_few_as_from_every_one(
    n: int,
    arrival: float,
    ttft: float,
    tbt: float,
    start: float,
    steps: list[float],
    snap: list[float | None],
    completed: bool,
) -> None:
    """Times that never decrease (``times_in_order``: counted by halving blocks) give the count of the
    comparison of every token with its deadline: slack that grows, shrinks or wobbles, runs of equal
    times (a prefill's tokens, one step), and tokens placed on, just inside and just past their
    deadlines, where ε and rounding decide."""
    times: list[float] = []
    t = arrival + start
    for i in range(n):
        t += steps[i % len(steps)]
        s = snap[i % len(snap)]
        if s is not None:  # pull this token onto its deadline (±), never before the last one
            t = max(t, arrival + (ttft + i * tbt) + s)
        times.append(t)
    slo = SLOTargets(RequestKind.LATENCY, ttft_s=ttft, tbt_s=tbt, priority_weight=2.0)
    every = Delivery(slo, arrival, 10, times, completed)
    in_order = Delivery(slo, arrival, 10, times, completed, times_in_order=True)
    expected = _on_time_reference(every)
    assert _on_time_tokens(every) == expected
    assert _on_time_tokens(in_order) == expected
    assert latency_token_outcome(in_order, n) == latency_token_outcome(every, n)
    assert request_goodput(in_order) == request_goodput(every)
    assert token_goodput(in_order) == token_goodput(every)


def test_times_out_of_order_are_counted_one_by_one_unless_promised_in_order() -> None:
    """Without the promise a late token before an early one counts as it is: the block shortcut is
    only taken for times the caller guarantees in order (here it would see the last token on time
    and count the whole block)."""
    slo = SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.1)
    times = [100.0 + (5.0 if i == 3 else 0.5) for i in range(20)]  # token 3 late, the rest early
    d = Delivery(slo, 100.0, 10, times, True)
    assert _on_time_tokens(d) == 19
    assert _on_time_tokens(Delivery(slo, 100.0, 10, times, True, times_in_order=True)) == 20
