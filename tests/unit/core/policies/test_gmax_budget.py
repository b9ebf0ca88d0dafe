"""GMAX's per-step token budget (the running requests' pace) and its latency lane."""

from __future__ import annotations

import random

import builders
import numpy as np
from builders import DL, LAT, SMALL_GPU, request

from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.gmax import GMAX
from slo_core.policies.gmax_budget import latency_lane, step_budget
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
