"""GMAX's step budget and latency lane on plain floats equal their numpy versions bit for bit.

Random rows (fractional token counts and times, NaN targets, paces on both sides of the bare step,
prompts due before and after now) go through both versions; every result must be identical.
"""

from __future__ import annotations

import math

import numpy as np
from builders import SMALL_GPU
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.perf import load_profile
from slo_core.policies.gmax_budget import (
    demand_tokens,
    demand_tokens_small,
    latency_lane,
    latency_lane_small,
    median_remaining,
    median_remaining_small,
    step_budget,
    step_budget_small,
)
from slo_core.policies.gmax_params import GMAXParams

H100 = load_profile("h100-llama3-8b-tp1")
# times on a microsecond grid, as a simulator's clock reads them (no subnormal slack to overflow)
tokens = st.one_of(st.integers(0, 5000).map(float), st.floats(0.0, 5000.0))
maybe_nan = st.one_of(st.just(math.nan), st.floats(0.001, 0.3))
times = st.one_of(st.just(math.nan), st.floats(-5.0, 60.0).map(lambda x: round(x, 6)))
params = st.builds(
    GMAXParams,
    pace_quantile=st.sampled_from([0.0, 0.15, 0.5, 0.99]),
    demand_pace_quantile=st.sampled_from([0.0, 0.5, 0.99]),
    pace_safety=st.sampled_from([0.9, 1.0]),
    min_prefill_tokens=st.sampled_from([1, 256]),
    demand_floor=st.booleans(),
    goodput=st.sampled_from(["token", "request"]),
    length_source=st.sampled_from(["analyzer", "mean", "oracle"]),
)


@st.composite
def running_rows(draw: st.DrawFn) -> list[tuple[bool, float, bool, float, float, float]]:
    n = draw(st.integers(0, 40))
    return [
        (
            draw(st.booleans()),  # in prefill
            draw(tokens),  # KV tokens
            draw(st.booleans()),  # latency
            draw(maybe_nan),  # TBT
            draw(times),  # deadline
            draw(st.one_of(st.floats(-3.0, 2.0), st.floats(1.0, 800.0))),  # remaining tokens
        )
        for _ in range(n)
    ]


@settings(max_examples=300, deadline=None)
@given(
    p=params,
    rows=running_rows(),
    pending=st.lists(st.tuples(tokens, times), max_size=40),
    now_s=st.floats(0.0, 10.0).map(lambda x: round(x, 6)),
    max_batched=st.sampled_from([512, 2048, 8192]),
    gpu=st.booleans(),
)
def test_step_budget_on_lists_equals_the_array_version(
    p: GMAXParams,
    rows: list[tuple[bool, float, bool, float, float, float]],
    pending: list[tuple[float, float]],
    now_s: float,
    max_batched: int,
    gpu: bool,
) -> None:
    profile = H100 if gpu else SMALL_GPU
    cols = list(zip(*rows, strict=True)) if rows else [()] * 6
    pend = list(zip(*pending, strict=True)) if pending else [(), ()]
    names = ("in_prefill", "kv_tokens", "is_latency", "tbt_s", "deadline_s", "len_rem_tokens")
    lists = {k: list(v) for k, v in zip(names, cols, strict=True)}
    arrays = {
        k: np.array(v, dtype=np.bool_ if k in ("in_prefill", "is_latency") else np.float64)
        for k, v in lists.items()
    }
    tok, start = list(pend[0]), list(pend[1])
    big = step_budget(
        p,
        profile,
        max_batched,
        now_s,
        **arrays,
        pending_tokens=np.array(tok, dtype=np.float64),
        pending_start_by_s=np.array(start, dtype=np.float64),
    )
    small = step_budget_small(
        p, profile, max_batched, now_s, **lists, pending_tokens=tok, pending_start_by_s=start
    )
    assert small == big
    kw = {"bare_ms": 15.0 + now_s, "a_ms": profile.a_ms_per_token, "room_tokens": max_batched}
    for q in (0.0, p.pace_quantile):
        arr = demand_tokens(np.array(tok, dtype=np.float64), np.array(start), now_s, quantile=q, **kw)
        assert demand_tokens_small(tok, start, now_s, quantile=q, **kw) == arr


@settings(max_examples=200, deadline=None)
@given(
    p=params,
    rows=st.lists(st.tuples(st.floats(1.0, 4096.0), st.integers(0, 4096).map(float)), max_size=30),
)
def test_median_remaining_on_lists_equals_the_array_version(
    p: GMAXParams, rows: list[tuple[float, float]]
) -> None:
    bound = [b for b, _ in rows]
    gen = [g for _, g in rows]
    arr = median_remaining(p, np.array(bound, dtype=np.float64), np.array(gen, dtype=np.float64))
    assert median_remaining_small(p, bound, gen) == arr.tolist()


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    n=st.integers(0, 30),
    max_tokens=st.sampled_from([0, 300, 2048, 8192]),
)
def test_latency_lane_on_lists_equals_the_array_version(data: st.DataObject, n: int, max_tokens: int) -> None:
    prompt = data.draw(st.lists(tokens, min_size=n, max_size=n))
    computed = data.draw(st.lists(tokens, min_size=n, max_size=n))
    gen = data.draw(st.lists(tokens, min_size=n, max_size=n))
    in_prefill = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    is_latency = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    order = data.draw(st.permutations(list(range(n))))
    n_admit = data.draw(st.integers(0, n))
    admit, running = order[:n_admit], order[n_admit:]
    candidates = [i for i in admit if is_latency[i] and data.draw(st.booleans())]
    lane = latency_lane(
        np.array(admit, dtype=np.int64),
        np.array(running, dtype=np.int64),
        candidates=np.array(candidates, dtype=np.int64),
        prompt_tokens=np.array(prompt, dtype=np.float64),
        computed_tokens=np.array(computed, dtype=np.float64),
        generated_tokens=np.array(gen, dtype=np.float64),
        in_prefill=np.array(in_prefill, dtype=np.bool_),
        is_latency=np.array(is_latency, dtype=np.bool_),
        max_tokens=max_tokens,
    )
    small = latency_lane_small(
        admit,
        running,
        candidates=candidates,
        prompt_tokens=prompt,
        computed_tokens=computed,
        generated_tokens=gen,
        in_prefill=in_prefill,
        is_latency=is_latency,
        max_tokens=max_tokens,
    )
    assert small == (lane.admit.tolist(), lane.running_order.tolist(), lane.extra_tokens)
