"""GMAX's per-step token budget (the running requests' pace) and its latency lane."""

from __future__ import annotations

import random

import builders
import numpy as np
import pytest
from builders import DL, LAT, SMALL_GPU, request

from slo_core.policies import gmax_scalar
from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.gmax import GMAX
from slo_core.policies.gmax_budget import demand_tokens, demand_tokens_small, latency_lane, step_budget
from slo_core.policies.gmax_params import GMAXParams

# SMALL_GPU: t_c 5 ms, floor 10 ms, a = 0.1 ms per batched token, d = 1e-4 ms per KV token


def budget(
    p: GMAXParams, *, paces_from: list[tuple[bool, float, float, float]], now_s: float = 0.0
) -> int | None:
    """step_budget over running decodes given as (latency?, tbt, deadline, len_rem), 100 KV tokens each."""
    n = len(paces_from)
    return step_budget(
        p,
        SMALL_GPU,
        8192,
        now_s,
        in_prefill=np.zeros(n, dtype=np.bool_),
        kv_tokens=np.full(n, 100.0),
        is_latency=np.array([x[0] for x in paces_from], dtype=np.bool_),
        tbt_s=np.array([x[1] for x in paces_from]),
        deadline_s=np.array([x[2] for x in paces_from]),
        len_rem_tokens=np.array([x[3] for x in paces_from]),
    )


def bare_ms(n: int) -> float:
    return 5.0 + max(10.0, 0.1 * n) + 1e-4 * 101.0 * n


def test_the_step_keeps_the_pace_of_the_running_request() -> None:
    # 90 tokens left, 20 s to the deadline: 222 ms a token; 90 % of it, less the bare decode step
    b = budget(GMAXParams(), paces_from=[(False, np.nan, 20.0, 90.0)])
    assert b == 1 + int((20.0 / 90.0 * 1000.0 * 0.9 - bare_ms(1)) / 0.1)
    lat = budget(GMAXParams(), paces_from=[(True, 0.05, np.nan, 90.0)])  # a stream keeps its TBT
    assert lat == 1 + int((50.0 * 0.9 - bare_ms(1)) / 0.1)


def test_the_cap_always_leaves_some_prefill_and_never_exceeds_the_engine() -> None:
    tight = budget(GMAXParams(), paces_from=[(False, np.nan, 2.0, 100.0)])  # 20 ms a token: no spare
    assert tight == 1 + 256
    loose = budget(GMAXParams(), paces_from=[(False, np.nan, 1000.0, 10.0)])
    assert loose == 8192


def test_requests_that_cannot_make_it_or_without_a_target_do_not_cap() -> None:
    hopeless = (False, np.nan, 0.5, 100.0)  # 5 ms a token: faster than any step
    assert budget(GMAXParams(), paces_from=[hopeless]) is None
    assert budget(GMAXParams(), paces_from=[(True, np.nan, np.nan, 10.0)]) is None
    assert budget(GMAXParams(pace_budget=False), paces_from=[(False, np.nan, 20.0, 90.0)]) is None
    assert step_budget(GMAXParams(), None, 8192, 0.0, **_empty()) is None


def _empty() -> dict[str, np.ndarray]:
    z = np.zeros(0)
    return {
        "in_prefill": z.astype(np.bool_),
        "kv_tokens": z,
        "is_latency": z.astype(np.bool_),
        "tbt_s": z,
        "deadline_s": z,
        "len_rem_tokens": z,
    }


def test_the_pace_quantile_lets_the_most_pressed_requests_go() -> None:
    rows = [(False, np.nan, d, 100.0) for d in (30.0, 60.0, 90.0, 120.0, 150.0)]  # 0.3..1.5 s a token
    strict = budget(GMAXParams(pace_quantile=0.0), paces_from=rows)
    half = budget(GMAXParams(pace_quantile=0.5), paces_from=rows)
    assert strict == 5 + int((300.0 * 0.9 - bare_ms(5)) / 0.1)
    assert half == 5 + int((900.0 * 0.9 - bare_ms(5)) / 0.1)


def test_latency_lane_goes_first_and_adds_its_prefill() -> None:
    # rows: 0..2 waiting (1 and 2 latency, 2 past its TTFT: not a candidate), 3..5 running (4 a
    # latency request with 40 of its 60 prompt tokens still to prefill)
    admit = np.array([0, 2, 1])
    lane = latency_lane(
        admit,
        np.array([4, 3, 5]),
        candidates=np.array([1]),
        prompt_tokens=np.array([5000.0, 300.0, 200.0, 0.0, 60.0, 900.0]),
        computed_tokens=np.array([0.0, 0.0, 0.0, 10.0, 20.0, 0.0]),
        generated_tokens=np.zeros(6),
        in_prefill=np.array([True, True, True, False, True, True]),
        is_latency=np.array([False, True, True, False, True, False]),
        max_tokens=8192,
    )
    assert lane.admit.tolist() == [1, 0, 2]
    assert lane.running_order.tolist() == [3, 4, 5]  # decodes, latency prefills, other prefills
    assert lane.extra_tokens == 300 + 40


def req(rid: str, slo: object, **kw: object) -> RequestView:
    return request(rid, slo, max_tokens=100_000, **kw)  # type: ignore[arg-type]


def engine(now_s: float) -> EngineView:
    return builders.engine(now_s, seqs=64, kv_total=200_000, profile=SMALL_GPU)


def test_gmax_caps_the_step_and_lets_fresh_streams_in_first() -> None:
    # a running deadline request with 90 tokens in 3 s: ~33 ms a token, so the cap leaves 256 tokens
    pressed = req("run", DL, arrival_s=-17.0, prompt=100, gen=10, bound=100, prefilled=True)
    big = req("big", DL, prompt=4000, bound=50, waiting_since_s=0.0)  # dense: 4050 tokens of goodput
    chat = req("chat", LAT, prompt=300, bound=100, waiting_since_s=0.0)
    d = GMAX().decide([chat, big], [pressed], engine(0.0), random.Random(0))
    assert d.admit == ("chat", "big")
    assert d.token_budget == 1 + 256 + 300
    plain = GMAX(latency_lane=False).decide([chat, big], [pressed], engine(0.0), random.Random(0))
    assert plain.admit == ("big", "chat")
    assert plain.token_budget == 1 + 256
    off = GMAX(pace_budget=False).decide([chat, big], [pressed], engine(0.0), random.Random(0))
    assert off.token_budget is None


def test_demand_is_the_rate_that_starts_each_prompt_in_time_in_prefill_order() -> None:
    # prompts of 1000, 3000 and 1000 tokens, in the order they will be prefilled, that must start
    # 1, 2 and 10 s from now: the second waits for the first, so it needs 4000 tokens in 2000 ms
    tokens = np.array([1000.0, 3000.0, 1000.0])
    start_by = np.array([1.0, 2.0, 10.0])
    rate = 2.0  # tokens per ms
    need = demand_tokens(tokens, start_by, 0.0, bare_ms=15.0, a_ms=0.1, room_tokens=8192)
    # a step of P prefill tokens moves P / (15 + 0.1 P) tokens per ms: P = 2·15 / (1 − 0.2)
    assert need == int(np.ceil(rate * 15.0 / (1.0 - 0.1 * rate)))
    # the same prompts in the other order need only 1000 / 1000 ms, 4000 / 2000 ms ... at most 2
    swapped = demand_tokens(
        tokens[[0, 2, 1]], start_by[[0, 2, 1]], 0.0, bare_ms=15.0, a_ms=0.1, room_tokens=8192
    )
    assert swapped == int(np.ceil(2.5 * 15.0 / (1.0 - 0.25)))


def test_demand_that_no_step_can_meet_or_that_is_already_late_gives_no_floor() -> None:
    tokens = np.array([5000.0])
    # 5000 tokens in 0.4 s = 12.5 a ms, above the 10 a ms a step of 0.1 ms per token can ever move
    assert demand_tokens(tokens, np.array([0.4]), 0.0, bare_ms=15.0, a_ms=0.1, room_tokens=8192) is None
    # 5000 tokens in 1 s: 5 a ms needs P = 150 tokens a step; a room of 100 cannot hold it
    assert demand_tokens(tokens, np.array([1.0]), 0.0, bare_ms=15.0, a_ms=0.1, room_tokens=100) is None
    assert demand_tokens(tokens, np.array([-1.0]), 0.0, bare_ms=15.0, a_ms=0.1, room_tokens=8192) is None
    # the most pressed few (pace_quantile) are let go, as for the pace cap
    two = np.array([100.0, 100.0, 5000.0, 100.0])
    by = np.array([10.0, 10.0, 10.2, 0.01])  # the last one: 5300 tokens in 10 ms
    assert demand_tokens(two, by, 0.0, bare_ms=15.0, a_ms=0.1, room_tokens=8192) is None
    let_go = demand_tokens(two, by, 0.0, bare_ms=15.0, a_ms=0.1, room_tokens=8192, quantile=0.25)
    assert let_go is not None


def test_prompts_already_past_their_latest_start_count_as_ones_no_step_can_start() -> None:
    # ten prompts of 100 tokens, the first three already late: the seven others could all start in
    # time at 0.1 a ms, but more than the let-go share (15 %) of the queue is lost already: overload,
    # and the floor stands (before, the late ones were dropped and the floor rose for the survivors)
    tokens = np.full(10, 100.0)
    by = np.array([-1.0, -0.5, -0.1, *([10.0] * 7)])
    args = {"bare_ms": 15.0, "a_ms": 0.1, "room_tokens": 8192, "quantile": 0.15}
    assert demand_tokens(tokens, by, 0.0, **args) is None
    assert demand_tokens_small(tokens.tolist(), by.tolist(), 0.0, **args) is None
    # one late prompt in ten is within the let-go share: the floor is the survivors' rate
    by[1:3] = 10.0
    need = demand_tokens(tokens, by, 0.0, **args)
    assert need is not None and need == demand_tokens_small(tokens.tolist(), by.tolist(), 0.0, **args)
    # rates (the late one's 100 tokens still go first): 200 ... 1000 tokens in 10 s, then ∞; the
    # 0.85 quantile of the ten is the eighth, 900 tokens in 10,000 ms
    rate = 900.0 / 10_000.0
    assert need == int(np.ceil(rate * 15.0 / (1.0 - 0.1 * rate)))
    # a prompt without a latest start (NaN) is not the floor's, late or not
    assert demand_tokens(np.array([100.0]), np.array([np.nan]), 0.0, **args) is None


def test_gmax_raises_the_cap_when_the_queue_can_still_all_start_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the pressed running request caps the step at 3 + 256 tokens (its pace is the 0.15 quantile of
    # three); the other two have time to spare. Three waiting prompts of 2000 tokens each are due
    # 0.6 s from now: at 256 tokens a step (~41 ms) the second would start after ~0.65 s, too late
    pressed = req("run", DL, arrival_s=-17.0, prompt=100, gen=10, bound=100, prefilled=True)
    easy = [req(f"e{i}", DL, arrival_s=0.0, prompt=100, gen=10, bound=20, prefilled=True) for i in range(2)]
    queue = [
        req(f"w{i}", DL, arrival_s=-19.4, prompt=2000, bound=4, waiting_since_s=-19.4, due=True)
        for i in range(3)
    ]
    capped = GMAX(demand_floor=False).decide(queue, [pressed, *easy], engine(0.0), random.Random(0))
    assert capped.token_budget == 3 + 256
    d = GMAX().decide(queue, [pressed, *easy], engine(0.0), random.Random(0))
    assert d.token_budget is not None and d.token_budget > 3 + 256
    with monkeypatch.context() as mp:
        mp.setattr(gmax_scalar, "MAX_ROWS", -1)  # the numpy path decides the same
        assert GMAX().decide(queue, [pressed, *easy], engine(0.0), random.Random(0)) == d
    prefill = d.token_budget - 3
    step_ms = 5.0 + max(10.0, 0.1 * d.token_budget) + 1e-4 * 333.0
    assert np.ceil(4000 / prefill) * step_ms <= 600.0 - 4 * 15.0  # the second prompt starts in time
    # the same queue due in 0.3 s cannot all start even at the engine's full budget: the cap stands
    late = [
        req(f"l{i}", DL, arrival_s=-19.7, prompt=2000, bound=4, waiting_since_s=-19.7, due=True)
        for i in range(3)
    ]
    assert GMAX().decide(late, [pressed, *easy], engine(0.0), random.Random(0)).token_budget == 3 + 256
    # the request goodput pays the short running requests as much as the long prompts: no floor
    by_request = GMAX(goodput="request").decide(queue, [pressed, *easy], engine(0.0), random.Random(0))
    assert by_request.token_budget == 3 + 256
    # the floor never slows the step below the median running request's pace: with two of three
    # running requests pressed, it cannot rise at all
    two_pressed = [pressed, req("run2", DL, arrival_s=-17.0, prompt=100, gen=10, bound=100, prefilled=True)]
    held = GMAX().decide(queue, [*two_pressed, easy[0]], engine(0.0), random.Random(0))
    assert held.token_budget == 3 + 256
